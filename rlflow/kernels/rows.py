"""Compiled kernels of a :class:`~rlflow.replay.RowTable`: items kept in the slot of the row they start at.

Slot ``(start % capacity) * lanes + lane`` holds the item starting at that row, in the 64-byte meta row
layout of :mod:`rlflow.replay.items` (``KEY, LANE, START, LENGTH, VALID, TIMES``, inline fields); an empty
slot has ``KEY == -1``. Semantics are documented in ``row_table.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rlflow.kernels import compiled
from rlflow.kernels.items import KEY, TIMES, check_windows, item_key, set_meta, wrap
from rlflow.kernels.packed import Packed
from rlflow.kernels.prefetch import AHEAD, prefetch, prefetch_write

WINDOW, TAKEN, TWICE = 1, 2, 3  # why an insert was refused: a window not stored, a slot taken, a row twice
_BLOCK = 256  # draws whose rows are requested together


@compiled
def place(packed_rings: Packed, cross_episodes: bool, meta: np.ndarray, next_seq: int, lanes: np.ndarray,
          starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray, slots: np.ndarray,
          keys: np.ndarray) -> tuple[int, int]:
    """Check the windows, then place each item in its start row's slot, keyed ``(next_seq + i) * slots + slot``.

    Returns ``(-1, 0)``, or the first bad item and why (``WINDOW``, ``TAKEN`` by a live item, or a start row
    given ``TWICE`` in the call), having changed nothing.
    """
    n = lanes.shape[0]
    bad = check_windows(packed_rings, lanes, starts, lengths, cross_episodes, valid)
    capacity = packed_rings.value.capacity
    if bad >= 0:
        return bad, WINDOW
    nl = meta.shape[0] // capacity
    for i in range(n):
        s = wrap(starts[i], capacity) * nl + lanes[i]
        k = meta[s, KEY]
        if k != -1:
            for j in range(i):  # undo the marks: nothing changed
                meta[slots[j], KEY] = -1
            return i, TAKEN if k >= 0 else TWICE
        meta[s, KEY] = -2  # taken by this call
        slots[i] = s
    total = meta.shape[0]
    for i in range(n):
        if i + AHEAD < n:
            prefetch_write(meta, slots[i + AHEAD] * meta.shape[1])
        s = slots[i]
        key = item_key(next_seq + i, total, s)
        set_meta(meta, s, key, lanes[i], starts[i], lengths[i], valid[i])
        keys[i] = key
    return -1, 0


@compiled
def evict_range(meta: np.ndarray, lane: int, lo: int, hi: int, capacity: int) -> tuple[int, int]:
    """Empty the slots of rows ``lo .. hi - 1`` of ``lane``; return how many held an item, and their times
    sampled."""
    removed = times = 0
    nl = meta.shape[0] // capacity
    for r in range(lo, min(hi, lo + capacity)):
        s = wrap(r, capacity) * nl + lane
        if meta[s, KEY] >= 0:
            removed += 1
            times += meta[s, TIMES]
            meta[s, KEY] = -1
    return removed, times


@njit(inline="always", cache=True)
def _take(meta: np.ndarray, s: int, j: int, size: int, limit: int, slots: np.ndarray, out: np.ndarray,
          probs: np.ndarray) -> int:
    """Count draw ``j`` of slot ``s`` (one of ``size`` live items); retire it at ``limit`` samples (0: never).
    Returns its times sampled when retired, else -1."""
    meta[s, TIMES] += 1
    for c in range(meta.shape[1]):  # an explicit loop: a row slice assignment costs several times more
        out[j, c] = meta[s, c]
    slots[j] = s
    probs[j] = 1.0 / size
    if limit > 0 and meta[s, TIMES] >= limit:
        meta[s, KEY] = -1
        return meta[s, TIMES]
    return -1


@compiled
def draw_stored(uniforms: np.ndarray, count: np.ndarray, capacity: int, meta: np.ndarray, j: int, size: int,
                limit: int, slots: np.ndarray, out: np.ndarray, probs: np.ndarray, acc: np.ndarray) -> int:
    """Draws ``j, j + 1, ...`` until ``slots`` is full or ``uniforms`` run out; returns the next draw's index.

    Each uniform picks one of the stored rows, every lane's equally likely, and is a draw when an item
    starts there (else the next uniform is tried): each draw is uniform over the ``size`` live items, whose
    start rows are all stored. ``acc`` gets ``[size, retired, their times sampled]`` after the draws.
    """
    lanes = count.shape[0]
    cum = np.empty(lanes + 1, np.int64)
    cum[0] = 0
    even = True
    for lane in range(lanes):
        stored = min(count[lane], capacity)
        cum[lane + 1] = cum[lane] + stored
        even = even and stored == cum[1]
    total = cum[lanes]
    full = total == meta.shape[0]
    n = slots.shape[0]
    retired = retired_times = 0
    cand = np.empty(_BLOCK, np.int64)
    i, m = 0, uniforms.shape[0]
    while i < m and j < n and size > 0:
        k = min(_BLOCK, m - i)
        for q in range(k):  # the block's rows first, their lines requested: the checks below then hit cache
            x = min(np.int64(uniforms[i + q] * total), total - 1)
            if full:  # every slot holds a stored row: any one-to-one map of x to slots is uniform, x itself too
                cand[q] = x
                prefetch(meta, x * meta.shape[1])
                continue
            if even:
                lane = x // cum[1]
            else:
                lo, hi = 0, lanes  # the lane with cum[lane] <= x < cum[lane + 1]
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if cum[mid] <= x:
                        lo = mid
                    else:
                        hi = mid
                lane = lo
            row = max(count[lane] - capacity, 0) + x - cum[lane]
            s = wrap(row, capacity) * lanes + lane
            cand[q] = s
            prefetch(meta, s * meta.shape[1])
        for q in range(k):  # in order: a draw sees the retirements of the draws before it
            if j == n or size == 0:
                break
            s = cand[q]
            if meta[s, KEY] < 0:
                continue
            t = _take(meta, s, j, size, limit, slots, out, probs)
            if t >= 0:
                size -= 1
                retired += 1
                retired_times += t
            j += 1
        i += k
    acc[0], acc[1], acc[2] = size, retired, retired_times
    return j


@compiled
def draw_packed(uniforms: np.ndarray, live: np.ndarray, meta: np.ndarray, limit: int, slots: np.ndarray,
                out: np.ndarray, probs: np.ndarray, acc: np.ndarray) -> None:
    """Draw ``len(slots)`` items, each uniform over the live slots ``live`` (one uniform each); a retired item
    leaves ``live`` at once. ``acc`` gets ``[size, retired, their times sampled]``."""
    size = live.shape[0]
    retired = retired_times = 0
    for j in range(slots.shape[0]):
        if size == 0:
            break
        k = min(np.int64(uniforms[j] * size), size - 1)
        t = _take(meta, live[k], j, size, limit, slots, out, probs)
        if t >= 0:
            size -= 1
            live[k] = live[size]
            retired += 1
            retired_times += t
    acc[0], acc[1], acc[2] = size, retired, retired_times
