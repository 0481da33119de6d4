"""StepStore: preallocated columnar rings of step rows, one ring per lane.

A *lane* is one env stream (one env of a vector env, or one (env, agent) pair of a turn-based game).
Each lane is a ring of ``capacity`` rows; every column of the spec is one array of shape
``(lanes, capacity, *field.shape)``. Rows are addressed by their *absolute* index in their lane: the
n-th row ever written to a lane has index ``n``, stored at position ``n % capacity``. A row is alive
while ``count[lane] - capacity <= index < count[lane]``.

Every row records its episode (``episode_id``, counted per lane) and its position in that episode
(``episode_step``); a row starts a new episode when written with ``first=True``, which a lane's first row
must be (:meth:`StepStore.append` and :meth:`StepStore.extend` refuse it otherwise). Windows gathered
with :meth:`StepStore.gather_windows` stop at the episode boundary unless asked to cross it.

Tables reference rows by ``(lane, start, length)``. Before a write overwrites a row, the store tells every
subscribed table (:meth:`subscribe`), which removes each item whose window starts at that row: the oldest
row of a window is always its start, so this removes every item that references an overwritten row.

A field with frame stacks (:class:`~rlflow.specs.Field` ``stack=k``, observations ``[k, *frame]``) keeps one
frame per row, the newest of the stack written there; reads rebuild each row's stack from the rows before it
in its episode, repeating the episode's first frame where the stack reaches before it. A row whose stack reads
a row no longer stored cannot be read, and the items that start there go with the overwritten rows' items
(``docs/pixels.md``). Such fields are written through an adder, which checks that the stacks continue.

Backends: ``"memory"`` (numpy arrays) and ``"disk"`` (numpy memmaps, one ``.npy`` file per column, under
a directory the caller names). Both behave the same.

Thread safety: the store's ``lock`` (a re-entrant lock) guards writes; Tables on the store share it, so
a sample never sees a row half overwritten.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlflow import _core
from rlflow import specs as _specs
from rlflow.replay.items import LANE, LENGTH, START, VALID
from rlflow.specs import Field, Spec, SpecError

# bytes: rows up to this size are gathered by the core's prefetching byte gather; np.take copies larger rows
# faster (benchmarks/gather.py: a tie at 96 bytes)
_SMALL_ROW = 96
# rows: a gather of at least this many first requests every row of every column (one compiled call)
_PREFETCH_ROWS = 64

__all__ = ["OverwriteListener", "StepStore"]

_NO_FIRST = np.zeros(0, np.bool_)


class OverwriteListener(Protocol):
    def on_overwrite_range(self, lane: int, lo: int, hi: int) -> None:
        """Rows ``lo .. hi - 1`` (absolute) of ``lane`` are about to be overwritten, or (frame stacks) can no
        longer be read: the items that start there must go."""


# What StepStore._bind derives, and what a pickle leaves out (the lock and the subscribed tables).
_DERIVED = frozenset({"lock", "_listeners", "_flat", "_small_rows", "_row_bytes", "_prefetch_cols", "_all_lanes",
                      "_ranges", "_core_rings"})


class StepStore:
    """Columnar rings of step rows. See the module docstring for the addressing model.

    Args:
        spec: the columns of one row: a dict of named specs (e.g. :func:`~rlflow.specs.step_spec`'s
            ``observation``, ``action``, ``reward``, ...), each a :class:`~rlflow.specs.Field` or dicts and tuples
            of them.
        capacity: rows per lane.
        lanes: number of lanes (env streams).
        backend: ``"memory"`` or ``"disk"``.
        directory: where the disk backend puts its column files (created; must be empty).
    """

    def __init__(
        self,
        spec: Mapping[str, Spec],
        capacity: int,
        lanes: int = 1,
        *,
        backend: str = "memory",
        directory: str | Path | None = None,
    ) -> None:
        if int(capacity) < 2:
            raise ValueError(f"capacity must be >= 2 rows per lane, got {capacity}")
        if int(lanes) < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        if isinstance(spec, Mapping):
            stack = max((f.stack for f in _specs.flatten_spec(spec).values()), default=1)
            if int(capacity) <= stack:
                raise ValueError(f"capacity must exceed the frames of a stack ({stack}), got {capacity}")
        if not isinstance(spec, Mapping):
            raise SpecError(f"spec: expected a dict of named specs (e.g. rlflow.types.step_spec(observation, action) "
                            f"or {{'obs': Field(...)}}), got {type(spec).__name__}")
        self.spec = spec
        self.fields: dict[str, Field] = _specs.flatten_spec(spec)
        if not self.fields:
            raise SpecError("the spec has no fields")
        self._flat_spec = all(isinstance(f, Field) for f in spec.values())
        self._stacks = {n: f.stack for n, f in self.fields.items() if f.stack > 1}
        outside = [n for n in self._stacks if n != "observation" and not n.startswith("observation/")]
        if outside:
            raise SpecError(f"fields {outside} declare frame stacks (stack=); only observations hold them: declare "
                            "the field without stack=, or put it under 'observation'")
        self.stack_reach = _specs.stack_reach(spec)  # rows before a row that its stacks read
        self._unflatten_plan = _specs.unflatten_plan(spec)
        self.capacity = int(capacity)
        self.num_lanes = int(lanes)
        self.backend = backend
        self.directory = Path(directory) if directory is not None else None
        self.lock = threading.RLock()
        self._listeners: list[OverwriteListener] = []
        shape2 = (self.num_lanes, self.capacity)
        if backend == "memory":
            self.columns = {n: np.zeros((*shape2, *f.frame_shape), f.dtype) for n, f in self.fields.items()}
        elif backend == "disk":
            self.columns = self._open_disk_columns(shape2)
        else:
            raise ValueError(f"backend must be 'memory' or 'disk', got {backend!r}")
        self.episode_id = np.full(shape2, -1, np.int64)
        self.episode_step = np.full(shape2, -1, np.int64)
        self.count = np.zeros(self.num_lanes, np.int64)
        self._next_episode = np.zeros(self.num_lanes, np.int64)
        self._next_step = np.zeros(self.num_lanes, np.int64)
        self._bind()

    def _bind(self) -> None:
        """Derive the views of the columns and cursors the compiled core reads (at construction and unpickling)."""
        # Flat views (lanes * capacity, ...) for one-index gathers, and the same rows as raw bytes
        # (lanes * capacity, row bytes) for the compiled core's writes and the gathers' prefetch pass.
        rows = self.num_lanes * self.capacity  # explicit: -1 cannot be inferred for a field of no values
        self._flat = {n: c.reshape(rows, *self.fields[n].frame_shape) for n, c in self.columns.items()}
        self._row_bytes = {n: np.asarray(c).reshape(rows, int(np.prod(self.fields[n].frame_shape))).view(np.uint8)
                           for n, c in self.columns.items()}
        # Columns of small rows of several values, for the compiled gather (which requests every row's cache
        # lines before copying any; large rows are copied by np.take, whose memcpy streams them).
        self._small_rows = {n: self._row_bytes[n] for n, c in self._flat.items()
                            if type(c) is np.ndarray and c.ndim > 1 and 0 < self.fields[n].nbytes <= _SMALL_ROW
                            and n not in self._stacks and not c.dtype.hasobject}
        self._prefetch_cols = tuple(self._row_bytes.values())
        self._all_lanes = np.arange(self.num_lanes)
        self._ranges = np.zeros((self.num_lanes, 3), np.int64)  # before_write's (lane, lo, hi) of overwritten rows
        self._core_rings = _core.StoreRings(written=self.count, episode_id=self.episode_id,
                                            episode_step=self.episode_step, next_episode=self._next_episode,
                                            next_step=self._next_step, reach=self.stack_reach)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the columns and cursors (copies come back; the tables on the store are not pickled with it:
        they subscribe again when they are unpickled). A disk store is refused: its rows live in its files."""
        if self.backend != "memory":
            raise TypeError(f"a StepStore with backend={self.backend!r} cannot be pickled (its rows live in "
                            f"{self.directory}): build it with backend='memory', or save a checkpoint "
                            "(rlflow.replay.save) and load it into a store built where it is needed")
        return type(self)._unpickled, ({k: v for k, v in self.__dict__.items() if k not in _DERIVED},)

    @classmethod
    def _unpickled(cls, state: dict[str, Any]) -> StepStore:
        """A pickled store (:meth:`__reduce__`), with a new lock and no tables."""
        store = cls.__new__(cls)
        store.__dict__.update(state, lock=threading.RLock(), _listeners=[])
        store._bind()
        return store

    def _open_disk_columns(self, shape2: tuple[int, int]) -> dict[str, np.ndarray]:
        if self.directory is None:
            raise ValueError("the disk backend needs a directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.iterdir()):
            raise ValueError(f"the disk backend needs an empty directory, {self.directory} is not empty")
        names = list(self.fields)
        (self.directory / "columns.json").write_text(json.dumps(names))
        return {
            n: np.lib.format.open_memmap(
                self.directory / f"column_{i:04d}.npy", mode="w+", dtype=f.dtype, shape=(*shape2, *f.frame_shape)
            )
            for i, (n, f) in enumerate(self.fields.items())
        }

    # ------------------------------------------------------------------ listeners
    def subscribe(self, listener: OverwriteListener) -> None:
        with self.lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: OverwriteListener) -> None:
        with self.lock:
            self._listeners.remove(listener)

    # ------------------------------------------------------------------ the block writer's view
    def rings(self) -> _core.StoreRings:
        """The ring cursors and episode marks as the compiled core reads them (window checks, draws)."""
        return self._core_rings

    def block_writer(self, act: list[str], obs: list[str], open_rows: np.ndarray,
                     episode_start: np.ndarray) -> _core.BlockWriter:
        """The compiled block writer over columns ``act`` (what an action fills in, in a block's order), ``obs``
        (the observations), the flag columns and the ring cursors of this store, and an adder's lane state
        (``open_rows``, ``episode_start``: ``[lanes]`` int64, the adder's)."""
        flat = self._flat
        return _core.BlockWriter(act=[flat[k] for k in act], obs=[flat[k] for k in obs],
                                 frames=[self.fields[k].stack for k in obs],
                                 flags=[flat[k] for k in ("terminated", "truncated", "first", "last")],
                                 rings=self._core_rings, open_rows=open_rows, episode_start=episode_start)

    def flat_columns(self) -> dict[str, np.ndarray]:
        """Every column as ``(lanes * capacity, *shape)`` (views of the live data, by column name): row ``r``
        of lane ``l`` is at ``l * capacity + r % capacity``."""
        return self._flat

    def column_rows(self, name: str) -> np.ndarray:
        """Column ``name`` as ``(lanes * capacity, values per row)`` (a view of the live data; a stacked column's
        newest frames)."""
        return self._flat[name].reshape(self.num_lanes * self.capacity, -1)

    def before_write(self, lanes: np.ndarray, rows: np.ndarray) -> None:
        """Tell every listener about the rows that writing ``rows[i]`` new rows to each of ``lanes`` overwrites, and
        with frame stacks the rows after them whose stacks read them (every write of the store and of the block
        writer calls this first)."""
        if not self._listeners:
            return
        if self._ranges.shape[0] < lanes.size:
            self._ranges = np.zeros((lanes.size, 3), np.int64)
        self.notify_overwrite(self._ranges[:self._core_rings.overwritten(lanes, rows, self._ranges)])

    def notify_overwrite(self, ranges: np.ndarray) -> None:
        """Tell every listener that rows ``lo .. hi - 1`` of ``lane`` are about to be overwritten, for each
        ``(lane, lo, hi)`` of ``ranges`` (the block writer's plan computes them as :meth:`before_write` does)."""
        if not self._listeners or not len(ranges):
            return
        for lane, lo, hi in ranges.tolist():
            for listener in self._listeners:
                listener.on_overwrite_range(lane, lo, hi)

    # ------------------------------------------------------------------ writes
    def check_lanes(self, lanes: Any) -> np.ndarray:
        """``lanes`` (None: every lane) as distinct lanes of this store, an int64 array; ValueError naming what
        came otherwise. Writes and adders that take ``lanes=`` check them here."""
        if lanes is None:
            return self._all_lanes
        arr = lanes if isinstance(lanes, np.ndarray) else np.asarray(lanes)
        n = self.num_lanes
        if arr.ndim == 1 and arr.dtype.kind in "iu":
            if arr.size == 1:
                ok = 0 <= int(arr[0]) < n
            else:
                ok = not arr.size or (arr.min() >= 0 and arr.max() < n and np.bincount(arr.astype(np.int64)).max() == 1)
            if ok:
                return np.ascontiguousarray(arr, np.int64)
        got = arr.tolist() if arr.ndim == 1 and arr.size <= 16 else f"{arr.dtype} array of shape {arr.shape}"
        raise ValueError(f"lanes: expected distinct integers in [0, {n}) (each lane once), got {got}")

    def _columns_of(self, data: Any, n: int | None, checked: bool,
                    partial: bool = False) -> tuple[dict[str, np.ndarray], int]:
        """Flat, validated columns of ``data`` and their common leading length.

        ``partial``: ``data`` is a dict holding some of the spec's top-level keys (the others are not
        written).
        """
        fields = self.fields
        if self._flat_spec and type(data) is dict and data.keys() == self.fields.keys():
            flat = data  # a flat spec given a dict with exactly its keys: nothing to flatten
        elif partial:
            if not isinstance(data, Mapping) or not data:
                raise SpecError("a partial write takes a dict with some of the spec's top-level keys")
            unknown = [k for k in data if k not in self.spec]
            if unknown:
                raise SpecError(f"partial write: unexpected keys {unknown}; the spec has {list(self.spec)}")
            sub = {k: self.spec[k] for k in data}
            flat = _specs.flatten_data(sub, data)
            fields = {name: self.fields[name] for name in flat}
        else:
            flat = _specs.flatten_data(self.spec, data)
        stacked = [name for name in flat if name in self._stacks]
        if stacked:
            raise SpecError(f"fields {stacked} hold frame stacks, which a store takes through an adder (it checks that "
                            "each stack continues the one before it and keeps the newest frame): write the steps with "
                            "rlflow.adders or ReplayBuffer.add")
        if n is None and checked:  # validate checks every field's leading length against the first's
            first = next(iter(flat.values()))
            n = first.shape[0] if type(first) is np.ndarray and first.ndim else (np.shape(first) or (-1,))[0]
            if n < 0:
                raise SpecError(f"extend: every field needs a leading length T, got a scalar for {next(iter(flat))!r}")
        elif n is None:
            lengths = {v.shape[0] if type(v) is np.ndarray and v.ndim else (np.shape(v) or (-1,))[0]
                       for v in flat.values()}
            if len(lengths) != 1 or -1 in lengths:
                raise SpecError(f"extend: every field needs the same leading length T, got lengths {sorted(lengths)}")
            n = lengths.pop()
        return (_specs.validate(fields, flat, (n,)) if checked else flat), n

    def append(self, data: Any, lanes: Any = None, first: Any = None, *, checked: bool = True,
               partial: bool = False) -> np.ndarray:
        """Write one row to each of ``lanes`` (default: every lane) and return their absolute indices.

        ``data`` has the spec's structure with a leading axis of ``len(lanes)``. ``first[i]`` marks the
        row as the start of a new episode in its lane. Invalid data raises and writes nothing.
        ``checked=False`` skips validation, for callers that validated already. ``partial=True`` takes
        a dict with some of the spec's top-level keys: the new rows' other columns keep whatever the
        ring held there until :meth:`write` fills them (adders write a row's observation when it
        arrives and its action and reward one step later).
        """
        with self.lock:
            lanes_arr = self.check_lanes(lanes)
            n = lanes_arr.size
            cols, _ = self._columns_of(data, n, checked, partial)
            if n == 1:
                first_arr = self._check_first(first, 1, allow_none=True)
                if checked:
                    self._require_starts(lanes_arr, first_arr)
                return self._write_lane(int(lanes_arr[0]), cols, 1, first_arr)
            first_arr = self._check_first(first, n)
            if checked:
                self._require_starts(lanes_arr, first_arr)
            return self._put_rows(lanes_arr, cols, first_arr)

    def _require_starts(self, lanes_arr: np.ndarray, first_arr: np.ndarray) -> None:
        """Raise unless every lane of ``lanes_arr`` that holds no row yet gets a row that starts an episode
        (``first_arr``: one flag per lane, or empty for none)."""
        new = self.count[lanes_arr] == 0
        if not new.any():
            return
        bad = lanes_arr[new & ~first_arr] if first_arr.size else lanes_arr[new]
        if bad.size:
            raise ValueError(f"first: lanes {bad.tolist()} hold no rows yet, so their next row starts an episode: "
                             f"pass first=True for them (e.g. first=np.ones({lanes_arr.size}, bool) for a reset); "
                             "nothing was written")

    def _put_rows(self, lanes_arr: np.ndarray, cols: dict[str, np.ndarray], first_arr: np.ndarray) -> np.ndarray:
        """Write one validated row to each of ``lanes_arr`` (distinct); the caller holds the lock."""
        if lanes_arr.size == 1:
            return self._write_lane(int(lanes_arr[0]), cols, 1, first_arr if first_arr.any() else _NO_FIRST)
        self.before_write(lanes_arr, np.ones(lanes_arr.size, np.int64))
        rows = self.count[lanes_arr]
        r0 = rows[0]
        if lanes_arr.size == self.num_lanes and (rows == r0).all() and (lanes_arr == self._all_lanes).all():
            pos = int(r0) % self.capacity  # every lane at one ring position: one strided copy per column
            for name, col in cols.items():
                self.columns[name][:, pos] = col
        else:
            flat_idx = lanes_arr * self.capacity + rows % self.capacity
            for name, col in cols.items():
                self._flat[name][flat_idx] = col
        self._mark(lanes_arr, first_arr)
        return rows

    def write(self, lanes: Any, rows: Any, data: Any, *, checked: bool = True) -> None:
        """Overwrite some top-level columns of stored rows ``rows[i]`` of lanes ``lanes[i]``.

        ``data`` is a dict with some of the spec's top-level keys, each with a leading axis of
        ``len(rows)``. Rows must be stored; invalid data raises and writes nothing.
        """
        with self.lock:
            lanes_arr = np.asarray(lanes, np.int64).reshape(-1)
            rows_arr = np.asarray(rows, np.int64).reshape(-1)
            if lanes_arr.shape != rows_arr.shape:
                raise ValueError(f"write: lanes and rows differ in length ({lanes_arr.size} vs {rows_arr.size})")
            if checked:
                if lanes_arr.size and (lanes_arr.min() < 0 or lanes_arr.max() >= self.num_lanes):
                    raise ValueError(f"lanes: expected values in [0, {self.num_lanes}), got "
                                     f"{lanes_arr.min()}..{lanes_arr.max()}")
                self._require_alive(lanes_arr, rows_arr)
            cols, _ = self._columns_of(data, rows_arr.size, checked, partial=True)
            flat_idx = lanes_arr * self.capacity + rows_arr % self.capacity
            for name, col in cols.items():
                self._flat[name][flat_idx] = col

    def extend(self, lane: int, data: Any, first: Any = None, *, checked: bool = True) -> np.ndarray:
        """Write ``T`` consecutive rows to one lane (``data`` leads with axis ``T``); return their indices.

        ``first`` (bool, shape ``[T]``) marks rows that start an episode. ``T`` must not exceed capacity.
        """
        with self.lock:
            if not isinstance(lane, int | np.integer) or not 0 <= lane < self.num_lanes:
                raise ValueError(f"lane: expected an integer in [0, {self.num_lanes}), got {lane!r}")
            lane = int(lane)
            cols, t = self._columns_of(data, None, checked)
            if t > self.capacity:
                raise ValueError(f"extend: {t} rows exceed the lane capacity {self.capacity}; write fewer")
            first_arr = self._check_first(first, t, allow_none=True)
            if checked and t:
                self._require_starts(np.array([lane]), first_arr[:1])
            return self._write_lane(lane, cols, t, first_arr)

    def _write_lane(self, lane: int, cols: dict[str, np.ndarray], t: int, first: np.ndarray) -> np.ndarray:
        """Write ``t`` validated rows to one lane: notify overwrites, copy, mark episodes; return the rows.

        ``first`` is a bool array of ``t``, or empty when no row starts an episode.
        """
        self.before_write(np.array([lane], np.int64), np.array([t], np.int64))
        start = int(self.count[lane])
        base = lane * self.capacity
        p0 = start % self.capacity
        p1 = min(p0 + t, self.capacity)
        if p1 - p0 == t:  # no wrap: one slice copy per column
            for name, col in cols.items():
                self._flat[name][base + p0: base + p1] = col
        else:
            for name, col in cols.items():
                self._flat[name][base + p0: base + p1] = col[: p1 - p0]
                self._flat[name][base: base + t - (p1 - p0)] = col[p1 - p0:]
        rows = np.empty(t, np.int64)
        self._core_rings.mark(np.full(t, lane, np.int64), first, rows)
        return rows

    def _mark(self, lanes: np.ndarray, first: np.ndarray) -> None:
        self._core_rings.mark(lanes, first, np.empty(lanes.size, np.int64))

    @staticmethod
    def _check_first(first: Any, n: int, *, allow_none: bool = False) -> np.ndarray:
        """``first`` as a bool array of ``n``; with ``allow_none``, ``None`` gives an empty array (no starts)."""
        if first is None:
            return _NO_FIRST if allow_none else np.zeros(n, bool)
        arr = np.asarray(first)
        if arr.ndim == 0:
            arr = np.full(n, bool(arr))
        if arr.shape != (n,) or arr.dtype != np.bool_:
            raise ValueError(f"first: expected a bool array of shape ({n},), got {arr.dtype} {arr.shape}")
        return np.ascontiguousarray(arr)

    # ------------------------------------------------------------------ reads
    def alive(self, lanes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether each absolute row is still stored (and, with frame stacks, every row its stacks read): a
        one-row window check."""
        lanes_arr = np.ascontiguousarray(lanes, np.int64).reshape(-1)
        rows_arr = np.ascontiguousarray(rows, np.int64).reshape(-1)
        _, valid = self._core_rings.check_windows(lanes_arr, rows_arr, np.ones(rows_arr.size, np.int64), True)
        return (valid > 0).reshape(np.shape(rows))

    def _require_alive(self, lanes: np.ndarray, rows: np.ndarray) -> None:
        ok = self.alive(lanes, rows)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            held = f"[{max(0, self.count[lanes[i]] - self.capacity)}, {self.count[lanes[i]]})"
            if 0 <= rows[i] < self.count[lanes[i]] and rows[i] >= self.count[lanes[i]] - self.capacity:
                raise IndexError(f"row {rows[i]} of lane {lanes[i]} cannot be read: its frame stacks read rows no "
                                 f"longer stored (lane holds rows {held})")
            raise IndexError(f"row {rows[i]} of lane {lanes[i]} is not stored: lane holds rows {held}")

    def gather(self, lanes: Any, rows: Any, *, checked: bool = True) -> dict[str, np.ndarray]:
        """Rows ``rows[i]`` of lanes ``lanes[i]`` as flat columns ``[B, ...]``."""
        lanes_arr = np.asarray(lanes, np.int64)
        rows_arr = np.asarray(rows, np.int64)
        if checked:
            self._require_alive(lanes_arr, rows_arr)
        return self.take(lanes_arr * self.capacity + rows_arr % self.capacity)

    def take(self, flat_index: np.ndarray) -> dict[str, np.ndarray]:
        """Every column at flat indices ``lane * capacity + row % capacity`` (any index shape)."""
        if flat_index.size >= _PREFETCH_ROWS:
            _core.prefetch_rows(self._prefetch_cols, flat_index.reshape(-1))
        return {name: self.take_column(name, flat_index) for name in self._flat}

    def take_column(self, name: str, flat_index: np.ndarray, *, by_column: bool = False) -> np.ndarray:
        """Column ``name`` at flat indices ``lane * capacity + row % capacity`` (any index shape). A stacked
        column's stacks are rebuilt from its frames; ``by_column``, for a 2-D index
        whose columns read the same frames (a transition's two ends ``[2, B]``), copies them column by column."""
        k = self._stacks.get(name)
        if k is not None:  # each row's stack: the frames of the k rows up to it in its episode
            field = self.fields[name]
            out = np.empty((*flat_index.shape, *field.shape), field.dtype)
            index = np.ascontiguousarray(flat_index, np.int64)
            rows = index.reshape(-1, index.shape[-1]) if index.ndim else index.reshape(1, 1)
            _core.take_stacks(self._core_rings, self._row_bytes[name], rows, k, by_column and index.ndim == 2,
                              out.reshape(-1).view(np.uint8))
            return out
        small = self._small_rows.get(name)
        if small is not None:
            field = self.fields[name]
            out = np.empty((*flat_index.shape, *field.shape), field.dtype)
            _core.take_rows(small, np.ascontiguousarray(flat_index, np.int64).reshape(-1),
                            out.reshape(-1).view(np.uint8))
            return out
        col = self._flat[name]
        # np.take beats fancy indexing for rows of several values; plain indexing wins for scalars.
        return col.take(flat_index, axis=0) if col.ndim > 1 else col[flat_index]

    def gather_windows(
        self,
        lanes: Any,
        starts: Any,
        lengths: Any,
        *,
        max_length: int | None = None,
        cross_episodes: bool = False,
        checked: bool = True,
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Windows ``rows[starts[i] : starts[i] + lengths[i]]`` of lanes ``lanes[i]`` as ``[B, L, ...]``.

        ``L = max_length`` (default: the longest window). Returns the columns and a bool ``mask [B, L]``
        that is True for rows inside the window and (unless ``cross_episodes``) in the same episode as
        the window's first row; masked rows are zero-filled.
        """
        lanes_arr = np.asarray(lanes, np.int64).reshape(-1)
        starts_arr = np.asarray(starts, np.int64).reshape(-1)
        lengths_arr = np.broadcast_to(np.asarray(lengths, np.int64), starts_arr.shape)
        bad, valid = self._core_rings.check_windows(lanes_arr, starts_arr, np.ascontiguousarray(lengths_arr),
                                                    cross_episodes)
        if checked and bad >= 0:
            lane = int(lanes_arr[bad])
            count = int(self.count[lane]) if 0 <= lane < self.num_lanes else 0
            raise IndexError(
                f"window [{starts_arr[bad]}, {starts_arr[bad] + lengths_arr[bad]}) of lane {lane} is not stored: "
                f"lane holds rows [{max(0, count - self.capacity)}, {count})"
            )
        meta = np.zeros((starts_arr.size, 6), np.int64)
        meta[:, LANE], meta[:, START], meta[:, VALID] = lanes_arr, starts_arr, valid
        meta[:, LENGTH] = lengths_arr if max_length is None else int(max_length)
        return self.take_windows(meta)

    def take_windows(self, meta: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The windows of item records ``meta`` (their columns LANE, START, LENGTH, VALID).

        Returns the columns ``[B, L, ...]`` (``L``: the longest LENGTH) and the mask of rows before each
        item's VALID length; rows past it are zero-filled.
        """
        idx, mask, full = _core.window_index(meta, self.capacity)
        data = self.take(idx)
        if not full:
            hole = ~mask
            for arr in data.values():
                arr[hole] = 0
        return data, mask

    def unflatten(self, flat: Mapping[str, Any]) -> Any:
        """Flat columns back into the spec's nesting."""
        if self._flat_spec:
            return dict(flat)
        return _specs.unflatten_by(self._unflatten_plan, flat)

    # ------------------------------------------------------------------ checkpoint state
    def config(self) -> dict[str, Any]:
        """What must match for a checkpoint of this store to load into it."""
        return {"capacity": self.capacity, "lanes": self.num_lanes,
                "fields": {n: [list(f.shape), f.dtype.str, *([f.stack] if f.stack > 1 else [])]
                           for n, f in self.fields.items()}}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every column and cursor, as numpy arrays (views of the live data; copy before mutating)."""
        state = {f"column/{n}": c for n, c in self.columns.items()}
        state.update(episode_id=self.episode_id, episode_step=self.episode_step, count=self.count,
                     next_episode=self._next_episode, next_step=self._next_step)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output (shapes already checked by the caller)."""
        with self.lock:
            for n, c in self.columns.items():
                c[...] = state[f"column/{n}"]
            self.episode_id[...] = state["episode_id"]
            self.episode_step[...] = state["episode_step"]
            self.count[...] = state["count"]
            self._next_episode[...] = state["next_episode"]
            self._next_step[...] = state["next_step"]

    @property
    def nbytes(self) -> int:
        """Bytes held by the data columns (excluding bookkeeping)."""
        return sum(int(c.nbytes) for c in self.columns.values())

    def __len__(self) -> int:
        """Rows alive, over all lanes."""
        return int(np.minimum(self.count, self.capacity).sum())

    def __repr__(self) -> str:
        return (
            f"StepStore(lanes={self.num_lanes}, capacity={self.capacity}, backend={self.backend!r}, "
            f"rows={len(self)}, fields={list(self.fields)})"
        )
