"""Compiled kernels for the uniform selector and the draws of every selector (numba, cached on disk after the
first call).

Every kernel applies a batch in order, one element after another, so a batch equals the same calls made
one by one (duplicate slots in one batch: the last value wins). Dense set (uniform selector): live slots
packed in ``items[:count]``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rlflow.kernels import compiled
from rlflow.kernels.prefetch import AHEAD, prefetch, prefetch_write


@compiled
def dense_insert(items: np.ndarray, where: np.ndarray, live: np.ndarray, count: int, slots: np.ndarray) -> int:
    """Append slots to a dense set (``items[:count]``, ``where[slot]`` its position); new count."""
    n = slots.shape[0]
    for j in range(n):
        if j + AHEAD < n:  # the slots' cells are far apart: requested ahead of use
            prefetch_write(where, slots[j + AHEAD])
            prefetch_write(live, slots[j + AHEAD])
        s = slots[j]
        if where[s] < 0:
            items[count] = s
            where[s] = count
            live[s] = True
            count += 1
    return count


@compiled
def dense_delete(items: np.ndarray, where: np.ndarray, live: np.ndarray, count: int, slots: np.ndarray) -> int:
    """Remove slots from a dense set by moving the last element into the hole; new count."""
    n = slots.shape[0]
    for j in range(n):
        # The slots' cells are far apart: request each slot's position two strides ahead, and the hole it
        # points to one stride ahead (a hint: a position moved since is only a wasted request).
        if j + 2 * AHEAD < n:
            prefetch_write(where, slots[j + 2 * AHEAD])
        if j + AHEAD < n:
            prefetch_write(items, max(where[slots[j + AHEAD]], 0))
        s = slots[j]
        p = where[s]
        if p >= 0:
            count -= 1
            last = items[count]
            items[p] = last
            where[last] = p
            where[s] = -1
            live[s] = False
    return count


@compiled
def draw_rows(meta: np.ndarray, slots: np.ndarray, times_col: int) -> np.ndarray:
    """Count one sample for each drawn slot, in order; return a copy of each draw's row as of that draw."""
    out = np.empty((slots.shape[0], meta.shape[1]), np.int64)
    for j in range(slots.shape[0]):
        prefetch(meta, slots[j] * meta.shape[1])
    for j in range(slots.shape[0]):
        s = slots[j]
        meta[s, times_col] += 1
        for c in range(meta.shape[1]):  # an explicit loop: a row slice assignment costs several times more
            out[j, c] = meta[s, c]
    return out


@compiled
def uniform_pick(uniforms: np.ndarray, live: np.ndarray, items: np.ndarray, count: int) -> np.ndarray:
    """``n = len(uniforms) // 2`` slots, each uniform over the ``count`` live ones.

    Draw ``j`` takes slot ``floor(u_j * capacity)`` when it is live (reading a one-byte flag), and
    otherwise the packed live slot ``items[floor(u_{n+j} * count)]``: a live slot is then chosen with
    probability ``1 / capacity + (1 - count / capacity) / count = 1 / count``.
    """
    capacity = live.shape[0]
    n = uniforms.shape[0] // 2
    slots = np.empty(n, np.int64)
    for j in range(n):
        s = min(int(uniforms[j] * capacity), capacity - 1)
        if not live[s]:
            s = items[min(int(uniforms[n + j] * count), count - 1)]
        slots[j] = s
    return slots


@compiled
def uniform_draw_rows(uniforms: np.ndarray, live: np.ndarray, items: np.ndarray, count: int, meta: np.ndarray,
                      times_col: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`uniform_pick` then :func:`draw_rows` in one call, with the draws' probabilities (``1 / count``,
    float64) and importance weights (1, float32): what a uniform table's sample takes of its selector and
    items."""
    return _uniform_draws(uniform_pick(uniforms, live, items, count), count, meta, times_col)


@compiled
def packed_draw_rows(uniforms: np.ndarray, items: np.ndarray, count: int, meta: np.ndarray,
                     times_col: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`uniform_draw_rows` for a table under half full: draw ``j`` is the packed live slot
    ``items[floor(u_j * count)]`` (what ``Uniform.sample`` computes in numpy from the same uniforms)."""
    slots = np.empty(uniforms.shape[0], np.int64)
    for j in range(slots.shape[0]):
        slots[j] = items[int(uniforms[j] * count)]
    return _uniform_draws(slots, count, meta, times_col)


@njit(inline="always", cache=True)
def _uniform_draws(slots: np.ndarray, count: int, meta: np.ndarray,
                   times_col: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Uniform draws ``slots`` with their rows (:func:`draw_rows`), probabilities ``1 / count`` (float64)
    and importance weights 1 (float32)."""
    n = slots.shape[0]
    return slots, draw_rows(meta, slots, times_col), np.full(n, 1.0 / count), np.ones(n, np.float32)


