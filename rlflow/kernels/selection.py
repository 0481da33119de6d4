"""Compiled kernels for the deterministic and uniform selectors (numba, cached on disk after the first call).

Ring sizes are powers of two, so positions wrap with a mask instead of an integer division.

Every kernel applies a batch in order, one element after another, so a batch equals the same calls made
one by one (duplicate slots in one batch: the last value wins). Trees are stored heap-style: node ``i``
has children ``2i`` and ``2i + 1``, the root is node 1, leaves are ``size .. 2 * size - 1``.

Tournament tree (min-heap and max-heap selectors): every node holds the winning slot of its subtree
under the lexicographic order of ``(k1[slot], k2[slot])`` (smallest wins), or -1 for an empty subtree.
Insertion ring (FIFO and LIFO selectors): entries ``(slot, seq)`` in insertion order, live while
``seq_of[slot] == seq``. Dense set (uniform selector): live slots packed in ``items[:count]``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rlflow.kernels import compiled
from rlflow.kernels.prefetch import AHEAD, prefetch, prefetch_write


@compiled
def _better(a: int, b: int, k1: np.ndarray, k2: np.ndarray) -> int:
    if a < 0:
        return b
    if b < 0:
        return a
    if k1[a] < k1[b] or (k1[a] == k1[b] and k2[a] < k2[b]):
        return a
    return b


@compiled
def _tt_fix(win: np.ndarray, k1: np.ndarray, k2: np.ndarray, i: int) -> None:
    i >>= 1
    while i >= 1:
        win[i] = _better(win[2 * i], win[2 * i + 1], k1, k2)
        i >>= 1


@compiled
def tt_set(
    win: np.ndarray, k1: np.ndarray, k2: np.ndarray, size: int,
    slots: np.ndarray, new_k1: np.ndarray, new_k2: np.ndarray,
) -> None:
    for j in range(slots.shape[0]):
        s = slots[j]
        k1[s] = new_k1[j]
        k2[s] = new_k2[j]
        win[s + size] = s
        _tt_fix(win, k1, k2, s + size)


@compiled
def tt_clear(win: np.ndarray, k1: np.ndarray, k2: np.ndarray, size: int, slots: np.ndarray) -> None:
    for j in range(slots.shape[0]):
        win[slots[j] + size] = -1
        _tt_fix(win, k1, k2, slots[j] + size)


@compiled
def tt_rebuild(win: np.ndarray, k1: np.ndarray, k2: np.ndarray, size: int) -> None:
    for i in range(size - 1, 0, -1):
        win[i] = _better(win[2 * i], win[2 * i + 1], k1, k2)


@compiled
def tt_top(win: np.ndarray, k1: np.ndarray, k2: np.ndarray, size: int, n: int) -> np.ndarray:
    """The ``n`` best slots in order (fewer if fewer are live); the tree is left as it was."""
    out = np.empty(n, np.int64)
    m = 0
    while m < n and win[1] >= 0:
        s = win[1]
        out[m] = s
        m += 1
        win[s + size] = -1
        _tt_fix(win, k1, k2, s + size)
    for j in range(m):
        s = out[j]
        win[s + size] = s
        _tt_fix(win, k1, k2, s + size)
    return out[:m]


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
def ring_push(ring_slot: np.ndarray, ring_seq: np.ndarray, ht: np.ndarray, seq_of: np.ndarray,
              slots: np.ndarray, seqs: np.ndarray) -> bool:
    """Append items to an insertion-ordered ring (``ht = [head, tail]`` absolute positions); True when done.

    Without room, dead entries at the head (oldest items leave first) are dropped; when there is still no
    room, nothing is appended and False returned: :func:`ring_compact`, then this again. (Compaction is
    a call of its own, so that it is compiled only for a ring that fills.)
    """
    r = ring_slot.shape[0]
    if ht[1] - ht[0] + slots.shape[0] > r:
        while ht[1] > ht[0] and seq_of[ring_slot[ht[0] & (r - 1)]] != ring_seq[ht[0] & (r - 1)]:
            ht[0] += 1
        if ht[1] - ht[0] + slots.shape[0] > r:
            return False
    t = ht[1]
    for j in range(slots.shape[0]):
        ring_slot[(t + j) & (r - 1)] = slots[j]
        ring_seq[(t + j) & (r - 1)] = seqs[j]
        seq_of[slots[j]] = seqs[j]
    ht[1] = t + slots.shape[0]
    return True


@compiled
def ring_compact(ring_slot: np.ndarray, ring_seq: np.ndarray, ht: np.ndarray, seq_of: np.ndarray) -> None:
    """Drop dead entries (``seq_of[slot] != seq``), keeping the live ones in order from position 0."""
    r = ring_slot.shape[0]
    keep_slot = np.empty(ht[1] - ht[0], np.int64)
    keep_seq = np.empty(ht[1] - ht[0], np.int64)
    m = 0
    for q in range(ht[0], ht[1]):
        s = ring_slot[q & (r - 1)]
        if seq_of[s] == ring_seq[q & (r - 1)]:
            keep_slot[m] = s
            keep_seq[m] = ring_seq[q & (r - 1)]
            m += 1
    for q in range(m):  # element by element: a slice assignment compiles its shape-mismatch error formatting
        ring_slot[q] = keep_slot[q]
        ring_seq[q] = keep_seq[q]
    ht[0] = 0
    ht[1] = m


@compiled
def ring_first(ring_slot: np.ndarray, ring_seq: np.ndarray, ht: np.ndarray, seq_of: np.ndarray,
               n: int, newest: bool) -> np.ndarray:
    """The ``n`` oldest (or newest) live items in order; dead entries at the scanned end are dropped."""
    r = ring_slot.shape[0]
    out = np.empty(n, np.int64)
    m = 0
    if newest:
        while ht[1] > ht[0] and seq_of[ring_slot[(ht[1] - 1) & (r - 1)]] != ring_seq[(ht[1] - 1) & (r - 1)]:
            ht[1] -= 1
        q = ht[1] - 1
        while m < n and q >= ht[0]:
            if seq_of[ring_slot[q & (r - 1)]] == ring_seq[q & (r - 1)]:
                out[m] = ring_slot[q & (r - 1)]
                m += 1
            q -= 1
    else:
        while ht[1] > ht[0] and seq_of[ring_slot[ht[0] & (r - 1)]] != ring_seq[ht[0] & (r - 1)]:
            ht[0] += 1
        q = ht[0]
        while m < n and q < ht[1]:
            if seq_of[ring_slot[q & (r - 1)]] == ring_seq[q & (r - 1)]:
                out[m] = ring_slot[q & (r - 1)]
                m += 1
            q += 1
    return out[:m]


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


@compiled
def ring_delete(ring_slot: np.ndarray, ring_seq: np.ndarray, ht: np.ndarray, seq_of: np.ndarray,
                slots: np.ndarray) -> None:
    """Mark items dead and drop dead entries at both ends of the ring while they are cache-hot.

    Items usually leave in insertion order (overwrites and FIFO eviction take the oldest), so this keeps
    the ring short without ever scanning entries that went cold.
    """
    r = ring_slot.shape[0]
    n = slots.shape[0]
    for j in range(n):
        if j + AHEAD < n:  # the slots' cells are far apart: requested ahead of use
            prefetch_write(seq_of, slots[j + AHEAD])
        seq_of[slots[j]] = -1
    while ht[1] > ht[0] and seq_of[ring_slot[ht[0] & (r - 1)]] != ring_seq[ht[0] & (r - 1)]:
        ht[0] += 1
    while ht[1] > ht[0] and seq_of[ring_slot[(ht[1] - 1) & (r - 1)]] != ring_seq[(ht[1] - 1) & (r - 1)]:
        ht[1] -= 1
