"""RowTable: a uniform table whose items live in the slot of the row they start at.

A :class:`~rlflow.replay.Table` keeps its items in slots of its own, and a sampler and a remover index
them: each insert and each eviction updates three structures at scattered places. Most replay needs
none of that: uniform sampling, items evicted only when the store overwrites their rows, and at most one
item starting at each row (an n-step transition per action, a sequence every ``period >= 1`` rows, an
episode per first row). A RowTable is that table. The item starting at row ``r`` of lane ``l`` lives in
slot ``(r % capacity) * lanes + l``: an insert writes the item's 64-byte record there, an overwrite of
the row empties it, and a draw picks a stored row at random and takes it when an item starts there.
Slots are numbered position-major, so a step of every lane (a vector env's) writes one contiguous run
of records while the lanes are at the same ring position.

Semantics (the :class:`Table` ones, less the selectors):

- ``insert`` checks each window as ``Table.insert`` does; an item whose start row already starts a
  live item of the table (or starts another item of the same call) is refused with a ValueError, and the
  call changes nothing. Rate limiting, blocking and timeouts are the Table's.
- Items leave when the store overwrites their first row (which every later row of the window outlives),
  on ``delete``, and after ``max_times_sampled`` samples. There is no ``max_size`` below one item per row.
- ``sample(B)`` makes ``B`` draws with replacement, each uniform over the live items
  (``probabilities`` ``1 / size`` at that draw, ``weights`` 1). A draw picks one of the stored rows (lanes weighted
  by the rows they hold) and is redrawn until an item starts there; while fewer than a quarter of the
  stored rows start an item and the table holds fewer than 8 items per draw, draws pick from a list of
  the live slots instead (a scan of every slot's record). With ``max_times_sampled``,
  an item is removed at the draw that reaches the limit, so later draws of the batch cannot take it
  (exactly the sequential draws).
- ``update_priorities`` checks its input and counts the live keys, as a Table with a uniform sampler
  does; priorities do not change the draws.
- Draws use a seeded ``numpy.random.Generator``; its state is in checkpoints (:mod:`rlflow.replay.checkpoint`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow.kernels.items import KEY, LANE, LENGTH, START, TIMES, VALID
from rlflow.replay import _row_kernels as KR
from rlflow.replay.items import META_WIDTH, Items
from rlflow.replay.rate_limiters import RateLimiter
from rlflow.replay.storage import StepStore
from rlflow.replay.table import Table, _int_array, check_priorities
from rlflow.specs import Field, Spec

__all__ = ["RowTable"]


class _RowUniform:
    """A RowTable's draws: the seeded generator and the live item count (what checkpoints keep of it)."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.size = 0

    def config(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.size = int(state["size"])

    def __repr__(self) -> str:
        return f"RowUniform(seed={self.seed})"


class _Overwrite:
    """A RowTable's remover: the store's overwrites (it has no state beyond the item count)."""

    rng = None

    def __init__(self) -> None:
        self.size = 0

    def config(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.size = int(state["size"])

    def __repr__(self) -> str:
        return "Overwrite()"


class _RowItems(Items):
    """The items of a RowTable: :class:`Items`' meta rows and item fields, one slot per store row."""

    def __init__(self, lanes: int, capacity: int, fields: dict[str, Field]) -> None:
        self._init_records(lanes * capacity, capacity, fields)

    def state_dict(self) -> dict[str, Any]:
        live = self.live_in_order()
        free = np.ones(self.max_size, bool)
        free[live] = False
        arrays = {"slot": live, "meta": self.meta[live, :6], "priority": np.ones(live.size),
                  "free": np.flatnonzero(free)}
        arrays.update({f"field/{n}": c[live] for n, c in self.columns.items()})
        return {"next_seq": self.next_seq, "arrays": arrays}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        live = self._load_records(state["arrays"])
        self.num_free = self.max_size - live.size
        self.next_seq = int(state["next_seq"])
        self.times_total = int(self.meta[live, TIMES].sum())


class RowTable(Table):
    """A uniform replay table holding at most one item per start row (see the module docstring).

    Args:
        store: the rows the items reference.
        seed: seed of the draws.
        max_times_sampled: remove an item after this many samples (default: never).
        rate_limiter: default :class:`MinSize(1) <rlflow.replay.rate_limiters.MinSize>`.
        item_spec: the item fields written with each insert (nested dict/tuple of Fields).
        cross_episodes: let sampled windows show rows of the next episode (default: masked out).
        name: shown in errors and checkpoints.
    """

    def __init__(
        self,
        store: StepStore,
        *,
        seed: int | None = None,
        max_times_sampled: int | None = None,
        rate_limiter: RateLimiter | None = None,
        item_spec: Spec | None = None,
        cross_episodes: bool = False,
        name: str = "table",
    ) -> None:
        self.sampler: Any = _RowUniform(seed)
        self.remover: Any = _Overwrite()
        self._setup(store, None, max_times_sampled, rate_limiter, item_spec, cross_episodes, name)
        self._items: _RowItems = self._new_items(self.item_fields)
        self._acc = np.zeros(3, np.int64)
        self._retired = 0
        self._stored = 0  # rows the store holds, as of the last draw
        store.subscribe(self)

    def _new_items(self, fields: dict[str, Field]) -> _RowItems:
        return _RowItems(self.store.num_lanes, self.store.capacity, fields)

    def _counted(self, delta: int) -> None:
        """The item count changed by ``delta``: tell the sampler's and remover's records."""
        self._items.num_free -= delta
        self.sampler.size += delta
        self.remover.size += delta

    # ------------------------------------------------------------------ eviction
    def _evicted(self, removed: int, times: int) -> None:
        if removed:
            self._counted(-removed)
            self._items.times_total -= times
            self.rate_limiter.delete(removed)
            self._wake()

    def on_overwrite(self, lanes: np.ndarray, rows: np.ndarray) -> None:
        """Called by the store before it overwrites ``rows`` of ``lanes``: drop items starting there."""
        self._evicted(*KR.evict_rows(self._items.meta, lanes, rows, self.store.capacity))

    def on_overwrite_range(self, lane: int, lo: int, hi: int) -> None:
        """Called by the store before it overwrites rows ``lo .. hi - 1`` of ``lane``."""
        self._evicted(*KR.evict_range(self._items.meta, lane, lo, hi, self.store.capacity))

    def _remove(self, slots: np.ndarray) -> None:
        if not slots.size:
            return
        meta = self._items.meta
        times = int(meta[slots, TIMES].sum())
        meta[slots, KEY] = -1
        self._evicted(int(slots.size), times)

    # ------------------------------------------------------------------ insert
    def insert_many(self, lanes_arr: np.ndarray, starts_arr: np.ndarray, lengths_arr: np.ndarray,
                    prios: np.ndarray, cols: dict[str, np.ndarray], timeout: float | None = None) -> np.ndarray:
        with self._cond:
            n = starts_arr.size
            if self.rate_limiter.can_insert(n):
                return self._insert_now(lanes_arr, starts_arr, lengths_arr, None, prios, cols)
            # Admitted in parts as the rate limiter allows: refuse shared start rows before any part goes in.
            self._check_windows(lanes_arr, starts_arr, lengths_arr)
            slots = starts_arr % self.store.capacity * self.store.num_lanes + lanes_arr
            taken = self._items.meta[slots, KEY] >= 0
            uniq, first = np.unique(slots, return_index=True)
            if taken.any() or uniq.size < n:
                again = np.ones(n, bool)
                again[first] = False
                bad = int(np.flatnonzero(taken | again)[0])
                self._start_taken(lanes_arr, starts_arr, bad, KR.TAKEN if taken[bad] else KR.TWICE)
            return super().insert_many(lanes_arr, starts_arr, lengths_arr, prios, cols, timeout)

    def _start_taken(self, lanes: np.ndarray, starts: np.ndarray, bad: int, why: int) -> None:
        lane, start = int(lanes[bad]), int(starts[bad])
        raise ValueError(
            f"item {bad}: row {start} of lane {lane} already starts "
            f"{'an item of table ' + repr(self.name) if why == KR.TAKEN else 'an earlier item of this insert'}; "
            "a RowTable holds at most one item per start row (a Table holds any number)")

    def _insert_now(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: Any,
                    prios: np.ndarray, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Place the items (windows checked again: any refusal raises and changes nothing); their keys."""
        n = lanes.size
        store, items = self.store, self._items
        slots, keys, checked = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        bad, why = KR.place(store.count, store.episode_id, store.capacity, self.cross_episodes, items.meta,
                            items.next_seq, lanes, starts, lengths, checked, slots, keys)
        if bad >= 0:
            if why == KR.WINDOW:
                self._window_error(lanes, starts, lengths, bad)
            self._start_taken(lanes, starts, bad, why)
        items.next_seq += n
        for name, col in cols.items():
            items.columns[name][slots] = col
        self._counted(n)
        self.rate_limiter.insert(n)
        self._wake()
        return keys

    # ------------------------------------------------------------------ sample
    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Slots, item rows, probabilities, weights and times sampled of ``n`` sequential uniform draws."""
        items, store, rng, acc = self._items, self.store, self.sampler.rng, self._acc
        limit = self.max_times_sampled or 0
        slots, probs = np.empty(n, np.int64), np.empty(n, np.float64)
        out = np.empty((n, META_WIDTH), np.int64)
        size = self.size
        if self._stored < self.max_size:  # every ring full: stays so (counts never go down)
            self._stored = int(np.minimum(store.count, store.capacity).sum())
        if 4 * size >= self._stored or size >= 8 * n:  # redraws are fewer than a scan of the rows' records
            j, idle = 0, 0
            while j < n:
                # Each round tries more rows than its draws need on average: 64 rounds without a draw mean the
                # records and the count disagree.
                if (j and not acc[0]) or idle == 64:
                    raise RuntimeError(f"table {self.name!r}: no item found to draw {n - j} more (a broken invariant)")
                live = int(acc[0]) if j else size
                tries = (n - j) * self._stored // live + (n - j) // 4 + 8  # the draws' expected tries, and some
                before = j
                j = KR.draw_stored(rng.random(tries), store.count, store.capacity, items.meta, j, live, limit, slots,
                                   out, probs, acc)
                idle = 0 if j > before else idle + 1
                retired, self._retired = int(acc[1]), self._retired + int(acc[1])
                if retired:
                    self._counted(-retired)
                    items.times_total -= int(acc[2])
        else:
            live = np.flatnonzero(items.meta[:, KEY] >= 0)
            KR.draw_packed(rng.random(n), live, items.meta, limit, slots, out, probs, acc)
            if acc[1]:
                self._retired += int(acc[1])
                self._counted(-int(acc[1]))
                items.times_total -= int(acc[2])
        items.times_total += n
        return slots, out, probs, np.ones(n, np.float32), out[:, TIMES]

    def _retire(self, slots: np.ndarray) -> None:
        """The items retired by the draws (already out of the table): the rate limiter's deletes."""
        retired, self._retired = self._retired, 0
        if retired:
            self.rate_limiter.delete(retired)
            self._wake()

    # ------------------------------------------------------------------ priorities, keys
    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Check ``priorities`` and count the entries naming a live item; the draws stay uniform."""
        keys_arr = _int_array("keys", keys)
        check_priorities(priorities, keys_arr.size)
        with self.lock:
            return int(self._items.slots_of(keys_arr)[1].sum())

    def items(self) -> dict[str, np.ndarray]:
        """A copy of every live item's bookkeeping, in insertion order (priorities are all 1)."""
        with self.lock:
            it = self._items
            slots = it.live_in_order()
            meta = it.meta[slots]
            out = {"key": meta[:, KEY], "lane": meta[:, LANE], "start": meta[:, START], "length": meta[:, LENGTH],
                   "valid": meta[:, VALID], "priority": np.ones(slots.size), "times_sampled": meta[:, TIMES]}
            out.update({f"field/{n}": c[slots] for n, c in it.columns.items()})
            return {k: v.copy() for k, v in out.items()}

    # ------------------------------------------------------------------ checkpoint state
    def config(self) -> dict[str, Any]:
        return {**super().config(), "items": "rows"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            self.rate_limiter.load_state_dict(state["rate_limiter"])
            self.sampler.load_state_dict(state["sampler"])
            self.remover.load_state_dict(state["remover"])
            self._items.load_state_dict(state)
            self._stored = 0  # the store was restored too: its rows are counted again at the next draw
            self._wake()

    def __repr__(self) -> str:
        return (f"RowTable({self.name!r}, size={self.size}/{self.max_size}, seed={self.sampler.seed}, "
                f"rate_limiter={self.rate_limiter!r})")
