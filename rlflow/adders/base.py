"""The adder base: turns a batched TimeStep stream into step rows, and tells its subclass what changed.

Every adder writes rows the same way (the boundary model of :mod:`rlflow.types`):

- a lane's observation becomes a row when it arrives (``first`` marks a new episode's first row); the
  row stays *open* until the next :meth:`Adder.add` fills in the action taken from it, the reward and
  the ``terminated``/``truncated`` flags received after it, and the extras;
- when an episode ends, its true final observation becomes one more row (``last=True``, zero action,
  zero reward), so an episode of ``T`` actions is ``T + 1`` rows and ``next_observation`` is always the
  next row, stored once;
- every input is checked before anything is written: a bad call raises and changes nothing.

Subclasses (:class:`~rlflow.adders.NStepTransition`, :class:`~rlflow.adders.Sequence`,
:class:`~rlflow.adders.Episode`) decide which windows of rows become items, in :meth:`Adder._emit`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow import specs as _specs
from rlflow.adders import _kernels as KA
from rlflow.replay import _direct
from rlflow.replay import _item_kernels as KI
from rlflow.replay._item_kernels import LANE, LENGTH, START, VALID
from rlflow.replay.storage import StepStore
from rlflow.replay.table import Table, _check_priorities
from rlflow.replay.views import ItemView, other_setting
from rlflow.specs import SpecError
from rlflow.types import TimeStep

__all__ = ["Adder", "PriorityFn", "StepEvents"]

PriorityFn = Callable[[Any], Any]
# write_steps's arguments past ``n`` when it makes no items: discount powers, rewards, a table's arrays and
# state, and the item outputs (unused; of the types the n-step adder passes).
_NO_ITEMS = (np.ones(1), np.zeros((1, 1), np.float32), _direct.NO_ROWS, _direct.NO_STATE,
             *np.zeros((3, 1), np.int64), np.zeros((1, 1), np.float32), np.zeros(1, np.float32), np.zeros(3, np.int64))
_ROW_KEYS = ("observation", "action", "reward", "terminated", "truncated", "first", "last")


@dataclass
class StepEvents:
    """What one :meth:`Adder.add` call wrote, per lane group (all arrays int64 or bool, one entry per lane).

    Attributes:
        ended: lanes whose episode ended in this call.
        final_rows: the final-observation row of each ended lane.
        episode_starts: the first row of each ended episode.
        terminated: whether each ended episode terminated (else it was truncated).
        continued: lanes whose episode goes on with a new open row.
        continued_rows: that new row, per continued lane.
        continued_starts: the first row of each continued lane's episode.
        started: lanes that started an episode in this call.
        started_rows: the first row of each started lane's episode.
        final_was_open: the final rows were already stored as open rows (:meth:`Adder.truncate`), so
            windows ending on them that were complete before are not new.
    """

    ended: np.ndarray
    final_rows: np.ndarray
    episode_starts: np.ndarray
    terminated: np.ndarray
    continued: np.ndarray
    continued_rows: np.ndarray
    continued_starts: np.ndarray
    started: np.ndarray
    started_rows: np.ndarray
    final_was_open: bool = False


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + "/")


def _bool_lanes(name: str, value: Any, n: int, *, subset: bool = False) -> np.ndarray:
    """``timestep.<name>``: one bool per lane of ``n`` (the store's lanes, or the ``lanes`` given: ``subset``)."""
    arr = np.asarray(value)
    if arr.shape == (n,) and arr.dtype == np.bool_:
        return arr
    if arr.ndim == 1:
        if subset:
            raise SpecError(f"timestep.{name}: the timestep has {arr.shape[0]} lanes, lanes= names {n}: expected "
                            "the timestep of exactly the lanes given")
        raise SpecError(f"timestep.{name}: the timestep has {arr.shape[0]} lanes, the adder's store {n}: expected "
                        "one store lane per env lane (build the store with lanes=env.num_envs)")
    raise SpecError(f"timestep.{name}: expected a bool array of shape ({n},), one flag per lane, got "
                    f"{arr.dtype} {arr.shape}")


def _leaves(spec: Any, key: str) -> list[tuple[str, Any, Any]] | None:
    """(flat name, key in the value or None, Field) of a top-level part that is a Field or a flat dict of
    Fields; None for deeper nesting (always validated the general way)."""
    if isinstance(spec, _specs.Field):
        return [(key, None, spec)]
    if isinstance(spec, Mapping) and all(isinstance(f, _specs.Field) for f in spec.values()):
        return [(f"{key}/{k}", k, f) for k, f in spec.items()]
    return None


def _fast_leaves(leaves: list[tuple[str, Any, Any]] | None, value: Any, n: int, out: dict[str, np.ndarray]) -> bool:
    """Put ``value``'s leaves in ``out`` if each is an ndarray of exactly its field's dtype and shape, with
    finite floats and in-bounds integers; False (out partly filled) otherwise."""
    if leaves is None:
        return False
    if leaves[0][1] is not None:
        if type(value) is not dict or len(value) != len(leaves):
            return False
    for name, key, field in leaves:
        v = value if key is None else value.get(key)
        if not _specs.fits(field, v, n):
            return False
        out[name] = v
    return True


def _row_bytes(value: np.ndarray, n: int) -> np.ndarray:
    """``value`` (leading axis ``n``) as ``(n, row bytes)`` uint8, for the compiled kernels."""
    if not (value.flags.c_contiguous and value.flags.writeable):  # one numba type for every input
        value = np.array(value, order="C")
    if value.ndim == 2:  # the common case: a vector per row
        return value.view(np.uint8)
    return value.reshape(n, -1).view(np.uint8) if value.size else np.zeros((n, 0), np.uint8)


class Adder:
    """Writes a batched TimeStep stream into a store's lanes; subclasses turn rows into items.

    ``max_items_per_step``: the most items one :meth:`add` call writes per lane (what a loop must let
    the tables admit before each env step).

    Args:
        store: the step rows (its spec from :func:`rlflow.types.step_spec`); one lane per env stream.
        tables: the tables that receive every item (each on ``store``).
        view: how those tables shape sampled items (set on each table).
        item_spec: the item fields the subclass writes (set on each table).
        priority_fns: per table name, a function of the batch of new items (shaped like a sample of the
            table) returning their priorities; tables without one give new items priority 1.
        min_capacity: rows per lane the store needs so that every item is still stored when it is written
            (its window, plus the rows one call writes after the window's first row).
    """

    max_items_per_step = 1
    _staged = 0  # steps held by :meth:`stage` and not yet written (adders that stage)

    def __init__(self, store: StepStore, tables: Sequence[Table], *, view: ItemView, item_spec: Any,
                 priority_fns: Mapping[str, PriorityFn] | None, min_capacity: int) -> None:
        if not isinstance(store.spec, Mapping) or any(k not in store.spec for k in _ROW_KEYS):
            raise SpecError(f"an adder needs a store whose spec has the keys {list(_ROW_KEYS)} "
                            f"(build it with rlflow.types.step_spec), got {list(store.fields)}")
        extra = [k for k in store.spec if k not in (*_ROW_KEYS, "extras")]
        if extra:
            raise SpecError(f"unexpected top-level keys {extra} in the store's spec; put user columns under 'extras'")
        if not tables:
            raise ValueError("an adder needs at least one table")
        for table in tables:
            if table.store is not store:
                raise ValueError(f"table {table.name!r} is on another store")
        if store.capacity < min_capacity:
            raise ValueError(f"this adder needs a store of at least {min_capacity} rows per lane, "
                             f"got capacity {store.capacity}")
        names = [t.name for t in tables]
        unknown = sorted(set(priority_fns or {}) - set(names))
        if unknown:
            raise ValueError(f"priority_fns names tables {unknown}; the adder's tables are {names}")
        for table in tables:  # every table checked before any is configured
            table.check_items(view, item_spec)
        for table in tables:
            table.configure_items(view, item_spec)
        self.store = store
        self.tables = list(tables)
        self.view = view
        self.priority_fns = dict(priority_fns or {})
        self.num_lanes = store.num_lanes
        fields = store.fields
        self._obs_fields = {n: f for n, f in fields.items() if _under(n, "observation")}
        self._act_fields = {n: f for n, f in fields.items() if _under(n, "action")}
        self._extra_fields = {n: f for n, f in fields.items() if _under(n, "extras")}
        self._reward_fields = {"reward": fields["reward"]}
        self._open = np.full(self.num_lanes, -1, np.int64)  # the lane's open row (action pending), or -1
        self._episode_start = np.full(self.num_lanes, -1, np.int64)
        self._lanes = np.arange(self.num_lanes)
        self._no_lanes = self._lanes[:0]
        self._layout = {key: _leaves(store.spec[key], key) for key in ("observation", "action", "reward", "extras")
                        if key in store.spec}
        # The compiled path's column groups: what an action fills in (action, reward, extras), and observations.
        self._act_names = [*self._act_fields, "reward", *self._extra_fields]
        self._obs_names = list(self._obs_fields)
        self._act_cols = tuple(store._row_bytes[k] for k in self._act_names)
        self._obs_cols = tuple(store._row_bytes[k] for k in self._obs_names)
        self._ones = np.ones(self.num_lanes, np.float64)  # priority 1 for new items (read only)
        # The compiled add's outputs: each lane's step kind, the rows it overwrites (lanes, rows), and per lane
        # the final row, the first row of its action's episode and the new open row (write_steps's rows).
        # Multi-agent rows (rlflow.envs.ParallelEnvironment): an agent not active at a row takes no action there.
        active, flags = fields.get("observation/active"), fields.get("observation/terminated")
        multi_agent = (active is not None and flags is not None and active.dtype == np.bool_ and len(active.shape) == 1
                       and flags.shape == active.shape and fields["reward"].shape == active.shape)
        self._agent_active = store._flat["observation/active"] if multi_agent else None
        n = self.num_lanes
        self._scratch = (np.empty(n, np.int8), np.empty((2, 2 * n), np.int64), np.empty((1, 3, n), np.int64))
        self._start_columns: tuple[Any, Any, Any] | None = None  # zero action columns for add_first

    # ------------------------------------------------------------------ the Acme-style interface
    def stage(self, actions: Any, next_timestep: TimeStep, extras: Any = None) -> None:
        """:meth:`add`, possibly held back: adders that stage (:class:`~rlflow.adders.NStepTransition`)
        check the step now and write it, with the steps staged before it, at the next :meth:`flush`; here
        it is written at once."""
        self.add(actions, next_timestep, extras)

    def flush(self) -> None:
        """Write the steps :meth:`stage` holds (none here)."""

    def add_first(self, timestep: TimeStep, lanes: Any = None) -> None:
        """Start an episode on every lane, or on ``lanes`` (``timestep`` then leads with ``len(lanes)``).

        ``timestep`` comes from ``env.reset()``: every lane ``first``. The lanes must have no episode in
        progress (end it, or call :meth:`reset` or :meth:`truncate`).
        """
        if self._staged:
            self.flush()
        if lanes is None and self._add_first_compiled(timestep):
            return
        lanes_arr = self._lanes if lanes is None else self._lane_subset(lanes)
        n = lanes_arr.size
        first = _bool_lanes("first", timestep.first, n, subset=lanes is not None)
        if not first.all():
            raise SpecError(f"add_first: expected first=True on all {n} lanes, got False at positions "
                            f"{np.flatnonzero(~first).tolist()}")
        busy = lanes_arr[self._open[lanes_arr] >= 0]
        if busy.size:
            raise ValueError(f"add_first: lanes {busy.tolist()} have an episode in progress; call reset() first")
        obs = self._check(self._obs_fields, {"observation": timestep.observation}, n, "timestep.observation")
        with self.store.lock:
            rows = self._open_rows(lanes_arr, obs, first)
            empty = self._no_lanes
            self._emit(StepEvents(ended=empty, final_rows=empty, episode_starts=empty, terminated=first[:0],
                                  continued=empty, continued_rows=empty, continued_starts=empty, started=lanes_arr,
                                  started_rows=rows))

    def _add_first_compiled(self, timestep: TimeStep) -> bool:
        """:meth:`add_first` on every lane as a compiled :meth:`add` whose lanes all start an episode (the
        action columns of a starting lane are not read); False, having written nothing, when some lane
        has an episode in progress or the input needs the general path's checks."""
        n = self.num_lanes
        first = timestep.first
        if (self._open >= 0).any() or type(first) is not np.ndarray or first.shape != (n,) or not first.all():
            return False
        if self._start_columns is None:
            zero = self._top(_specs.zeros({**self._act_fields, **self._reward_fields, **self._extra_fields}, (n,)))
            self._start_columns = (zero["action"], zero["reward"], zero.get("extras"))
        actions, rewards, extras = self._start_columns
        no = np.zeros(n, bool)
        ts = TimeStep(timestep.observation, rewards, no, no, np.ones(n, bool), no)
        return self._add_compiled(actions, ts, extras)

    def truncate(self, lanes: Any = None) -> None:
        """End the episodes in progress (on ``lanes``, default all) as truncated at their open row.

        The open row's observation becomes the episode's final observation: its row gets ``last=True``
        (zero action and reward) and the row before it ``truncated=True``; items are written as for any
        truncated episode (bootstrapping from that observation). On a multi-agent store the agents active
        at that row are cut as an env's time limit cuts them (:meth:`_end_open_rows`), so the rows are
        those of an env that truncates at this step. For a run that stops collecting, this keeps the last
        transitions that :meth:`reset` would drop.
        """
        if self._staged:
            self.flush()
        lanes_arr = self._lanes if lanes is None else self._lane_subset(lanes)
        with self.store.lock:
            lanes_arr = lanes_arr[self._open[lanes_arr] >= 0]
            if not lanes_arr.size:
                return
            rows = self._open[lanes_arr].copy()
            starts = self._episode_start[lanes_arr].copy()
            self._end_open_rows(lanes_arr, rows)
            acted = rows > starts  # episodes with at least one action; the others are just dropped
            if acted.any():
                self.store.write(lanes_arr[acted], rows[acted] - 1, {"truncated": np.ones(int(acted.sum()), bool)},
                                 checked=False)
            self._open[lanes_arr] = -1
            empty = self._no_lanes
            ended = lanes_arr[acted]
            self._emit(StepEvents(ended=ended, final_rows=rows[acted], episode_starts=starts[acted],
                                  terminated=np.zeros(ended.size, bool), continued=empty, continued_rows=empty,
                                  continued_starts=empty, started=empty, started_rows=empty, final_was_open=True))
            if (~acted).any():
                self._abandon(lanes_arr[~acted])

    def _end_open_rows(self, lanes: np.ndarray, rows: np.ndarray) -> None:
        """Make the open ``rows`` of ``lanes`` final rows (:meth:`truncate`, :meth:`reset`): zero action,
        reward and extras, ``last=True``. On a multi-agent store (:class:`rlflow.envs.ParallelEnvironment`'s
        rows) the agents active at such a row are cut there as an env's time limit leaves them on its final
        observation: ``truncated`` set, ``active`` cleared, no legal action in ``action_mask``."""
        k = lanes.size
        cols = _specs.zeros({**self._act_fields, **self._reward_fields, **self._extra_fields}, (k,))
        if self._agent_active is not None and "observation/truncated" in self._obs_fields:
            obs = {n: v for n, v in self.store.gather(lanes, rows, checked=False).items() if n in self._obs_fields}
            cut = obs["observation/active"]
            obs["observation/truncated"] = obs["observation/truncated"] | cut
            mask = obs.get("observation/action_mask")
            if mask is not None and mask.shape[:cut.ndim] == cut.shape:
                mask[cut] = 0
            obs["observation/active"] = np.zeros_like(cut)
            cols.update(obs)
        self.store.write(lanes, rows, {**self._top(cols), "terminated": np.zeros(k, bool),
                                       "truncated": np.zeros(k, bool), "last": np.ones(k, bool)}, checked=False)

    def _lane_subset(self, lanes: Any) -> np.ndarray:
        arr = np.asarray(lanes)
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or (arr.size and (arr.min() < 0 or arr.max() >= self.num_lanes)):
            raise ValueError(f"lanes: expected distinct integers in [0, {self.num_lanes}), got {arr!r}")
        arr = arr.astype(np.int64)
        if np.unique(arr).size != arr.size:
            raise ValueError(f"lanes: expected distinct integers in [0, {self.num_lanes}), got {arr.tolist()}")
        return arr

    def add(self, actions: Any, next_timestep: TimeStep, extras: Any = None) -> None:
        """Record the actions taken on every lane and what followed (see :mod:`rlflow.types`).

        Lanes whose ``next_timestep`` only starts an episode (``first`` without ``last``) ignore their
        action. Raises, writing nothing, on input that does not match the store's spec or on a lane
        whose flags do not follow from its state (e.g. ``add`` before ``add_first``).
        """
        if self._staged:
            self.flush()
        ts = next_timestep
        n = self.num_lanes
        if self._agent_active is not None:
            actions = self._zero_inactive(actions)
        if self._add_compiled(actions, ts, extras):
            return
        first = _bool_lanes("first", ts.first, n)
        last = _bool_lanes("last", ts.last, n)
        terminated = _bool_lanes("terminated", ts.terminated, n)
        truncated = _bool_lanes("truncated", ts.truncated, n)
        if not np.array_equal(last, terminated | truncated):
            raise SpecError("timestep: expected last == terminated | truncated on every lane")
        is_open = self._open >= 0
        self._check_flow(is_open, first, last)
        self._precheck(is_open, first, last)
        acted = np.flatnonzero(is_open)
        row = {"action": actions, "reward": ts.reward, "terminated": terminated, "truncated": truncated}
        fields = {**self._act_fields, **self._reward_fields}
        if self._extra_fields:
            if extras is None:
                raise SpecError(f"add: the store has extras {list(self._extra_fields)}; pass extras=")
            row["extras"] = extras
            fields.update(self._extra_fields)
        elif extras is not None:
            raise SpecError("add: extras given, but the store's spec has no 'extras'")
        checked = self._check(fields, row, n, "add")
        checked["terminated"], checked["truncated"] = terminated, truncated
        opening = first | ~last
        obs = self._check(self._obs_fields, {"observation": ts.observation}, n, "timestep.observation") \
            if opening.any() else None
        ended = np.flatnonzero(last)
        final = None
        if ended.size:
            if ts.final_observation is None:
                raise SpecError(f"timestep: lanes {ended.tolist()} are last but final_observation is None")
            final = self._check(self._obs_fields, {"observation": ts.final_observation}, n,
                                "timestep.final_observation", rows=ended)
        # ---- every input is valid: write.
        store = self.store
        with store.lock:
            if acted.size:
                cols = checked if acted.size == n else {k: v[acted] for k, v in checked.items()}
                store.write(acted, self._open[acted], {**self._top(cols), "terminated": cols["terminated"],
                                                       "truncated": cols["truncated"]}, checked=False)
            events_end = self._close(ended, final, terminated[ended])
            continuing = np.flatnonzero(opening & ~first)
            started = np.flatnonzero(first)
            new_rows = self._open_rows(np.flatnonzero(opening), obs, first, select=True)
            starting = first[opening]
            self._emit(StepEvents(
                ended=ended, final_rows=events_end[0], episode_starts=events_end[1], terminated=terminated[ended],
                continued=continuing, continued_rows=new_rows[~starting],
                continued_starts=self._episode_start[continuing], started=started, started_rows=new_rows[starting]))

    def _zero_inactive(self, actions: Any, active: np.ndarray | None = None) -> Any:
        """``actions`` with zeros for the agents not active (``active`` ``[B, A]``; default: at each lane's
        open row), for multi-agent rows."""
        if active is None:
            rows = self._lanes * self.store.capacity + np.maximum(self._open, 0) % self.store.capacity
            active = self._agent_active[rows]  # [E, A]
        if active.all():
            return actions

        def zero(leaf: Any) -> Any:
            arr = np.asarray(leaf)
            if arr.shape[:2] != active.shape:
                return leaf  # the shape is wrong: the checks that follow name it
            return np.where(active.reshape(active.shape + (1,) * (arr.ndim - 2)), arr, np.zeros((), arr.dtype))

        return self._zero_inactive_leaf(zero, actions)

    @staticmethod
    def _zero_inactive_leaf(zero: Callable[[Any], Any], value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: Adder._zero_inactive_leaf(zero, v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(Adder._zero_inactive_leaf(zero, v) for v in value)
        return zero(value)

    def reset(self) -> None:
        """Abandon the episodes in progress: their open rows become final rows; no further items come from them."""
        if self._staged:
            self.flush()
        with self.store.lock:
            lanes = np.flatnonzero(self._open >= 0)
            if lanes.size:
                self._end_open_rows(lanes, self._open[lanes])
                self._open[lanes] = -1
                self._abandon(lanes)

    def _add_compiled(self, actions: Any, ts: TimeStep, extras: Any) -> bool:
        """The whole call in the compiled kernels, for inputs of exactly the stored dtypes and shapes.

        Returns False (having written nothing) whenever anything is unusual (a cast needed, a value out of
        bounds, flags that do not follow from the lanes' state); :meth:`add` then takes the general path,
        which also raises the precise errors.
        """
        n = self.num_lanes
        step = self._fast_step(actions, ts, extras)
        if step is None:
            return False
        cols, obs, final = step
        if not ts.last.any():
            final = obs  # no final row: the kernel reads no final observation
        elif final is None:
            return False
        store = self.store
        with store.lock:
            code, (old_lanes, old_rows), rows = self._scratch  # per-call outputs, read before the next call
            m = KA.plan_step(self._open, ts.first, ts.last, ts.terminated, ts.truncated, store.count, store.capacity,
                             code, old_lanes, old_rows)
            if m < 0:
                return False
            if type(self)._precheck is not Adder._precheck:
                self._precheck(self._open >= 0, ts.first, ts.last)
            if m and store._listeners:
                store._announce(old_lanes[:m], old_rows[:m])
            flat = store._flat
            obs_bytes = tuple(_row_bytes(obs[k], n)[None] for k in self._obs_names)
            final_bytes = obs_bytes if final is obs else tuple(_row_bytes(final[k], n)[None] for k in self._obs_names)
            KA.write_steps(code[None], ts.terminated[None], ts.truncated[None], self._open, self._episode_start,
                           store.count, store.episode_id, store.episode_step, store._next_episode, store._next_step,
                           store.capacity, self._act_cols, tuple(_row_bytes(cols[k], n)[None] for k in self._act_names),
                           self._obs_cols, obs_bytes, final_bytes, flat["terminated"], flat["truncated"], flat["first"],
                           flat["last"], rows, KA.NO_ITEMS, 1, *_NO_ITEMS)
            self._emit_lanes(code, rows[0, 0], rows[0, 1], rows[0, 2], ts.terminated)
        return True

    def _fast_step(self, actions: Any, ts: TimeStep, extras: Any) -> tuple[dict, dict, dict | None] | None:
        """A step's action columns, observations and final observations (None when not given) when every
        input is an array of exactly its stored dtype and shape, in bounds (flags: ``[E]`` bool); None
        otherwise (the general path then converts, or raises the precise error)."""
        n = self.num_lanes
        for flags in (ts.first, ts.last, ts.terminated, ts.truncated):
            if type(flags) is not np.ndarray or flags.dtype != np.bool_ or flags.shape != (n,):
                return None
        cols = self._fast_action_columns(actions, ts.reward, extras, n)
        obs: dict[str, np.ndarray] = {}
        if cols is None or not _fast_leaves(self._layout["observation"], ts.observation, n, obs):
            return None
        if ts.final_observation is None:
            return cols, obs, None
        final: dict[str, np.ndarray] = {}
        if not _fast_leaves(self._layout["observation"], ts.final_observation, n, final):
            return None
        return cols, obs, final

    def _fast_action_columns(self, actions: Any, rewards: Any, extras: Any, n: int) -> dict[str, np.ndarray] | None:
        """The action columns (action, reward, extras) of ``n`` rows when each is an array of exactly its
        stored dtype and shape, in bounds (:func:`rlflow.specs.fits`), with extras given iff the store has
        them; None otherwise (the caller then checks them the general way, which raises the precise error)."""
        layout = self._layout
        cols: dict[str, np.ndarray] = {}
        if ("extras" in layout) != (extras is not None):
            return None
        if not (_fast_leaves(layout["action"], actions, n, cols) and _fast_leaves(layout["reward"], rewards, n, cols)
                and (extras is None or _fast_leaves(layout["extras"], extras, n, cols))):
            return None
        return cols

    def _emit_lanes(self, code: np.ndarray, final_rows: np.ndarray, ended_starts: np.ndarray, new_rows: np.ndarray,
                    terminated: np.ndarray) -> None:
        """What :func:`~rlflow.adders._kernels.write_steps` did, per lane, as :class:`StepEvents` for :meth:`_emit`."""
        ended = np.flatnonzero((code == KA.END) | (code == KA.END_START))
        continued = np.flatnonzero(code == KA.CONTINUE)
        started = np.flatnonzero((code == KA.START) | (code == KA.END_START))
        self._emit(StepEvents(ended=ended, final_rows=final_rows[ended], episode_starts=ended_starts[ended],
                              terminated=terminated[ended], continued=continued, continued_rows=new_rows[continued],
                              continued_starts=self._episode_start[continued], started=started,
                              started_rows=new_rows[started]))

    # ------------------------------------------------------------------ subclass hooks
    def _emit(self, events: StepEvents) -> None:
        raise NotImplementedError

    def _precheck(self, is_open: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        """Raise, before anything is written, if this call's rows would break the subclass's limits."""

    def _abandon(self, lanes: np.ndarray) -> None:
        """Episodes of ``lanes`` were abandoned by :meth:`reset` (their pending items are dropped)."""

    # ------------------------------------------------------------------ helpers
    def _check_flow(self, is_open: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        bad = np.flatnonzero(~is_open & ~first)
        if bad.size:
            raise ValueError(f"add: lanes {bad.tolist()} have no episode in progress and the timestep does not start "
                             "one (call add_first with the reset timestep first)")
        bad = np.flatnonzero(is_open & first & ~last)
        if bad.size:
            raise ValueError(f"add: lanes {bad.tolist()} start a new episode while one is in progress and did not "
                             "end (last=False); call reset() to abandon an episode")

    def _check(self, fields: dict[str, Any], data: dict[str, Any], n: int, what: str,
               rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Validate ``data`` (top-level keys of the row) against ``fields``; flat columns out."""
        sub = {k: self.store.spec[k] for k in data}
        flat = _specs.flatten_data(sub, data)
        if rows is not None:  # only these lanes' rows matter (e.g. final observations)
            for name, value in flat.items():
                arr = np.asarray(value)
                if arr.shape[:1] != (n,):
                    raise SpecError(f"{what}: field {name!r}: expected a leading axis of {n} lanes, got {arr.shape}")
                flat[name] = arr[rows]
            n = rows.size
        try:
            return _specs.validate(fields, flat, (n,))
        except SpecError as exc:
            raise SpecError(f"{what}: {exc}") from None

    def _top(self, flat: dict[str, np.ndarray]) -> dict[str, Any]:
        """Flat columns back into top-level keys of the row (nested parts unflattened)."""
        out: dict[str, Any] = {}
        for key in ("observation", "action", "reward", "extras"):
            if key in self.store.spec and any(_under(n, key) for n in flat):
                out[key] = _specs.unflatten(self.store.spec[key], flat, key)
        return out

    def _open_rows(self, lanes: np.ndarray, obs: dict[str, np.ndarray] | None, first: np.ndarray, *,
                   select: bool = False) -> np.ndarray:
        """Append each lane's observation as a new open row; ``first`` marks new episodes."""
        if not lanes.size:
            return lanes
        if select and lanes.size < self.num_lanes:
            obs = {k: v[lanes] for k, v in obs.items()}  # type: ignore[union-attr]
            first = first[lanes]
        elif select:
            first = first.copy()
        data = {**self._top(obs), "first": first, "last": np.zeros(lanes.size, bool)}  # type: ignore[arg-type]
        rows = self.store.append(data, lanes=lanes, first=first, checked=False, partial=True)
        self._open[lanes] = rows
        self._episode_start[lanes[first]] = rows[first]
        return rows

    def _close(self, lanes: np.ndarray, final: dict[str, np.ndarray] | None,
               terminated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write the final-observation rows of ``lanes``; return them and their episodes' first rows."""
        if not lanes.size:
            return lanes, lanes
        zero = _specs.zeros({**self._act_fields, **self._reward_fields, **self._extra_fields}, (lanes.size,))
        k = lanes.size
        data = {**self._top({**final, **zero}), "terminated": np.zeros(k, bool),  # type: ignore[dict-item]
                "truncated": np.zeros(k, bool), "first": np.zeros(k, bool), "last": np.ones(k, bool)}
        rows = self.store.append(data, lanes=lanes, first=np.zeros(k, bool), checked=False)
        starts = self._episode_start[lanes].copy()
        self._open[lanes] = -1
        return rows, starts

    def _insert(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                fields: dict[str, np.ndarray] | None) -> None:
        """Insert the items into every table, with each table's priorities. Every priority function is
        called, and its priorities checked, before any table takes an item: a bad one raises, naming its
        table, and no table receives the items."""
        if not lanes.size:
            return
        if self._ones.size < lanes.size:
            self._ones = np.ones(2 * lanes.size, np.float64)
        prios = [self._ones[:lanes.size]] * len(self.tables)  # priority 1 (read only)
        if self.priority_fns:
            batch = self._batch_of(lanes, starts, lengths, fields)
            for i, table in enumerate(self.tables):
                fn = self.priority_fns.get(table.name)
                if fn is not None:
                    try:
                        prios[i] = _check_priorities(fn(batch), lanes.size)
                    except ValueError as e:
                        raise ValueError(f"the priority function of table {table.name!r}: {e}; no table took "
                                         f"these {lanes.size} items") from e
        for table, p in zip(self.tables, prios, strict=True):
            # The adder built the windows and fields itself, and the priorities are checked: no conversion.
            table._insert_checked(lanes, starts, lengths, p, fields or {}, None)

    def _batch_of(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  fields: dict[str, np.ndarray] | None) -> Any:
        """New items shaped as a sample of the tables would shape them (for priority functions)."""
        meta = np.zeros((lanes.size, 6), np.int64)
        meta[:, LANE], meta[:, START], meta[:, LENGTH] = lanes, starts, lengths
        valid = np.empty(lanes.size, np.int64)
        KI.check_windows(self.store.count, self.store.episode_id, self.store.capacity, lanes, starts, lengths,
                         self.tables[0].cross_episodes, valid)
        meta[:, VALID] = valid
        return self.view.gather(self.store, meta, fields or {})[0]

    # ------------------------------------------------------------------ checkpoint state
    def _lane_state(self) -> dict[str, np.ndarray]:
        """The per-lane arrays (``[E]`` int64) that decide the rows and items still to come; subclasses add theirs."""
        return {"open": self._open, "episode_start": self._episode_start}

    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the rows and items still to come: the lanes' open rows, episode starts
        and the subclass's per-lane positions (e.g. a sequence's next start), the steps :meth:`stage` holds
        (not written: taking the state changes nothing), and under ``"items"`` the settings that shape
        items (the view's :meth:`~rlflow.replay.views.ItemView.config`). Restore with
        :meth:`load_state_dict` into an adder built with the same settings on the restored store."""
        staged = self._staged_state() if self._staged else None
        return {**{k: v.copy() for k, v in self._lane_state().items()}, "staged": staged,
                "items": self.view.config()}

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise :class:`~rlflow.replay.checkpoint.CheckpointError` if :meth:`load_state_dict` would refuse
        ``state``: a setting that shapes items differs (named, with both values), or a lane array is
        missing or of another shape. Changes nothing."""
        from rlflow.replay.checkpoint import CheckpointError

        saved = state.get("items")
        if not isinstance(saved, Mapping):
            raise CheckpointError(f"adder state: expected the settings of its items under 'items', got {saved!r}")
        mine = self.view.config()
        setting = other_setting(mine, saved)
        if setting is not None:
            key, value, theirs = setting
            raise CheckpointError(
                f"adder setting {key!r}: the checkpoint's items were written with {key}={theirs!r}, this "
                f"{type(self).__name__} has {key}={value!r} (its items: {mine}); build the adder with the "
                "checkpoint's settings, or start a new run")
        for key in self._lane_state():
            arr = np.asarray(state.get(key, ()))
            if arr.shape != (self.num_lanes,) or arr.dtype.kind not in "iu":
                raise CheckpointError(f"adder state {key!r}: expected {self.num_lanes} integers (one per lane), "
                                      f"got {arr.dtype} {arr.shape}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the store and tables as they were when it was taken; checked
        first by :meth:`check_state`: a refusal changes nothing); steps staged now are dropped in favour of
        the saved ones."""
        self.check_state(state)
        self._load_staged(state.get("staged"))
        for key, arr in self._lane_state().items():
            arr[...] = np.asarray(state[key], np.int64)

    def _staged_state(self) -> dict[str, Any]:
        """The steps :meth:`stage` holds, as plain arrays (adders that stage)."""
        raise NotImplementedError

    def _load_staged(self, state: Mapping[str, Any] | None) -> None:
        """Hold the steps of :meth:`_staged_state`'s output (None: none) as :meth:`stage` held them."""
        if state is not None:
            raise ValueError(f"adder state: {type(self).__name__} stages no steps, got {state.get('steps')} staged")
