"""Compiled kernels for the store's episode bookkeeping and a table's item slots (numba, cached).

Each replaces a handful of numpy calls on the write path, where per-call overhead, not bandwidth, is
the cost. Semantics are documented where the kernels are used (``storage.py``, ``items.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from rlflow.kernels import compiled
from rlflow.kernels.packed import Packed
from rlflow.kernels.prefetch import AHEAD, copy_bytes, prefetch, prefetch_write

KEY, LANE, START, LENGTH, VALID, TIMES = range(6)


class Rings(NamedTuple):
    """A store's ring cursors (:class:`~rlflow.replay.StepStore`): what the block writer reads and advances, and
    what a window check reads."""

    written: np.ndarray  # [lanes] rows ever written per lane
    episode_id: np.ndarray  # [lanes, capacity]
    episode_step: np.ndarray  # [lanes, capacity]
    next_episode: np.ndarray  # [lanes]
    next_step: np.ndarray  # [lanes]
    capacity: int
    reach: int  # rows before a row that its frame stacks read, at most (0: no stacked column)


@njit(cache=True)
def wrap(x: int, capacity: int) -> int:
    """``x % capacity`` for ``x >= 0``, by a float reciprocal instead of an integer division (exact below 2**52).

    A plain call, not inlined by numba: compiled once, and inlined by LLVM into every kernel that calls it
    (no call is left in their machine code), where numba-level inlining typed it anew at each call site.
    """
    if x >= 4503599627370496:
        return x % capacity
    r = x - np.int64(x * (1.0 / capacity)) * capacity
    if r < 0:
        r += capacity
    elif r >= capacity:
        r -= capacity
    return r


@njit(inline="always", cache=True)
def item_key(seq: int, slots: int, slot: int) -> int:
    """The key of the item placed ``seq``-th in ``slot`` of ``slots`` (``seq * slots + slot``: a slot's
    next item gets another key, and ``key % slots`` is its slot)."""
    return seq * slots + slot


@njit(inline="always", cache=True)
def set_meta(meta: np.ndarray, s: int, key: int, lane: int, start: int, length: int, valid: int) -> None:
    """Slot ``s``'s record of a new item: its key, window and valid length, never sampled."""
    meta[s, KEY] = key
    meta[s, LANE] = lane
    meta[s, START] = start
    meta[s, LENGTH] = length
    meta[s, VALID] = valid
    meta[s, TIMES] = 0


@compiled
def evict_range(meta: np.ndarray, row_slot: np.ndarray, free: np.ndarray, num_free: int, lane: int, lo: int,
                hi: int, capacity: int) -> tuple[np.ndarray, int]:
    """Remove the items indexed at rows ``lo .. hi - 1`` of ``lane`` (a table without overflow lists).

    Frees their slots (pushed on ``free`` from ``num_free``) and clears their index cells; returns the
    slots and the times sampled they had, summed.
    """
    out = np.empty(max(hi - lo, 0), np.int64)
    for row in range(lo, hi):  # the items' meta rows are cold lines: request them all before reading any
        s = row_slot[lane, wrap(row, capacity)]
        if s >= 0:
            prefetch_write(meta, s * meta.shape[1])
    m = 0
    total = 0
    for row in range(lo, hi):
        pos = wrap(row, capacity)
        s = row_slot[lane, pos]
        if s >= 0:
            row_slot[lane, pos] = -1
            total += meta[s, TIMES]
            meta[s, KEY] = -1
            free[num_free + m] = s
            out[m] = s
            m += 1
    return out[:m], total


