"""Tables: items (windows of rows in a StepStore) with a rate limiter; :class:`Table`, with a sampler and a
remover, and what every kind of table shares (:class:`TableBase`).

An item is a window ``(lane, start, length)`` of a :class:`~rlflow.replay.StepStore`'s rows, plus item
fields (e.g. an n-step return and discount, declared by ``item_spec``) and a priority. Several tables
can reference one store; each subscribes to it, and when the store is about to overwrite a row, every
item whose window starts there is removed from every table (counted as a delete by the rate limiter).

Semantics (Reverb's):

- ``insert`` admits items as the rate limiter allows, blocking (up to ``timeout``) for the rest; when
  the table holds ``max_size`` items the remover chooses whom to evict first.
- ``sample(B)`` draws ``B`` items one after another: random samplers draw with replacement,
  deterministic ones return their first item (again and again unless ``max_times_sampled`` retires it).
  An item sampled ``max_times_sampled`` times is removed at once; a draw that lands on an item already
  retired within the same batch is drawn again (exactly the sequential draws, vectorised). Each draw
  reports the probability and importance weight of a draw over the items still in at that point.
  Sampling blocks until the rate limiter allows ``B`` samples and, with ``max_times_sampled``, the
  items left can supply ``B`` draws; when the items the sampler can draw (a prioritized sampler never
  draws priority 0) cannot, it raises before any draw, changing nothing.
- ``update_priorities(keys, priorities)`` skips keys that no longer exist; a key repeated in one call
  takes its last priority; negative, NaN or infinite priorities raise and change nothing.

Every method takes the store's lock, so tables are safe to use from several threads.

Two kinds of table share these semantics: :class:`Table` (items in slots of their own, any number
starting at a row, a sampler and a remover) and :class:`~rlflow.replay.RowTable` (uniform, one item per
start row, kept in that row's slot: :mod:`rlflow.replay.row_table`). :class:`TableBase` is what they share:
the store subscription, the lock, the rate limiter's waits and timeouts, the item settings adders
declare, the checks of inserts, the admission of an insert in parts, sampling's gather and checkpoints'
layout. Adders, the store and the loop use only :class:`TableBase`'s public methods.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from rlflow import _core
from rlflow import specs as _specs
from rlflow.replay.items import KEY, LANE, LENGTH, META_WIDTH, START, TIMES, VALID, Items, Records
from rlflow.replay.rate_limiters import MinSize, RateLimiter
from rlflow.replay.sample import Sample
from rlflow.replay.selectors import Fifo, Selector, Uniform
from rlflow.replay.storage import StepStore
from rlflow.replay.views import ItemView, other_setting
from rlflow.specs import Spec

__all__ = ["RateLimitTimeout", "Table", "TableBase"]


class RateLimitTimeout(TimeoutError):
    """A blocking insert or sample waited ``timeout`` seconds without the rate limiter allowing it."""


def _int_array(name: str, value: Any, n: int | None = None) -> np.ndarray:
    if type(value) is np.ndarray and value.dtype == np.int64 and value.ndim == 1:
        arr = value
    elif n is not None and type(value) is int:
        arr = np.empty(n, np.int64)
        arr.fill(value)
    else:
        arr = np.asarray(value)
        if arr.ndim == 0:
            arr = arr.reshape(1) if n is None else np.full(n, arr)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(f"{name}: expected a 1-d integer array, got dtype {arr.dtype} shape {arr.shape}")
        arr = arr.astype(np.int64)
    if n is not None and arr.size != n:
        raise ValueError(f"{name}: expected {n} values, got {arr.size}")
    return arr


def check_priorities(value: Any, n: int) -> np.ndarray:
    if type(value) is float or type(value) is int:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"priorities: expected finite values >= 0, got {value}")
        arr = np.empty(n, np.float64)
        arr.fill(value)
        return arr
    if type(value) is np.ndarray and value.dtype == np.float64 and value.shape == (n,):
        arr = value  # the common call: a learner's float64 batch, only its values need checking
    else:
        arr = _real_array(value, n)
    bad = _core.first_bad_priority(arr)
    if bad >= 0:
        raise ValueError(f"priorities: expected finite values >= 0, got {arr[bad]} at position {bad}")
    return arr


def _real_array(value: Any, n: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.full(n, arr)
    if arr.shape != (n,):
        raise ValueError(f"priorities: expected shape ({n},), got {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"priorities: expected real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def _is_flat(spec: Spec | None) -> bool:
    """Whether a spec is a dict of Fields (its flat columns are then already in its nesting)."""
    return isinstance(spec, dict) and all(isinstance(v, _specs.Field) for v in spec.values())


class TableBase(ABC):
    """What every kind of table shares (see the module docstring); :class:`Table` and
    :class:`~rlflow.replay.RowTable` are its kinds.

    A kind keeps its items in a :class:`~rlflow.replay.items.Records` (``_items``) and says how items go in
    (:meth:`_place`; :meth:`_check_parts` for an insert in parts), leave (:meth:`on_overwrite_range`,
    :meth:`_remove`) and are drawn (:meth:`_draw`, :meth:`_retire`); its ``__init__`` calls this one, makes
    its items (:meth:`_new_items`) and then subscribes to the store.

    Args:
        store: the rows the items reference.
        max_size: most items held (None: one per row of the store).
        max_times_sampled: remove an item after this many samples (None: never).
        rate_limiter: None for :class:`MinSize(1) <rlflow.replay.rate_limiters.MinSize>`.
        item_spec: the item fields written with each insert (nested dict/tuple of Fields).
        cross_episodes: let sampled windows show rows of the next episode (default: masked out).
        name: shown in errors and checkpoints.
    """

    _items: Records

    _warned_unreachable = False  # warned that the store overwrites items before the first sample
    _most_held = 0  # the most items held after an insert, until min_size_to_sample is reached
    _evicted_early = 0  # items the store overwrote while _most_held < min_size_to_sample

    def __init__(self, store: StepStore, *, max_size: int | None, max_times_sampled: int | None,
                 rate_limiter: RateLimiter | None, item_spec: Spec | None, cross_episodes: bool, name: str) -> None:
        self.store = store
        self.name = name
        self.max_size = int(max_size) if max_size is not None else store.capacity * store.num_lanes
        if self.max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if max_times_sampled is not None and int(max_times_sampled) < 1:
            raise ValueError(f"max_times_sampled must be >= 1 or None, got {max_times_sampled}")
        self.max_times_sampled = None if max_times_sampled is None else int(max_times_sampled)
        self.rate_limiter = rate_limiter if rate_limiter is not None else MinSize(1)
        self.rate_limiter.check_deadlock_free(self.max_size, self.max_times_sampled)
        self.item_spec = item_spec
        self.item_fields = _specs.flatten_spec(item_spec) if item_spec is not None else {}
        self._flat_item_spec = _is_flat(item_spec)
        self.cross_episodes = bool(cross_episodes)
        self.lock = store.lock
        self._cond = threading.Condition(store.lock)
        self._waiting = 0  # threads blocked in insert or sample
        self.view: ItemView | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the lock and its condition (pickled with the store, whose rows the items reference;
        a sample or insert waiting at the time is not part of the state)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("lock", "_cond", "_waiting")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = self.store.lock
        self._cond = threading.Condition(self.store.lock)
        self._waiting = 0
        self.store.subscribe(self)

    # ------------------------------------------------------------------ what a kind provides
    @abstractmethod
    def _new_items(self, fields: dict[str, _specs.Field]) -> Records:
        """Empty item slots for items with these fields."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Items held."""

    @abstractmethod
    def on_overwrite_range(self, lane: int, lo: int, hi: int) -> None:
        """Called by the store before it overwrites rows ``lo .. hi - 1`` of ``lane``."""

    @abstractmethod
    def _remove(self, slots: np.ndarray) -> None:
        """Remove the live items in ``slots`` (distinct), counting them as deletes."""

    @abstractmethod
    def _check_parts(self, lanes: np.ndarray, starts: np.ndarray) -> None:
        """Raise on what :meth:`_place` of the whole insert would refuse beyond its windows, before an insert
        admitted in parts places its first part (the windows are checked already)."""

    @abstractmethod
    def _place(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None,
               prios: np.ndarray, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Place items the rate limiter admitted, making room as the table's kind does; their keys. ``valid``:
        their windows' stored lengths, checked already (an insert in parts), or None: check them here, a
        refusal raising with nothing changed."""

    @abstractmethod
    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Slots, item records, probabilities, weights and times sampled of ``n`` sequential draws."""

    @abstractmethod
    def _retire(self, slots: np.ndarray) -> None:
        """After a sample's draws of ``slots`` (with ``max_times_sampled``): the items that reached it are out."""

    @abstractmethod
    def _set_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """:meth:`update_priorities` of checked arguments, under the lock."""

    @abstractmethod
    def _priorities(self, slots: np.ndarray) -> np.ndarray:
        """The priorities of the items in ``slots``."""

    @abstractmethod
    def _role_configs(self) -> dict[str, list[Any]]:
        """``{"sampler": [type name, config], "remover": [type name, config]}`` for :meth:`config`."""

    @abstractmethod
    def role_states(self) -> dict[str, dict[str, Any]]:
        """``{"sampler": state, "remover": state}``: what checkpoints keep under those names (a
        :class:`Table`'s selectors' states; a RowTable's draws and its count of items)."""

    @abstractmethod
    def _items_state(self) -> dict[str, Any]:
        """``next_seq`` and the item arrays of a checkpoint (:meth:`Records.checkpoint_state`)."""

    @abstractmethod
    def _load_items(self, state: dict[str, Any]) -> None:
        """Restore :meth:`_items_state` and :meth:`role_states` from :meth:`state_dict`'s output."""

    # ------------------------------------------------------------------ the items' kind
    def check_items(self, view: ItemView, item_spec: Spec | None) -> bool:
        """Raise ValueError if :meth:`configure_items` would refuse ``view`` and ``item_spec`` (changes
        nothing); whether the table holds these items already."""
        fields = _specs.flatten_spec(item_spec) if item_spec is not None else {}
        if self.view is None and self.item_spec is None:
            if self._items.next_seq:
                raise ValueError(f"table {self.name!r} already held items; configure its item kind before inserting")
            return False
        if self.view == view and fields == self.item_fields:
            return True
        setting = other_setting(view.config(), self.view.config()) if self.view is not None else None
        if setting is not None and setting[0] != "kind":
            key, mine, theirs = setting
            raise ValueError(f"table {self.name!r} holds {view.kind} items of {key}={theirs!r}; this adder's "
                             f"have {key}={mine!r}: a table takes the items of one setting, give this adder a "
                             "table of its own")
        raise ValueError(
            f"table {self.name!r} already holds {self.view.kind if self.view else 'window'} items with "
            f"fields {list(self.item_fields)}; an adder of {view.kind} items with fields {list(fields)} "
            "needs a table of its own")

    def configure_items(self, view: ItemView, item_spec: Spec | None) -> None:
        """Declare the kind of items this table holds: samples are then shaped by ``view``.

        Adders call this when they are built. A table holds one kind of item: configuring it again
        with another view (the error names the first setting that differs) or item spec raises, as does
        configuring a table that already held items (:meth:`check_items` runs these checks alone).
        """
        with self.lock:
            if self.check_items(view, item_spec):
                return
            fields = _specs.flatten_spec(item_spec) if item_spec is not None else {}
            self.view = view
            self.item_spec = item_spec
            self.item_fields = fields
            self._flat_item_spec = _is_flat(item_spec)
            self._items = self._new_items(fields)

    def __len__(self) -> int:
        return self.size

    # ------------------------------------------------------------------ insert
    def insert(
        self,
        lanes: Any,
        starts: Any,
        lengths: Any,
        *,
        priorities: Any = 1.0,
        fields: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Insert items ``(lanes[i], starts[i], lengths[i])`` and return their keys.

        ``starts`` are absolute row indices (as returned by the store's writes); each window must be
        stored in full. Blocks while the rate limiter refuses inserts; raises :class:`RateLimitTimeout`
        after ``timeout`` seconds (items admitted before then stay inserted).
        """
        with self._cond:
            starts_arr = _int_array("starts", starts)
            n = starts_arr.size
            lanes_arr = _int_array("lanes", lanes, n)
            lengths_arr = _int_array("lengths", lengths, n)
            prios = check_priorities(priorities, n)
            cols = self._check_fields(fields, n)
            return self.insert_many(lanes_arr, starts_arr, lengths_arr, prios, cols, timeout)

    def insert_many(self, lanes_arr: np.ndarray, starts_arr: np.ndarray, lengths_arr: np.ndarray,
                    prios: np.ndarray, cols: dict[str, np.ndarray], timeout: float | None = None) -> np.ndarray:
        """Insert items an adder made (:meth:`insert` of arguments already converted and checked: int64 arrays
        of one length, float64 finite non-negative priorities, item fields of the item spec; windows are
        still checked). Returns their keys.

        The items go in as parts of what the rate limiter admits, each placed by :meth:`_place`; usually the
        first part is all of them, checked as it is placed. An insert that goes in several parts is checked
        whole before its first part, so a refusal still changes nothing; rows written while it waits may
        overwrite some windows: those items are skipped (key -1), as if inserted and at once evicted."""
        with self._cond:
            n = starts_arr.size
            if self._admissible(n) == n:  # the usual case: all at once, checked as they are placed
                return self._place(lanes_arr, starts_arr, lengths_arr, None, prios, cols)
            valid = self._check_windows(lanes_arr, starts_arr, lengths_arr)  # in parts: every refusal first
            self._check_parts(lanes_arr, starts_arr)
            keys = np.full(n, -1, np.int64)
            done = 0
            deadline = None if timeout is None else time.monotonic() + timeout
            while done < n:
                k = self._admissible(n - done)
                if k == 0:
                    self._wait(deadline, f"insert {n - done} more item(s)")
                    valid[done:] = self._check_windows(lanes_arr[done:], starts_arr[done:], lengths_arr[done:],
                                                       strict=False)
                    continue
                sl = slice(done, done + k)
                ok = valid[sl] > 0
                if ok.any():
                    part = {name: c[sl][ok] for name, c in cols.items()}
                    keys[sl][ok] = self._place(lanes_arr[sl][ok], starts_arr[sl][ok], lengths_arr[sl][ok],
                                               valid[sl][ok], prios[sl][ok], part)
                done += k
            return keys

    def preview(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, fields: dict[str, np.ndarray]) -> Any:
        """Items not inserted yet (stored windows, item fields), shaped as a sample of this table shapes them
        (what a priority function of new items is given)."""
        meta = np.zeros((lanes.size, META_WIDTH), np.int64)
        meta[:, LANE], meta[:, START], meta[:, LENGTH] = lanes, starts, lengths
        meta[:, VALID] = self._check_windows(lanes, starts, lengths, strict=False)
        if self.view is None:
            raise RuntimeError(f"table {self.name!r}: preview() needs the item kind an adder gives the table first")
        return self.view.gather(self.store, meta, fields)[0]

    def _check_fields(self, fields: Any, n: int) -> dict[str, np.ndarray]:
        if not self.item_fields or self.item_spec is None:
            if fields is not None:
                raise _specs.SpecError(f"table {self.name!r} has no item_spec, but fields were given")
            return {}
        if fields is None:
            raise _specs.SpecError(f"table {self.name!r} needs item fields {list(self.item_fields)}")
        flat = _specs.flatten_data(self.item_spec, fields)
        return _specs.validate(self.item_fields, flat, (n,))

    def _check_windows(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, *,
                       strict: bool = True) -> np.ndarray:
        """Valid length of each window (0 for a window not stored); raises on the first bad one if strict."""
        bad, valid = self.store.rings().check_windows(lanes, starts, lengths, self.cross_episodes)
        if strict and bad >= 0:
            self._window_error(lanes, starts, lengths, bad)
        return valid

    def _window_error(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, bad: int) -> None:
        store = self.store
        lane, start, length = int(lanes[bad]), int(starts[bad]), int(lengths[bad])
        if not 0 <= lane < store.num_lanes:
            raise ValueError(f"lanes: expected values in [0, {store.num_lanes}), got {lane} at item {bad}")
        if not 1 <= length <= store.capacity:
            raise ValueError(f"lengths: expected values in [1, {store.capacity}], got {length} at item {bad}")
        count = int(store.count[lane])
        oldest = max(0, count - store.capacity)
        held = f"the lane holds rows [{oldest}, {count})"
        if oldest <= start and start + length <= count:  # stored: its first row's frame stacks are not
            raise ValueError(f"item {bad}: window [{start}, {start + length}) of lane {lane} starts at a row whose "
                             f"frame stacks read rows no longer stored; {held}")
        raise ValueError(f"item {bad}: window [{start}, {start + length}) of lane {lane} is not stored; {held}")

    def _admissible(self, n: int) -> int:
        """The most of ``n`` items the rate limiter admits now (at most ``max_size``)."""
        limiter = self.rate_limiter
        n = min(n, self.max_size)
        if limiter.can_insert(n):
            return n
        lo, hi = 0, n  # can_insert(lo) holds, can_insert(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if limiter.can_insert(mid) else (lo, mid)
        return lo

    def _wait(self, deadline: float | None, what: str) -> None:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise RateLimitTimeout(
                f"table {self.name!r}: timed out waiting to {what}; {self.rate_limiter!r}, "
                f"size {self.size}/{self.max_size}"
            )
        self._waiting += 1
        try:
            self._cond.wait(remaining)
        finally:
            self._waiting -= 1

    def _wake(self) -> None:
        """Wake the threads blocked on this table, if any (the caller holds the lock)."""
        if self._waiting:
            self._cond.notify_all()

    # ------------------------------------------------------------------ sample
    def can_sample(self, batch_size: int) -> bool:
        """Whether ``sample(batch_size)`` would return without waiting."""
        with self.lock:
            return self._can_sample(batch_size)

    def _can_sample(self, batch_size: int) -> bool:
        size = self.size
        if not size or not self.rate_limiter.can_sample(batch_size):
            return False
        if self.max_times_sampled is not None:
            return size * self.max_times_sampled - self._items.times_total >= batch_size
        return True

    def can_insert(self, n: int = 1) -> bool:
        """Whether ``n`` items would be admitted without waiting."""
        with self.lock:
            return self.rate_limiter.can_insert(n)

    def sample(self, batch_size: int, *, timeout: float | None = None) -> Sample:
        """Draw ``batch_size`` items and gather their rows (see the module docstring)."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        batch_size = int(batch_size)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._can_sample(batch_size):
                self._wait(deadline, f"sample {batch_size} item(s)")
            slots, meta, probs, weights, times = self._draw(batch_size)
            self.rate_limiter.sample(batch_size)
            self._wake()  # samples are what let a blocked insert through
            lanes, starts, lengths = meta[:, LANE], meta[:, START], meta[:, LENGTH]
            fields = self._items.drawn_fields(slots, meta)
            if self.view is None:
                data, mask = self.store.take_windows(meta)
                data = self.store.unflatten(data)
            else:
                data, mask = self.view.gather(self.store, meta, fields)
            if self.max_times_sampled is not None:
                self._retire(slots)
        return Sample(
            keys=meta[:, KEY], probabilities=probs, weights=weights, times_sampled=times, lanes=lanes,
            starts=starts, lengths=lengths, data=data, mask=mask,
            fields=None if self.item_spec is None else fields if self._flat_item_spec else _specs.unflatten(
                self.item_spec, fields),
        )

    # ------------------------------------------------------------------ priorities, keys
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the items still present; return how many entries named a live item.

        Keys of removed items are skipped; a key repeated in one call takes its last priority (and is
        counted each time).
        """
        keys_arr = _int_array("keys", keys)
        prios = check_priorities(priorities, keys_arr.size)
        with self.lock:
            return self._set_priorities(keys_arr, prios)

    def delete(self, keys: Any) -> int:
        """Remove the items still present; return how many were removed."""
        keys_arr = _int_array("keys", keys)
        with self.lock:
            slots, live = self._items.slots_of(np.unique(keys_arr))
            self._remove(slots[live])
            return int(live.sum())

    def items(self) -> dict[str, np.ndarray]:
        """A copy of every live item's bookkeeping, in insertion order."""
        with self.lock:
            it = self._items
            slots = it.live_in_order()
            meta = it.meta[slots]
            out = {"key": meta[:, KEY], "lane": meta[:, LANE], "start": meta[:, START],
                   "length": meta[:, LENGTH], "valid": meta[:, VALID], "priority": self._priorities(slots),
                   "times_sampled": meta[:, TIMES]}
            out.update({f"field/{n}": c[slots] for n, c in it.columns.items()})
            return {k: v.copy() for k, v in out.items()}

    # ------------------------------------------------------------------ checkpoint state
    def config(self) -> dict[str, Any]:
        """What must match for a checkpoint of this table to load into it."""
        return {
            "name": self.name, "max_size": self.max_size, "max_times_sampled": self.max_times_sampled,
            "cross_episodes": self.cross_episodes,
            "view": self.view.config() if self.view is not None else None,
            **self._role_configs(),
            "item_fields": {n: [list(f.shape), f.dtype.str] for n, f in self.item_fields.items()},
        }

    def state_dict(self) -> dict[str, Any]:
        """Every array and counter of the table (numpy arrays and plain values only)."""
        with self.lock:
            return {"config": self.config(), **self._items_state(), **self.role_states(),
                    "rate_limiter": self.rate_limiter.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the caller checked it matches :meth:`config`)."""
        with self._cond:
            self.rate_limiter.load_state_dict(state["rate_limiter"])
            self._load_items(state)
            self._wake()


class Table(TableBase):
    """A replay table over a :class:`StepStore` (see the module docstring for the semantics).

    Args:
        store: the rows the items reference.
        sampler: chooses items to sample (default :class:`Uniform`).
        remover: chooses items to evict when full (default :class:`Fifo`).
        max_size: most items held (default: one per row of the store).
        max_times_sampled: remove an item after this many samples (default: never).
        rate_limiter: default :class:`MinSize(1) <rlflow.replay.rate_limiters.MinSize>`.
        item_spec: the item fields written with each insert (nested dict/tuple of Fields).
        cross_episodes: let sampled windows show rows of the next episode (default: masked out).
        name: shown in errors and checkpoints.
    """

    _items: Items

    def __init__(
        self,
        store: StepStore,
        *,
        sampler: Selector | None = None,
        remover: Selector | None = None,
        max_size: int | None = None,
        max_times_sampled: int | None = None,
        rate_limiter: RateLimiter | None = None,
        item_spec: Spec | None = None,
        cross_episodes: bool = False,
        name: str = "table",
    ) -> None:
        self.sampler = sampler if sampler is not None else Uniform()
        self.remover = remover if remover is not None else Fifo()
        if self.sampler is self.remover:
            raise ValueError("sampler and remover must be two selector objects")
        super().__init__(store, max_size=max_size, max_times_sampled=max_times_sampled, rate_limiter=rate_limiter,
                         item_spec=item_spec, cross_episodes=cross_episodes, name=name)
        if (self.max_times_sampled is not None and not self.sampler.deterministic
                and type(self.sampler).sequential_weights is Selector.sequential_weights):
            raise ValueError(f"max_times_sampled={self.max_times_sampled}: the draws that retire items need the "
                             f"probabilities of draws over the items left; implement "
                             f"{type(self.sampler).__name__}.sequential_weights, or drop max_times_sampled")
        self.sampler.bind(self.max_size)
        self.remover.bind(self.max_size)
        self._items = self._new_items(self.item_fields)
        store.subscribe(self)

    def _new_items(self, fields: dict[str, _specs.Field]) -> Items:
        return Items(self.max_size, self.store.num_lanes, self.store.capacity, fields)

    @property
    def size(self) -> int:
        return self._items.size

    # ------------------------------------------------------------------ removal
    def _remove(self, slots: np.ndarray) -> None:
        if not slots.size:
            return
        self.sampler.delete(slots)
        self.remover.delete(slots)
        self._items.remove(slots)
        self.rate_limiter.delete(int(slots.size))
        self._wake()

    def on_overwrite_range(self, lane: int, lo: int, hi: int) -> None:
        """Called by the store before it overwrites rows ``lo .. hi - 1`` of ``lane``."""
        slots = self._items.evict_range(lane, lo, hi)
        if slots.size:
            self._warn_if_never_sampled(int(slots.size))
            self.sampler.delete(slots)
            self.remover.delete(slots)
            self.rate_limiter.delete(int(slots.size))
            self._wake()

    def _warn_if_never_sampled(self, evicted: int) -> None:
        """Warn (once) where the store has overwritten a whole ring of items (its rows times its lanes) and the
        table never held the rate limiter's ``min_size_to_sample``: the store's rows are too few for that many
        items (episode ends and the rows each item keeps take rows too), so its samples never start."""
        limiter = self.rate_limiter
        if self._most_held >= limiter.min_size_to_sample or self._warned_unreachable:
            return
        self._evicted_early += evicted
        if self._evicted_early < self.store.capacity * self.store.num_lanes:
            return
        self._warned_unreachable = True
        warnings.warn(f"table {self.name!r}: its store has overwritten {self._evicted_early} items and it never "
                      f"held the {limiter.min_size_to_sample} its rate limiter waits for (min_size_to_sample) "
                      f"before the first sample (at most {self._most_held}), so samples may never start; give the "
                      f"store more rows (capacity: {self.store.capacity} a lane) or lower min_size_to_sample",
                      RuntimeWarning, stacklevel=2)

    # ------------------------------------------------------------------ insert
    def _check_parts(self, lanes: np.ndarray, starts: np.ndarray) -> None:
        """Nothing: any number of items may start at a row."""

    def _place(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None,
               prios: np.ndarray, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Check the windows (unless ``valid`` is given), make room (the remover chooses whom to evict), then
        place the items."""
        if valid is None:
            valid = self._check_windows(lanes, starts, lengths)
        overflow = self.size + lanes.size - self.max_size
        if overflow > 0:
            self._remove(self.remover.choose_for_removal(overflow, self._items.live_slots))
        slots, keys, seqs = self._items.add(lanes, starts, lengths, valid, prios, cols)
        self._inserted(slots, prios, seqs)
        return keys

    def _inserted(self, slots: np.ndarray, prios: np.ndarray, seqs: np.ndarray) -> None:
        """Tell the selectors and the rate limiter about items just placed."""
        self.sampler.insert(slots, prios, seqs)
        self.remover.insert(slots, prios, seqs)
        self.rate_limiter.insert(int(slots.size))
        if self._most_held < self.rate_limiter.min_size_to_sample:
            self._most_held = max(self._most_held, self.size)
        self._wake()

    # ------------------------------------------------------------------ sample
    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Slots, item metadata, probabilities, weights and times sampled of ``n`` sequential draws."""
        limit = self.max_times_sampled
        items = self._items
        if limit is None and not self.sampler.deterministic:  # the common case: one draw of n
            slots, meta, probs, weights = self.sampler.draw_rows(n, items.meta)
            items.times_total += n
            return slots, meta, probs, weights, meta[:, TIMES]
        if limit is not None:
            self._check_reachable(n)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        got = 0
        while got < n:
            need = n - got
            if self.sampler.deterministic:
                cand, p = self.sampler.sample(1 if limit is None else need)
                if limit is None:
                    take = np.array([need])
                else:
                    budget = limit - items.times[cand]
                    before = np.cumsum(budget) - budget
                    take = np.clip(need - before, 0, budget)
                slots, probs = np.repeat(cand, take), np.repeat(p, take)
                weights = np.ones(slots.size, np.float32)
            else:
                slots, probs, weights = self.sampler.sample_with_weights(need)
                if limit is not None:  # a draw past its item's limit is made again in the next round
                    left, seen = limit - items.times[slots], _occurrence(slots)
                    keep = seen < left
                    slots = slots[keep]
                    probs, weights = self.sampler.sequential_weights(slots, seen[keep] == left[keep] - 1)
            meta = _core.draw_rows(items.meta, slots)
            items.times_total += slots.size
            parts.append((slots, meta, probs, weights, meta[:, TIMES]))
            got += slots.size
            if limit is not None and got < n:
                self._retire(slots)
        if len(parts) == 1:
            return parts[0]
        slots, meta, probs, weights, times = (np.concatenate(col) for col in zip(*parts, strict=True))
        return slots, meta, probs, weights, times

    def _check_reachable(self, n: int) -> None:
        """Raise before any draw when the items the sampler can draw (a :class:`Prioritized` sampler never
        draws items of priority 0) cannot supply ``n`` draws before ``max_times_sampled`` retires them."""
        limit = self.max_times_sampled
        assert limit is not None
        supplied = self.sampler.draws_reachable(self._items.times, limit, n)
        if supplied < n:
            raise ValueError(
                f"table {self.name!r}: cannot sample {n} item(s): the items of positive priority have "
                f"{supplied} draw(s) left before max_times_sampled={limit} retires them, and items of "
                f"priority 0 are never sampled; {f'sample at most {supplied} item(s) or ' if supplied else ''}"
                "give items positive priorities (the table is unchanged)")

    def _retire(self, slots: np.ndarray) -> None:
        """Remove the live items among ``slots`` that reached ``max_times_sampled``."""
        uniq = np.unique(slots)
        uniq = uniq[self._items.keys[uniq] >= 0]
        self._remove(uniq[self._items.times[uniq] >= self.max_times_sampled])

    # ------------------------------------------------------------------ priorities
    def _set_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        slots, values = self._items.core.set_priorities(keys, priorities)
        # Selectors apply updates in order, so a repeated key keeps its last priority there too.
        self.sampler.update(slots, values)
        self.remover.update(slots, values)
        return slots.size

    def _priorities(self, slots: np.ndarray) -> np.ndarray:
        return self._items.priority[slots]

    # ------------------------------------------------------------------ checkpoint state
    def _role_configs(self) -> dict[str, list[Any]]:
        return {"sampler": [type(self.sampler).__name__, self.sampler.config()],
                "remover": [type(self.remover).__name__, self.remover.config()]}

    def role_states(self) -> dict[str, dict[str, Any]]:
        return {"sampler": self.sampler.state_dict(), "remover": self.remover.state_dict()}

    def _items_state(self) -> dict[str, Any]:
        return self._items.state_dict()

    def _load_items(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.remover.load_state_dict(state["remover"])
        self._items.load_state_dict(state)

    def __repr__(self) -> str:
        return (f"Table({self.name!r}, size={self.size}/{self.max_size}, sampler={self.sampler!r}, "
                f"remover={self.remover!r}, rate_limiter={self.rate_limiter!r})")

def _occurrence(slots: np.ndarray) -> np.ndarray:
    """For each position, how many earlier positions hold the same slot."""
    order = np.argsort(slots, kind="stable")
    s = slots[order]
    first = np.r_[True, s[1:] != s[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(s.size), 0))
    out = np.empty(slots.size, np.int64)
    out[order] = np.arange(s.size) - group_start
    return out

