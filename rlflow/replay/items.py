"""A table's item slots: their 64-byte records (:class:`Records`) and, for a :class:`~rlflow.replay.Table`,
the free list, priorities and row index around them (:class:`Items`).

Per slot, a record holds the item's key, its window ``(lane, start, length)``, ``valid`` (how many of the
window's rows belong to the episode of its first row), times sampled and small item fields; larger item
fields get arrays of their own. Keys are ``seq * slots + slot`` where ``seq`` counts inserts: unique for
the table's life, and a key names its slot without a lookup, so stale keys are recognised at once
(``key[slot] != key``). An empty slot has key -1.

A :class:`~rlflow.replay.Table` puts an item in any free slot, so :class:`Items` adds a free list, priorities and the
row index that finds every item starting at a given store row (what an overwrite needs): one slot per
row in an array, plus an overflow dict for rows where several items start. A
:class:`~rlflow.replay.RowTable` puts an item in the slot of its start row, so its :class:`RowRecords` need
neither. The compiled core (``core``: ``rlflow._core.ItemSlots`` / ``RowSlots``) changes the arrays in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow import _core
from rlflow.specs import Field

__all__ = ["KEY", "LANE", "LENGTH", "META_WIDTH", "START", "TIMES", "VALID", "Items", "Records", "RowRecords"]

# The columns of a record, as the compiled core lays them out.
KEY, LANE, START, LENGTH, VALID, TIMES = _core.KEY, _core.LANE, _core.START, _core.LENGTH, _core.VALID, _core.TIMES
META_WIDTH = 8  # int64 columns per slot: the six above, then 16 bytes of inline fields
_LINE = 64  # bytes of a cache line
_INLINE = slice(48, 64)  # bytes of a meta row that hold inline item fields


def _inline(fields: dict[str, Field]) -> dict[str, int] | None:
    """The byte offset in a meta row of each field, when all fit in its spare bytes (else None)."""
    offsets, off = {}, _INLINE.start
    for name, f in fields.items():
        size = f.dtype.itemsize
        off = -(-off // size) * size
        offsets[name] = off
        off += f.nbytes
    if not fields or off > _INLINE.stop or any(f.dtype.hasobject for f in fields.values()):
        return None
    return offsets


def _field_columns(meta: np.ndarray, fields: dict[str, Field]) -> dict[str, np.ndarray]:
    """One array per item field: views into the spare bytes of ``meta`` rows when all fields fit there
    (each aligned to its item size), otherwise arrays of their own."""
    offsets = _inline(fields)
    n = meta.shape[0]
    if offsets is None:
        return {k: np.zeros((n, *f.shape), f.dtype) for k, f in fields.items()}
    raw = meta.view(np.uint8).reshape(n, meta.shape[1] * 8)
    return {k: raw[:, offsets[k]: offsets[k] + f.nbytes].view(f.dtype).reshape(n, *f.shape)
            for k, f in fields.items()}


def _line_aligned(rows: int, width: int) -> np.ndarray:
    """A zeroed ``[rows, width]`` int64 array starting on a cache-line boundary (64 bytes), so that each of its
    64-byte rows is one line: numpy's buffers start 16 bytes into a line, and a record read or written
    at random then touches two lines, each a miss of its own."""
    raw = np.zeros(rows * width * 8 + _LINE, np.uint8)
    skip = -raw.ctypes.data % _LINE
    return raw[skip:skip + rows * width * 8].view(np.int64).reshape(rows, width)


class Records:
    """The records and item fields of ``slots`` slots (``max_size``), all empty (key -1), and the counters
    every kind of table keeps: ``next_seq`` (inserts so far, what keys are made of) and ``times_total``
    (times sampled, summed over live items)."""

    def __init__(self, slots: int, fields: dict[str, Field]) -> None:
        self.max_size = slots
        # One 64-byte row per slot, so that a draw reads one cache line: KEY, LANE, START, LENGTH, VALID,
        # TIMES, then 16 bytes where small item fields live (e.g. an n-step return and discount), so that
        # gathering them costs no further cache miss.
        self.meta = _line_aligned(slots, META_WIDTH)
        self.meta[:, KEY] = -1
        self.fields = fields
        self.columns = _field_columns(self.meta, fields)
        self.inline = _inline(fields)
        # Where each inline field sits in a meta row viewed as its dtype: (dtype, lo, hi, shape or None).
        self._inline_at = {n: (f.dtype, off // f.dtype.itemsize, (off + f.nbytes) // f.dtype.itemsize,
                               None if not f.shape else (-1, *f.shape))
                           for n, f in fields.items() for off in [(self.inline or {}).get(n, 0)]}
        self.next_seq = 0
        self.times_total = 0

    def _bind(self) -> None:
        """Build the compiled core's object over the arrays (at construction and unpickling); none here."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("core", None)  # the compiled core's view of the arrays, built again when unpickled
        if self.inline is not None:
            del state["columns"]  # views into meta, made again when unpickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        meta = _line_aligned(*state["meta"].shape)  # on a cache line again
        meta[...] = state["meta"]
        self.__dict__.update(state, meta=meta)
        if self.inline is not None:
            self.columns = _field_columns(meta, self.fields)
        self._bind()

    @property
    def keys(self) -> np.ndarray:
        return self.meta[:, KEY]

    @property
    def times(self) -> np.ndarray:
        return self.meta[:, TIMES]

    def drawn_fields(self, slots: np.ndarray, drawn: np.ndarray) -> dict[str, np.ndarray]:
        """The item fields of ``slots``, whose meta rows were copied to ``drawn`` when they were drawn."""
        if self.inline is None:
            return {n: c[slots] for n, c in self.columns.items()}
        out: dict[str, np.ndarray] = {}
        views: dict[Any, np.ndarray] = {}
        for name, (dtype, lo, hi, shape) in self._inline_at.items():
            v = views.get(dtype)
            if v is None:
                v = views[dtype] = drawn.view(dtype)
            out[name] = v[:, lo] if shape is None else v[:, lo:hi].reshape(shape)
        return out

    def slots_of(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of ``keys`` and whether each key is still live."""
        slots = keys % self.max_size
        return slots, (keys >= 0) & (self.meta[slots, KEY] == keys)

    def live_slots(self) -> np.ndarray:
        """Slots holding an item, in slot order."""
        return np.flatnonzero(self.meta[:, KEY] >= 0)

    def live_in_order(self) -> np.ndarray:
        """Live slots in insertion order."""
        slots = self.live_slots()
        return slots[np.argsort(self.meta[slots, KEY] // self.max_size, kind="stable")]

    def checkpoint_state(self, live: np.ndarray, priority: np.ndarray, free: np.ndarray) -> dict[str, Any]:
        """What a checkpoint keeps of the items in slots ``live`` (with their ``priority``) and of the
        ``free`` slots: ``next_seq`` and the arrays ``slot, meta, priority, free, field/<name>...``, in that
        order (:mod:`rlflow.replay.checkpoint` stores them so)."""
        arrays = {"slot": live, "meta": self.meta[live, :6], "priority": priority, "free": free}
        arrays.update({f"field/{n}": c[live] for n, c in self.columns.items()})
        return {"next_seq": self.next_seq, "arrays": arrays}

    def load_records(self, state: dict[str, Any]) -> np.ndarray:
        """Restore the records, item fields and counters of :meth:`checkpoint_state`'s output (every other
        slot emptied); return the live slots."""
        a = state["arrays"]
        live = np.asarray(a["slot"], np.int64)
        self.meta[:] = 0
        self.meta[:, KEY] = -1
        self.meta[live, :6] = a["meta"]
        for n, c in self.columns.items():
            c[live] = a[f"field/{n}"]
        self.next_seq = int(state["next_seq"])
        self.times_total = int(self.meta[live, TIMES].sum())
        return live


class RowRecords(Records):
    """A :class:`~rlflow.replay.RowTable`'s records: the item starting at row ``r`` of lane ``l`` lives in slot
    ``(r % capacity) * lanes + l`` (:attr:`core`: the compiled core's placements, evictions and draws)."""

    def __init__(self, lanes: int, capacity: int, fields: dict[str, Field]) -> None:
        super().__init__(lanes * capacity, fields)
        self.lanes = lanes
        self._bind()

    def _bind(self) -> None:
        self.core = _core.RowSlots(meta=self.meta, lanes=self.lanes)


class Items(Records):
    """A :class:`~rlflow.replay.Table`'s ``max_size`` slots: records, priorities, a free list (a stack whose
    top is at ``num_free - 1``) and the index from store rows to the items starting there."""

    def __init__(self, max_size: int, lanes: int, capacity: int, fields: dict[str, Field]) -> None:
        super().__init__(max_size, fields)
        self.capacity = capacity
        self.priority = np.zeros(max_size, np.float64)
        self.free = np.arange(max_size - 1, -1, -1, dtype=np.int64)
        self.num_free = max_size
        self.row_slot = np.full((lanes, capacity), -1, np.int64)
        self.has_overflow = np.zeros((lanes, capacity), np.bool_)
        self.overflow: dict[tuple[int, int], list[int]] = {}  # further items starting at a taken row
        self._bind()

    def _bind(self) -> None:
        self.core = _core.ItemSlots(meta=self.meta, priority=self.priority, row_slot=self.row_slot, free=self.free)

    @property
    def size(self) -> int:
        return self.max_size - self.num_free

    def add(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray,
            priorities: np.ndarray, cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Place ``n <= num_free`` new items; return their slots, keys and insertion sequence numbers."""
        slots, keys, clash, clashes = self.core.place(self.num_free, self.next_seq, lanes, starts, lengths, valid,
                                                      priorities)
        return slots, keys, self._placed(slots, lanes, starts, clash, clashes, cols)

    def _placed(self, slots: np.ndarray, lanes: np.ndarray, starts: np.ndarray, clash: np.ndarray, clashes: int,
                cols: dict[str, np.ndarray]) -> np.ndarray:
        """Bookkeeping after the core placed ``slots``: counters, item fields, overflow lists; the seqs."""
        n = slots.size
        seqs = np.arange(self.next_seq, self.next_seq + n, dtype=np.int64)
        self.num_free -= n
        self.next_seq += n
        for name, col in cols.items():
            self.columns[name][slots] = col
        if clashes:
            self._overflow_add(slots[clash], lanes[clash], starts[clash] % self.capacity)
        return seqs

    def _overflow_add(self, slots: np.ndarray, lanes: np.ndarray, pos: np.ndarray) -> None:
        for s, lane, p in zip(slots.tolist(), lanes.tolist(), pos.tolist(), strict=True):
            self.overflow.setdefault((lane, p), []).append(s)
            self.has_overflow[lane, p] = True

    def remove(self, slots: np.ndarray) -> None:
        """Free live ``slots`` (distinct); an item in an overflow list leaves it (the cell keeps its holder)."""
        times, indirect = self.core.remove(self.num_free, slots)
        self.times_total -= times
        self.num_free += slots.size
        if self.overflow and indirect.any():
            lanes = self.meta[slots[indirect], LANE]
            pos = self.meta[slots[indirect], START] % self.capacity
            for s, lane, p in zip(slots[indirect].tolist(), lanes.tolist(), pos.tolist(), strict=True):
                bucket = self.overflow[(lane, p)]
                bucket.remove(s)
                if not bucket:
                    del self.overflow[(lane, p)]
                    self.has_overflow[lane, p] = False

    def evict_range(self, lane: int, lo: int, hi: int) -> np.ndarray:
        """Remove every item starting at rows ``lo .. hi - 1`` of ``lane``; return their slots, in the order of
        the rows, items sharing a row in insertion order (so the result does not depend on which of them
        holds the row's index cell, which differs after a checkpoint restore)."""
        slots = self.starting_in(lane, lo, hi)
        self.remove(slots)
        return slots

    def starting_in(self, lane: int, lo: int, hi: int) -> np.ndarray:
        """Slots of every item whose window starts at rows ``lo .. hi - 1`` of ``lane`` (ordered as
        :meth:`evict_range` orders them)."""
        if self.overflow:
            rows = np.arange(lo, hi, dtype=np.int64)
            return self._with_overflow(np.full(rows.size, lane, np.int64), rows % self.capacity)
        return self.core.indexed(lane, lo, hi)

    def _with_overflow(self, lanes: np.ndarray, pos: np.ndarray) -> np.ndarray:
        direct = self.row_slot[lanes, pos]
        shared = np.flatnonzero(self.has_overflow[lanes, pos])
        if not shared.size:
            return direct[direct >= 0]
        out: list[int] = []
        start = 0
        for i in shared.tolist():
            out.extend(s for s in direct[start:i].tolist() if s >= 0)
            group = self.overflow[(int(lanes[i]), int(pos[i]))] + ([int(direct[i])] if direct[i] >= 0 else [])
            out.extend(sorted(group, key=lambda s: self.meta[s, KEY]))
            start = i + 1
        out.extend(s for s in direct[start:].tolist() if s >= 0)
        return np.asarray(out, np.int64)

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        live = self.live_slots()
        return self.checkpoint_state(live, self.priority[live], self.free[: self.num_free].copy())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        a = state["arrays"]
        live = self.load_records(state)
        self.priority[live] = a["priority"]
        self.num_free = int(a["free"].size)
        self.free[: self.num_free] = a["free"]
        self.row_slot[:] = -1
        self.overflow = {}
        self.has_overflow[:] = False
        order = self.live_in_order()
        lanes, pos = self.meta[order, LANE], self.meta[order, START] % self.capacity
        _, first = np.unique(lanes * self.capacity + pos, return_index=True)
        self.row_slot[lanes[first], pos[first]] = order[first]
        rest = np.setdiff1d(np.arange(order.size), first)
        self._overflow_add(order[rest], lanes[rest], pos[rest])