@njit(inline="always", cache=True, nogil=True)
def check_windows(packed_rings: Packed, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  cross_episodes: bool, valid: np.ndarray) -> int:
    """Check item windows are stored in full and fill each one's valid length; return the first bad one.

    ``packed_rings``: the store's :class:`Rings`, packed (:func:`rlflow.kernels.packed.pack`). Valid length: rows
    from the window's start that belong to its first row's episode (all rows
    when ``cross_episodes``). Bad (valid length 0): lane out of range, length outside ``[1, capacity]``,
    or a row not stored (before ``written - capacity`` or at/after ``written``), or, with frame stacks
    (``rings.reach``), a first row whose stacks read a row no longer stored. Returns -1 if none is bad.
    Inlined into the kernel that checks and places items in one call (a function fewer to compile on the
    way to a first sample); called from Python, it compiles on its own.
    """
    rings = packed_rings.value
    count, episode_id, capacity = rings.written, rings.episode_id, rings.capacity
    n_lanes, n = count.shape[0], lanes.shape[0]
    first_bad = -1
    for i in range(n):
        if i + AHEAD < n and 0 <= lanes[i + AHEAD] < n_lanes:  # other lanes' rows are far apart: requested ahead
            prefetch(episode_id, lanes[i + AHEAD] * capacity + wrap(starts[i + AHEAD], capacity))
        lane, start, length = lanes[i], starts[i], lengths[i]
        if lane < 0 or lane >= n_lanes or length < 1 or length > capacity:
            ok = False
        else:
            c = count[lane]
            oldest = max(c - capacity, 0)
            ok = oldest <= start and start + length <= c
            if ok and rings.reach:
                ok = start - min(rings.reach, rings.episode_step[lane, wrap(start, capacity)]) >= oldest
        if not ok:
            valid[i] = 0
            if first_bad < 0:
                first_bad = i
            continue
        if cross_episodes:
            valid[i] = length
            continue
        ep = episode_id[lane, wrap(start, capacity)]
        if episode_id[lane, wrap(start + length - 1, capacity)] == ep:
            valid[i] = length
        else:
            k = 1
            while k < length and episode_id[lane, wrap(start + k, capacity)] == ep:
                k += 1
            valid[i] = k
    return first_bad


class ItemSlots(NamedTuple):
    """A table's item structures: the records, priorities, the start-row index and the free-slot stack."""

    meta: np.ndarray  # [slots, width] int64 records
    priority: np.ndarray  # [slots] float64
    row_slot: np.ndarray  # [lanes, capacity] int64: the slot of the item starting at each row, or -1
    free: np.ndarray  # [slots] int64: free slots on top (the last num_free)
    capacity: int


class NewItems(NamedTuple):
    """Items to place: their windows, valid lengths and priorities (``[n]`` each)."""

    lanes: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    valid: np.ndarray
    priorities: np.ndarray


class Placed(NamedTuple):
    """Where :func:`add_items` puts each new item: its slot, its key, and whether its start row's index cell
    was taken already (``[n]`` each)."""

    slots: np.ndarray
    keys: np.ndarray
    clash: np.ndarray


@compiled
def add_items(table: ItemSlots, num_free: int, next_seq: int, new: NewItems, out: Placed) -> int:
    """Place items in the top free slots; index each by its start row unless that cell is taken.

    ``out.clash[i]`` is set when the row's index cell already holds an item (the caller keeps an overflow
    list for those); returns how many clashed.
    """
    meta, priority, row_slot, free, capacity = table
    lanes, starts = new.lanes, new.starts
    max_size, width = meta.shape
    n = lanes.shape[0]
    clashes = 0
    for i in range(n):
        if i + AHEAD < n:  # the slots' meta rows and the start rows' cells are far apart: requested ahead
            j = i + AHEAD
            prefetch_write(meta, free[num_free - 1 - j] * width)
            prefetch_write(row_slot, lanes[j] * capacity + wrap(starts[j], capacity))
        s = free[num_free - 1 - i]
        key = item_key(next_seq + i, max_size, s)
        out.slots[i] = s
        out.keys[i] = key
        set_meta(meta, s, key, lanes[i], starts[i], new.lengths[i], new.valid[i])
        priority[s] = new.priorities[i]
        pos = wrap(starts[i], capacity)
        if row_slot[lanes[i], pos] < 0:
            row_slot[lanes[i], pos] = s
            out.clash[i] = False
        else:
            out.clash[i] = True
            clashes += 1
    return clashes


