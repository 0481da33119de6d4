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

Semantics (the :class:`~rlflow.replay.Table` ones, less the selectors; what both kinds share is
:class:`~rlflow.replay.table.TableBase`):

- ``insert`` checks each window as ``Table.insert`` does; an item whose start row already starts a
  live item of the table (or starts another item of the same call) is refused with a ValueError, and the
  call changes nothing. Rate limiting, blocking and timeouts are those of every table.
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
- Draws use a seeded ``numpy.random.Generator``; its state is in checkpoints (:mod:`rlflow.replay.checkpoint`),
  which hold the arrays a Table's do: the draws' generator and the item count where a Table keeps its
  sampler's state, the item count where it keeps its remover's, priorities 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow import _core
from rlflow.replay.items import KEY, META_WIDTH, TIMES, RowRecords
from rlflow.replay.rate_limiters import RateLimiter
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase
from rlflow.specs import Field, Spec

__all__ = ["RowTable"]

# The names a checkpoint's configuration gives a RowTable's draws and overwrites, where a Table's names
# its sampler's and remover's types (checkpoint format version 1).
_DRAWS, _OVERWRITES = "_RowUniform", "_Overwrite"


class RowTable(TableBase):
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

    _items: RowRecords

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
        super().__init__(store, max_size=None, max_times_sampled=max_times_sampled, rate_limiter=rate_limiter,
                         item_spec=item_spec, cross_episodes=cross_episodes, name=name)
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._size = 0
        self._retired = 0  # items the draws of the current sample retired
        self._stored = 0  # rows the store holds, as of the last draw
        self._items = self._new_items(self.item_fields)
        store.subscribe(self)

    def _new_items(self, fields: dict[str, Field]) -> RowRecords:
        """One slot per store row: slot ``(row % capacity) * lanes + lane``."""
        return RowRecords(self.store.num_lanes, self.store.capacity, fields)

    @property
    def size(self) -> int:
        return self._size

    # ------------------------------------------------------------------ removal
    def _evicted(self, removed: int, times: int) -> None:
        """``removed`` items, sampled ``times`` times in all, left their slots: count them as deletes."""
        if removed:
            self._size -= removed
            self._items.times_total -= times
            self.rate_limiter.delete(removed)
            self._wake()

    def on_overwrite_range(self, lane: int, lo: int, hi: int) -> None:
        """Called by the store before it overwrites rows ``lo .. hi - 1`` of ``lane``."""
        self._evicted(*self._items.core.evict(lane, lo, hi))

    def _remove(self, slots: np.ndarray) -> None:
        if not slots.size:
            return
        meta = self._items.meta
        times = int(meta[slots, TIMES].sum())
        meta[slots, KEY] = -1
        self._evicted(int(slots.size), times)

    # ------------------------------------------------------------------ insert
    def _check_parts(self, lanes: np.ndarray, starts: np.ndarray) -> None:
        """Refuse shared start rows before any part goes in."""
        n = starts.size
        slots = starts % self.store.capacity * self.store.num_lanes + lanes
        taken = self._items.meta[slots, KEY] >= 0
        uniq, first = np.unique(slots, return_index=True)
        if taken.any() or uniq.size < n:
            again = np.ones(n, bool)
            again[first] = False
            bad = int(np.flatnonzero(taken | again)[0])
            self._start_taken(lanes, starts, bad, _core.PlaceFault.TAKEN if taken[bad] else _core.PlaceFault.TWICE)

    def _start_taken(self, lanes: np.ndarray, starts: np.ndarray, bad: int, why: _core.PlaceFault) -> None:
        lane, start = int(lanes[bad]), int(starts[bad])
        taken = why == _core.PlaceFault.TAKEN
        holder = f"an item of table {self.name!r}" if taken else "an earlier item of this insert"
        raise ValueError(
            f"item {bad}: row {start} of lane {lane} already starts {holder}; "
            "a RowTable holds at most one item per start row (a Table holds any number)")

    def _place(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None,
               prios: np.ndarray, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Place the items in their start rows' slots (windows checked again, whole ones or not: any refusal
        raises and changes nothing; priorities are all 1); their keys."""
        n = lanes.size
        items = self._items
        bad, why, slots, keys = items.core.place(self.store.rings(), self.cross_episodes, items.next_seq, lanes,
                                                 starts, lengths)
        if bad >= 0:
            if why == _core.PlaceFault.WINDOW:
                self._window_error(lanes, starts, lengths, bad)
            self._start_taken(lanes, starts, bad, why)
        items.next_seq += n
        for name, col in cols.items():
            items.columns[name][slots] = col
        self._size += n
        self.rate_limiter.insert(n)
        self._wake()
        return keys

    # ------------------------------------------------------------------ sample
    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Slots, item rows, probabilities, weights and times sampled of ``n`` sequential uniform draws."""
        items, store, rng = self._items, self.store, self._rng
        limit = self.max_times_sampled or 0
        slots, probs = np.empty(n, np.int64), np.empty(n, np.float64)
        out = np.empty((n, META_WIDTH), np.int64)
        size = self._size
        if self._stored < self.max_size:  # every ring full: stays so (counts never go down)
            self._stored = int(np.minimum(store.count, store.capacity).sum())
        if 4 * size >= self._stored or size >= 8 * n:  # redraws are fewer than a scan of the rows' records
            j, idle = 0, 0
            while j < n:
                # Each round tries more rows than its draws need on average: 64 rounds without a draw mean the
                # records and the count disagree.
                if not size or idle == 64:
                    raise RuntimeError(f"table {self.name!r}: no item found to draw {n - j} more (a broken invariant)")
                tries = (n - j) * self._stored // size + (n - j) // 4 + 8  # the draws' expected tries, and some
                tally = items.core.draw_stored(store.rings(), rng.random(tries), j, size, limit, slots, out, probs)
                idle = 0 if tally.made > j else idle + 1
                j, size = tally.made, tally.size
                self._retired_by_draws(tally)
        else:
            live_slots = np.flatnonzero(items.meta[:, KEY] >= 0)
            self._retired_by_draws(items.core.draw_live(rng.random(n), live_slots, limit, slots, out, probs))
        items.times_total += n
        return slots, out, probs, np.ones(n, np.float32), out[:, TIMES]

    def _retired_by_draws(self, tally: _core.DrawTally) -> None:
        """The items a draw retired (``max_times_sampled``) left their slots."""
        if tally.retired:
            self._retired += tally.retired
            self._size -= tally.retired
            self._items.times_total -= tally.retired_times

    def _retire(self, slots: np.ndarray) -> None:
        """The items retired by the draws (already out of their slots): the rate limiter's deletes."""
        retired, self._retired = self._retired, 0
        if retired:
            self.rate_limiter.delete(retired)
            self._wake()

    # ------------------------------------------------------------------ priorities
    def _set_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Count the entries naming a live item; the draws stay uniform."""
        return int(self._items.slots_of(keys)[1].sum())

    def _priorities(self, slots: np.ndarray) -> np.ndarray:
        return np.ones(slots.size)

    # ------------------------------------------------------------------ checkpoint state
    def config(self) -> dict[str, Any]:
        return {**super().config(), "items": "rows"}

    def _role_configs(self) -> dict[str, list[Any]]:
        return {"sampler": [_DRAWS, {"seed": self.seed}], "remover": [_OVERWRITES, {}]}

    def role_states(self) -> dict[str, dict[str, Any]]:
        return {"sampler": {"rng": self._rng.bit_generator.state, "size": self._size}, "remover": {"size": self._size}}

    def _items_state(self) -> dict[str, Any]:
        items = self._items
        live = items.live_in_order()
        free = np.ones(self.max_size, bool)
        free[live] = False
        return items.checkpoint_state(live, np.ones(live.size), np.flatnonzero(free))

    def _load_items(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["sampler"]["rng"]
        self._size = self._items.load_records(state).size
        self._retired = 0
        self._stored = 0  # the store was restored too: its rows are counted again at the next draw

    def __repr__(self) -> str:
        return (f"RowTable({self.name!r}, size={self.size}/{self.max_size}, seed={self.seed}, "
                f"rate_limiter={self.rate_limiter!r})")