@compiled
def remove_items(meta: np.ndarray, row_slot: np.ndarray, free: np.ndarray, num_free: int, slots: np.ndarray,
                 capacity: int, indirect: np.ndarray) -> int:
    """Free live slots; clear their index cells. Returns the times sampled they had, summed.

    ``indirect[i]`` is set for an item that was not in its index cell (it is in the overflow list).
    """
    total = 0
    n, width = slots.shape[0], meta.shape[1]
    for i in range(min(AHEAD, n)):  # the slots' meta rows are cold lines, far apart: requested ahead of use
        prefetch_write(meta, slots[i] * width)
    for i in range(n):
        if i + AHEAD < n:
            prefetch_write(meta, slots[i + AHEAD] * width)
        s = slots[i]
        lane = meta[s, LANE]
        pos = wrap(meta[s, START], capacity)
        if row_slot[lane, pos] == s:
            row_slot[lane, pos] = -1
            indirect[i] = False
        else:
            indirect[i] = True
        total += meta[s, TIMES]
        meta[s, KEY] = -1
        free[num_free + i] = s
    return total


@compiled
def indexed_in_range(row_slot: np.ndarray, lane: int, lo: int, hi: int, capacity: int) -> np.ndarray:
    """Slots held by the index cells of rows ``lo .. hi - 1`` of one lane (empty cells skipped)."""
    out = np.empty(max(hi - lo, 0), np.int64)
    m = 0
    for row in range(lo, hi):
        s = row_slot[lane, wrap(row, capacity)]
        if s >= 0:
            out[m] = s
            m += 1
    return out[:m]


@compiled
def first_bad_priority(priorities: np.ndarray) -> int:
    """Index of the first priority that is negative, NaN or infinite, or -1."""
    for i in range(priorities.shape[0]):
        p = priorities[i]
        if not (np.isfinite(p) and p >= 0.0):
            return i
    return -1


@compiled
def set_priorities(meta: np.ndarray, priority: np.ndarray, keys: np.ndarray, values: np.ndarray,
                   slots_out: np.ndarray, values_out: np.ndarray) -> int:
    """Store the priorities of live keys, in order (a repeated key keeps its last value).

    Writes the live keys' slots and values, in order, to the outputs; returns how many there are.
    """
    max_size = meta.shape[0]
    for i in range(keys.shape[0]):
        if keys[i] >= 0:
            prefetch(meta, (keys[i] % max_size) * meta.shape[1])
            prefetch(priority, keys[i] % max_size)
    m = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        if k < 0:
            continue
        s = k % max_size
        if meta[s, KEY] == k:
            priority[s] = values[i]
            slots_out[m] = s
            values_out[m] = values[i]
            m += 1
    return m


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def all_finite(flat: np.ndarray) -> bool:
    """Whether every value is finite: ``x * 0`` is 0 for finite ``x`` and NaN for NaN or +-inf.

    Only reassociation is relaxed (so the sum vectorises); NaN and infinity keep their meaning.
    """
    acc = flat.dtype.type(0)
    for i in range(flat.shape[0]):
        acc += flat[i] * 0
    return acc == 0


@njit(cache=True, nogil=True)
def within(flat: np.ndarray, low: float, high: float) -> bool:
    """Whether every value lies in ``[low, high]`` (compared as float64: exact for integers below 2**53)."""
    for i in range(flat.shape[0]):
        x = float(flat[i])
        if x < low or x > high:
            return False
    return True


@compiled
def window_index(meta: np.ndarray, lane_col: int, start_col: int, length_col: int, valid_col: int,
                 capacity: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Flat store indices ``[B, L]`` of the item windows in ``meta`` rows (``L`` = longest window).

    Rows at or past an item's valid length are masked; their index repeats the window's first row (any
    stored row will do, the caller zero-fills them). The flag tells whether every row is valid.
    """
    b_count = meta.shape[0]
    length = 0
    for b in range(b_count):
        length = max(length, meta[b, length_col])
    idx = np.empty((b_count, length), np.int64)
    mask = np.empty((b_count, length), np.bool_)
    full = True
    for b in range(b_count):
        base = meta[b, lane_col] * capacity
        start = meta[b, start_col]
        valid = meta[b, valid_col]
        for i in range(length):
            if i < valid:
                idx[b, i] = base + wrap(start + i, capacity)
                mask[b, i] = True
            else:
                idx[b, i] = base + wrap(start, capacity)
                mask[b, i] = False
                full = False
    return idx, mask, full


@compiled
def window_ends(meta: np.ndarray, lane_col: int, start_col: int, length_col: int, capacity: int) -> np.ndarray:
    """Flat store indices ``[2, B]`` of each item window's first and last row."""
    b_count = meta.shape[0]
    ends = np.empty((2, b_count), np.int64)
    for b in range(b_count):
        base = meta[b, lane_col] * capacity
        start = meta[b, start_col]
        ends[0, b] = base + wrap(start, capacity)
        ends[1, b] = base + wrap(start + meta[b, length_col] - 1, capacity)
    return ends


@compiled
def prefetch_spans(cols: tuple, idx: np.ndarray) -> None:
    """Request every cache line of rows ``idx`` (flat store indices) of every column ``cols`` (uint8
    ``[rows, row bytes]``), one span per run of consecutive rows, before any is copied: the misses of
    all columns and windows then overlap instead of coming column after column."""
    n = idx.shape[0]
    i = 0
    while i < n:
        j = i + 1
        while j < n and idx[j] == idx[j - 1] + 1:
            j += 1
        for c in range(len(cols)):
            col = cols[c]
            lo = idx[i] * col.shape[1]
            hi = (idx[j - 1] + 1) * col.shape[1]
            for o in range(lo, hi, 64):
                prefetch(col, o)
            if hi > lo:
                prefetch(col, hi - 1)
        i = j


@compiled
def take_rows(col: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``col[idx]`` for a C-ordered ``[rows, width]`` column: every row's cache lines are prefetched
    before any is copied, so the misses of a batch of random rows overlap."""
    n = idx.shape[0]
    width = col.shape[1]
    out = np.empty((n, width), col.dtype)
    for i in range(n):
        prefetch(col, idx[i] * width)
        prefetch(col, idx[i] * width + width - 1)
    for i in range(n):
        r = idx[i]
        for k in range(width):
            out[i, k] = col[r, k]
    return out


@compiled
def take_stacks(col: np.ndarray, flat_index: np.ndarray, episode_step: np.ndarray, capacity: int, k: int,
                by_column: bool, out: np.ndarray) -> None:
    """The ``k``-frame stacks of flat rows ``flat_index [A, M]`` (``lane * capacity + position``) of a stacked
    column ``col`` (``[lanes * capacity, frame bytes]``, one frame a row) into ``out`` (the bytes of ``[A, M, k,
    *frame]``, flat). Frame ``j`` of row ``r``'s stack is the frame of the row ``k - 1 - j`` rows before it, or of
    its episode's first row where that is earlier (``episode_step [lanes * capacity]``: each row's step in its
    episode). ``by_column``: the stacks are copied column after column of the index (the ``A`` rows of a column
    read the same frames, e.g. a transition's two ends, so those frames are still in the cache), else row after
    row; the result is the same."""
    w = col.shape[1]
    a, m = flat_index.shape
    for outer in range(m if by_column else a):
        for inner in range(a if by_column else m):
            r = inner if by_column else outer
            c = outer if by_column else inner
            f = flat_index[r, c]
            base = f - wrap(f, capacity)
            pos = f - base
            back = episode_step[f]
            at = (r * m + c) * k
            for j in range(k):
                src = base + wrap(pos - min(k - 1 - j, back) + capacity, capacity)
                copy_bytes(out, (at + j) * w, col, src * w, w)
