"""The adder base: turns a batched TimeStep stream into step rows, and tells its subclass what changed.

Every adder writes rows the same way (the boundary model of :mod:`rlflow.types`):

- a lane's observation becomes a row when it arrives (``first`` marks a new episode's first row); the
  row stays *open* until the next :meth:`Adder.add` fills in the action taken from it, the reward and
  the ``terminated``/``truncated`` flags received after it, and the extras;
- when an episode ends, its true final observation becomes one more row (``last=True``, zero action,
  zero reward), so an episode of ``T`` actions is ``T + 1`` rows and ``next_observation`` is always the
  next row, stored once;
- every input is checked before anything is written: a bad call raises and changes nothing.

One path writes every step: a call's steps are put into a :class:`~rlflow.adders.StepBlock` (checked
there), the block writer writes the block's rows lane by lane (the tables first drop the items of the
rows it overwrites), and the subclass turns the written rows into items (:meth:`Adder._make_items`),
which every table takes in one :meth:`~rlflow.replay.Table.insert_many`. Subclasses
(:class:`~rlflow.adders.NStepTransition`, :class:`~rlflow.adders.Sequence`,
:class:`~rlflow.adders.Episode`) decide which windows of rows become items.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow import _core
from rlflow import specs as _specs
from rlflow.adders.block import StepBlock, bool_lanes
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase, check_priorities
from rlflow.replay.views import ItemView, other_setting
from rlflow.specs import SpecError
from rlflow.types import TimeStep

__all__ = ["Adder", "PriorityFn", "StepEvents"]

PriorityFn = Callable[[Any], Any]
# What a written step did on a lane (the block writer's codes, _core.StepKind).
_CONTINUE, _END, _END_START, _START = (kind.value for kind in _core.StepKind)
_ROW_KEYS = ("observation", "action", "reward", "terminated", "truncated", "first", "last")


@dataclass
class StepEvents:
    """What one written step did, per lane group (all arrays int64 or bool, one entry per lane).

    Attributes:
        ended: lanes whose episode ended in this step.
        final_rows: the final-observation row of each ended lane.
        episode_starts: the first row of each ended episode.
        terminated: whether each ended episode terminated (else it was truncated).
        continued: lanes whose episode goes on with a new open row.
        continued_rows: that new row, per continued lane.
        continued_starts: the first row of each continued lane's episode.
        started: lanes that started an episode in this step.
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


class Adder:
    """Writes a batched TimeStep stream into a store's lanes; subclasses turn rows into items.

    ``max_items_per_step``: the most items one :meth:`add` call writes per lane (what a loop must let
    the tables admit before each env step). ``stage_steps``: the most steps :meth:`stage` holds before
    it writes them as one block (1: every step is written at once).

    Args:
        store: the step rows (its spec from :func:`rlflow.types.step_spec`); one lane per env stream.
        tables: the tables that receive every item (each on ``store``).
        view: how those tables shape sampled items (set on each table).
        item_spec: the item fields the subclass writes (set on each table).
        priority_fns: per table name, a function of the batch of new items (shaped like a sample of the
            table) returning their priorities; tables without one give new items priority 1.
        min_capacity: rows per lane the store needs so that every item is still stored when it is written
            (its window, plus the rows one call writes after the window's first row).
        stage_steps: the steps :meth:`stage` may hold (capped so that a block's rows never overwrite rows
            of its own items).
    """

    max_items_per_step = 1
    rows_kept_per_lane = 0  # rows of a lane that never hold an item's first row (0: no bound is known)

    def __init__(self, store: StepStore, tables: Sequence[TableBase], *, view: ItemView, item_spec: Any,
                 priority_fns: Mapping[str, PriorityFn] | None, min_capacity: int, stage_steps: int = 1) -> None:
        if any(k not in store.spec for k in _ROW_KEYS):
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
        min_capacity += store.stack_reach  # the rows before an item's first row that its frame stacks read
        if store.capacity < min_capacity:
            raise ValueError(f"this adder needs a store of at least {min_capacity} rows per lane, "
                             f"got capacity {store.capacity}")
        self._check_reachable_sizes(store, tables)
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
        self._open = np.full(self.num_lanes, -1, np.int64)  # the lane's open row (action pending), or -1
        self._episode_start = np.full(self.num_lanes, -1, np.int64)
        self._lanes = np.arange(self.num_lanes)
        fields = store.fields
        self._act_names = [n for n in fields if _under(n, "action") or n == "reward" or _under(n, "extras")]
        self._obs_names = [n for n in fields if _under(n, "observation")]
        self._bind_store()
        # A block never overwrites rows of its own items: its rows (at most two a step) and the rows its
        # items reach back (min_capacity) fit in a lane.
        self.max_block_steps = max(1, (store.capacity - min_capacity) // 2)
        self.stage_steps = min(max(1, int(stage_steps)), self.max_block_steps)
        self._block = StepBlock(store.spec, self._lanes, self.stage_steps)
        self._plan = _Plan(self.num_lanes, self.stage_steps)
        self._multi_agent = self._block.multi_agent
        self._ones = np.ones(self.num_lanes, np.float64)  # priority 1 for new items (read only)

    def _check_reachable_sizes(self, store: StepStore, tables: Sequence[TableBase]) -> None:
        """Raise ValueError if a table's rate limiter waits for more items than the store can hold at once
        (its samples would never start): with ``rows_kept_per_lane`` set, a lane holds at most ``capacity -
        rows_kept_per_lane - stack_reach`` of this adder's items (an item's later rows and the rows its frame
        stacks read stay stored with it)."""
        if not self.rows_kept_per_lane:
            return
        kept = self.rows_kept_per_lane + store.stack_reach
        most = store.num_lanes * (store.capacity - kept)
        for table in tables:
            wanted = table.rate_limiter.min_size_to_sample
            if wanted > most:
                rows = -(-wanted // store.num_lanes) + kept
                raise ValueError(
                    f"table {table.name!r} samples once it holds {wanted} items (its rate limiter's "
                    f"min_size_to_sample), but this adder's items in a store of {store.capacity} rows a lane "
                    f"({store.num_lanes} lanes) are at most {most} at once: each keeps {kept} more rows of its "
                    f"lane stored (its window's later rows and the rows its frame stacks read); give the store "
                    f"at least {rows} rows a lane (capacity) or lower min_size_to_sample")

    def _bind(self) -> None:
        """Derive the views of the store the adder reads, when unpickled; a subclass adds what its item maker
        reads."""
        self._bind_store()

    def _bind_store(self) -> None:
        """The compiled block writer over the store's columns and this adder's lane state."""
        self._writer = self.store.block_writer(self._act_names, self._obs_names, self._open, self._episode_start)

    def __getstate__(self) -> dict[str, Any]:
        """The adder with its store and tables (see :class:`~rlflow.replay.StepStore`'s pickling), less what
        :meth:`_bind` derives."""
        return {k: v for k, v in self.__dict__.items() if k not in self._derived}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind()

    _derived: tuple[str, ...] = ("_writer",)

    # ------------------------------------------------------------------ the Acme-style interface
    def add_first(self, timestep: TimeStep, lanes: Any = None) -> None:
        """Start an episode on every lane, or on ``lanes`` (``timestep`` then leads with ``len(lanes)``).

        ``timestep`` comes from ``env.reset()``: every lane ``first``. The lanes must have no episode in
        progress (end it, or call :meth:`reset` or :meth:`truncate`).
        """
        lanes_arr = self.store.check_lanes(lanes)
        n = lanes_arr.size
        first = bool_lanes("first", timestep.first, n, subset=lanes is not None)
        if not first.all():
            raise SpecError(f"add_first: expected first=True on all {n} lanes, got False at positions "
                            f"{np.flatnonzero(~first).tolist()}")
        block = self._block
        if block.steps and block.ended_last(lanes_arr).all():
            # Every lane's episode ended at the last staged step: that step also starts the next one, as
            # an env that resets in the same step.
            block.restart(lanes_arr, timestep.observation)
            return
        self.flush()
        busy = lanes_arr[self._open[lanes_arr] >= 0]
        if busy.size:
            raise ValueError(f"add_first: lanes {busy.tolist()} have an episode in progress; call reset() first")
        no = np.zeros(n, bool)
        if lanes is not None:
            block = StepBlock(self.store.spec, lanes_arr, 1, subset=True)
            block.start(no)
        ts = TimeStep(timestep.observation, block.reward_zeros(), no, no, first, no)
        if lanes is None:
            self.add(block.act_zeros(), ts, block.extras_zeros())
            return
        block.put(block.act_zeros(), ts, block.extras_zeros())
        self.write(block)

    def add(self, actions: Any, next_timestep: TimeStep, extras: Any = None) -> None:
        """Record the actions taken on every lane and what followed (see :mod:`rlflow.types`).

        Lanes whose ``next_timestep`` only starts an episode (``first`` without ``last``) ignore their
        action. Raises, writing nothing, on input that does not match the store's spec or on a lane
        whose flags do not follow from its state (e.g. ``add`` before ``add_first``).
        """
        self.stage(actions, next_timestep, extras)
        self.flush()

    def stage(self, actions: Any, next_timestep: TimeStep, extras: Any = None) -> None:
        """:meth:`add`, possibly held back: the step is checked now and written with the steps staged before
        it when ``stage_steps`` are held, or at the next :meth:`flush`.

        Held steps are not in the store or its tables until then: call :meth:`flush` before anything
        reads them (``rlflow.run`` does, and every other method of the adder flushes first). Bad input
        raises, and the steps staged before it stay staged.
        """
        self.staging()
        self._block.put(actions, next_timestep, extras)
        if self._block.steps == self.stage_steps:
            self.write(self._block)

    def staging(self) -> _core.StepBlockCore:
        """For a caller that puts a step into the staged block's filler itself (``ReplayBuffer.add`` does, in the
        same compiled call that sorts it): the filler, the block started and the step prechecked as
        :meth:`stage` does. When the filler took the step (it counts it), call :meth:`staged`."""
        block = self._block
        if not block.steps:
            block.start(self._open >= 0, self._active_at_open_rows(), self.open_stacks())
        self._precheck(block)
        return block.filler

    def staged(self, *, write: bool) -> None:
        """The filler took a step from :meth:`staging`: write the block when it holds ``stage_steps`` steps, or
        now if ``write`` (as :meth:`add` does)."""
        if write or self._block.steps == self.stage_steps:
            self.write(self._block)

    def flush(self) -> None:
        """Write the steps :meth:`stage` holds, and their items, as one block."""
        if self._block.steps:
            self.write(self._block)

    @property
    def staged_steps(self) -> int:
        """The steps :meth:`stage` holds, not yet written."""
        return self._block.steps

    def open_stacks(self, lanes: np.ndarray | None = None) -> dict[str, np.ndarray] | None:
        """Stacked stores: the frame stacks of the open rows of ``lanes`` (default all; any row for a lane with
        none), per stacked observation column, which the lanes' next rows must continue; else None."""
        if not self.store.stack_reach:
            return None
        lanes = self._lanes if lanes is None else lanes
        rows = lanes * self.store.capacity + np.maximum(self._open[lanes], 0) % self.store.capacity
        return {name: self.store.take_column(name, rows) for name in self._block.stacked}

    def _active_at_open_rows(self) -> np.ndarray | None:
        """Multi-agent rows: the agents active at each lane's open row (``[E, A]``); else None."""
        if not self._multi_agent:
            return None
        rows = self._lanes * self.store.capacity + np.maximum(self._open, 0) % self.store.capacity
        return self.store.take_column("observation/active", rows)

    # ------------------------------------------------------------------ the one write path
    def write(self, block: StepBlock) -> None:
        """Write ``block``'s steps: the tables drop the items of the rows it overwrites, its rows are
        written lane by lane, and its items go to every table (:meth:`_make_items`). The block is empty
        afterwards (its arrays still hold what was written until the next step is put). A block longer than
        ``max_block_steps`` is written in parts of that many steps: a part never overwrites rows of its own
        items."""
        t = block.steps
        for a in range(0, t, self.max_block_steps):
            self._write_steps(block, a, min(a + self.max_block_steps, t))

    def _write_steps(self, block: StepBlock, a: int, z: int) -> None:
        """Write steps ``a .. z - 1`` of ``block`` (see :meth:`write`)."""
        store = self.store
        steps = z - a
        plan = self._plan.fit(block.num_lanes, steps)
        if block.num_lanes == self.num_lanes:
            self._plan = plan  # kept for the next block of every lane
        writer = self._writer
        with store.lock:
            fault = writer.plan(block.filler, a, steps, plan.codes, plan.new_rows, plan.ranges)
            if fault is _core.PlanFault.FLOW:  # each step was checked against the one before: a broken invariant
                raise RuntimeError(f"write: step {writer.fault_step} of {block!r} does not follow from its lanes' "
                                   "state")
            if fault is not _core.PlanFault.OK:  # each step's stacks were checked when put: a block made elsewhere
                raise RuntimeError(f"write: {self._stack_error(fault, block)}")
            store.notify_overwrite(plan.ranges[:writer.overwritten_lanes])
            writer.write(block.filler, a, steps, plan.codes, plan.rows)
            if z == block.steps:  # the rows are written: the block is spent, whatever its items do
                block.steps = 0
            self._make_items(a, steps, plan.codes, plan.rows, block.terminated, block.lanes)

    def _stack_error(self, fault: _core.PlanFault, block: StepBlock) -> SpecError:
        """The error of the block writer's stack ``fault`` (where: the writer's ``fault_*``)."""
        name = self._obs_names[self._writer.fault_column]
        k = self.store.fields[name].stack
        where = (f"timestep.observation: field {name!r} (stacks of {k} frames) of lane "
                 f"{int(block.lanes[self._writer.fault_lane])}")
        dropped = "; nothing was written"
        if fault is _core.PlanFault.STACK_START:
            return SpecError(f"{where} starts an episode with a stack that is not its first frame repeated {k} times, "
                             f"as gymnasium's FrameStackObservation(env, {k}) (padding_type='reset', its default) "
                             f"gives it{dropped}")
        return SpecError(f"{where}: the stack does not continue the stack before it in its episode (its frames "
                         f"0..{k - 2} must be that stack's frames 1..{k - 1}): stack the frames on axis 0 with "
                         f"gymnasium's FrameStackObservation(env, {k}), or declare the field without stack={dropped}")

    def _make_items(self, a: int, steps: int, codes: np.ndarray, rows: np.ndarray, terminated: np.ndarray,
                    lanes: np.ndarray) -> None:
        """Turn the written steps ``a .. a + steps - 1`` (codes and rows of
        the block writer's ``write``, from step ``a`` on; ``terminated`` the block's; block lanes
        ``lanes``) into items: here each step as :class:`StepEvents` for :meth:`on_step`."""
        for s in range(steps):
            code, final, episode, new = codes[s], rows[s, 0], rows[s, 1], rows[s, 2]
            ended = np.flatnonzero((code == _END) | (code == _END_START))
            continued = np.flatnonzero(code == _CONTINUE)
            started = np.flatnonzero((code == _START) | (code == _END_START))
            self.on_step(StepEvents(ended=lanes[ended], final_rows=final[ended], episode_starts=episode[ended],
                                    terminated=terminated[a + s, ended], continued=lanes[continued],
                                    continued_rows=new[continued], continued_starts=episode[continued],
                                    started=lanes[started], started_rows=new[started]))

    # ------------------------------------------------------------------ ending episodes
    def truncate(self, lanes: Any = None) -> None:
        """End the episodes in progress (on ``lanes``, default all) as truncated at their open row.

        The open row's observation becomes the episode's final observation: its row gets ``last=True``
        (zero action and reward) and the row before it ``truncated=True``; items are written as for any
        truncated episode (bootstrapping from that observation). On a multi-agent store the agents active
        at that row are cut as an env's time limit cuts them (:meth:`_end_open_rows`), so the rows are
        those of an env that truncates at this step. For a run that stops collecting, this keeps the last
        transitions that :meth:`reset` would drop. An episode with no action yet (only its first row) is
        dropped: its row becomes a final row and no item of its own is written (a Sequence adder with
        ``CONTINUE`` runs its sequences on across that row, as across any episode end).
        """
        self.flush()
        lanes_arr = self.store.check_lanes(lanes)
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
            empty = lanes_arr[:0]
            ended = lanes_arr[acted]
            self.on_step(StepEvents(ended=ended, final_rows=rows[acted], episode_starts=starts[acted],
                                    terminated=np.zeros(ended.size, bool), continued=empty, continued_rows=empty,
                                    continued_starts=empty, started=empty, started_rows=empty, final_was_open=True))
            if (~acted).any():
                self.on_dropped(lanes_arr[~acted])

    def reset(self) -> None:
        """Abandon the episodes in progress: their open rows become final rows; no further items come from them."""
        self.flush()
        with self.store.lock:
            lanes = np.flatnonzero(self._open >= 0)
            if lanes.size:
                self._end_open_rows(lanes, self._open[lanes])
                self._open[lanes] = -1
                self.on_abandon(lanes)

    def _end_open_rows(self, lanes: np.ndarray, rows: np.ndarray) -> None:
        """Make the open ``rows`` of ``lanes`` final rows (:meth:`truncate`, :meth:`reset`): zero action,
        reward and extras, ``last=True``. On a multi-agent store (:class:`rlflow.envs.ParallelEnvironment`'s
        rows) the agents active at such a row are cut there as an env's time limit leaves them on its final
        observation: ``truncated`` set, ``active`` cleared, no legal action in ``action_mask``."""
        k = lanes.size
        fields = self.store.fields
        cols: dict[str, np.ndarray] = _specs.zeros({n: fields[n] for n in self._act_names}, (k,))
        if self._multi_agent and "observation/truncated" in fields:
            obs = {n: v for n, v in self.store.gather(lanes, rows, checked=False).items() if n in self._obs_names}
            cut = obs["observation/active"]
            obs["observation/truncated"] = obs["observation/truncated"] | cut
            mask = obs.get("observation/action_mask")
            if mask is not None and mask.shape[:cut.ndim] == cut.shape:
                mask[cut] = 0
            obs["observation/active"] = np.zeros_like(cut)
            cols.update(obs)
        self.store.write(lanes, rows, {**self.top(cols), "terminated": np.zeros(k, bool),
                                       "truncated": np.zeros(k, bool), "last": np.ones(k, bool)}, checked=False)

    # ------------------------------------------------------------------ subclass hooks
    def on_step(self, events: StepEvents) -> None:
        """Make the items of one written step: ``events`` says, per lane, which episodes ended (their first and
        final rows, terminated or truncated), which go on (their new open row) and which started. A subclass
        turns these rows into items with :meth:`insert_items`; rows stay stored while items may reach them
        (the store holds ``min_capacity`` rows a lane, given to this class's constructor)."""
        raise NotImplementedError(f"{type(self).__name__}.on_step: an adder turns each written step's rows into "
                                  "items (see docs/extending.md)")

    def _precheck(self, block: StepBlock) -> None:
        """Raise, before the step is put, if its rows would break the subclass's limits."""

    def on_abandon(self, lanes: np.ndarray) -> None:
        """Episodes of ``lanes`` were abandoned by :meth:`reset` (their pending items are dropped)."""

    def on_dropped(self, lanes: np.ndarray) -> None:
        """:meth:`truncate` dropped the episodes of ``lanes``, which had no action yet (their one row is a final
        row now): by default as :meth:`on_abandon`."""
        self.on_abandon(lanes)

    # ------------------------------------------------------------------ helpers
    def top_observation(self, flat: dict[str, np.ndarray]) -> Any:
        """Flat observation columns back into the spec's nesting of an observation."""
        return self.top(flat)["observation"]

    def top(self, flat: dict[str, np.ndarray]) -> dict[str, Any]:
        """Flat columns back into top-level keys of the row (nested parts unflattened)."""
        spec = self.store.spec
        keys = {name.partition("/")[0] for name in flat}  # the top-level keys the columns belong to
        return {key: _specs.unflatten(spec[key], flat, key) for key in ("observation", "action", "reward", "extras")
                if key in keys and key in spec}

    def insert_items(self, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                     fields: dict[str, np.ndarray] | None, priorities: np.ndarray | None = None) -> None:
        """The one way items enter the tables: item ``i`` is the window of ``lengths[i]`` stored rows of lane
        ``lanes[i]`` from row ``starts[i]`` (int64 arrays), with its item ``fields`` (one array per field of the
        item spec, leading with the items; None when it has none). Each table gives the items its priority
        function's priorities, else ``priorities`` (float64, one per item; None: 1).

        Every priority is computed and checked before any table takes an item: a bad one raises, naming its
        table, and no table receives the items. A subclass calls this from :meth:`on_step`, or overrides it to
        keep, drop or relabel the items another adder makes (calling ``super().insert_items``); the arrays it
        is given may be views the next step overwrites (every table copies what it keeps).
        """
        if not lanes.size:
            return
        if priorities is None:
            if self._ones.size < lanes.size:
                self._ones = np.ones(2 * lanes.size, np.float64)
            given = self._ones[:lanes.size]  # priority 1 (read only)
        else:
            given = check_priorities(priorities, lanes.size)
        prios = [given] * len(self.tables)
        if self.priority_fns:
            batch = self.tables[0].preview(lanes, starts, lengths, fields or {})  # shaped as a sample
            for i, table in enumerate(self.tables):
                fn = self.priority_fns.get(table.name)
                if fn is not None:
                    try:
                        prios[i] = check_priorities(fn(batch), lanes.size)
                    except ValueError as e:
                        raise ValueError(f"the priority function of table {table.name!r}: {e}; no table took "
                                         f"these {lanes.size} items") from e
        for table, p in zip(self.tables, prios, strict=True):
            # The adder built the windows and fields itself, and the priorities are checked: no conversion.
            table.insert_many(lanes, starts, lengths, p, fields or {})

    # ------------------------------------------------------------------ checkpoint state
    def lane_state(self) -> dict[str, np.ndarray]:
        """The per-lane arrays (``[E]`` int64) that decide the rows and items still to come, which
        :meth:`state_dict` saves and :meth:`load_state_dict` restores in place; a subclass adds its own (e.g. a
        sequence's next start). State of another shape (a random generator) is added by overriding
        :meth:`state_dict` and :meth:`load_state_dict`."""
        return {"open": self._open, "episode_start": self._episode_start}

    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the rows and items still to come: the lanes' open rows, episode starts
        and the subclass's per-lane positions (e.g. a sequence's next start), the steps :meth:`stage` holds
        (not written: taking the state changes nothing), and under ``"items"`` the settings that shape
        items (the view's :meth:`~rlflow.replay.views.ItemView.config`). Restore with
        :meth:`load_state_dict` into an adder built with the same settings on the restored store."""
        staged = self._staged_state() if self._block.steps else None
        return {**{k: v.copy() for k, v in self.lane_state().items()}, "staged": staged,
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
        for key in self.lane_state():
            arr = np.asarray(state.get(key, ()))
            if arr.shape != (self.num_lanes,) or arr.dtype.kind not in "iu":
                raise CheckpointError(f"adder state {key!r}: expected {self.num_lanes} integers (one per lane), "
                                      f"got {arr.dtype} {arr.shape}")
        staged = state.get("staged")
        if staged is not None:
            try:
                self._block.check_state(staged)
            except (ValueError, TypeError, KeyError) as exc:
                raise CheckpointError(f"adder state: {exc}; build the adder as the checkpointed run did") from None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the store and tables as they were when it was taken; checked
        first by :meth:`check_state`: a refusal changes nothing); steps staged now are dropped in favour of
        the saved ones."""
        self.check_state(state)
        for key, arr in self.lane_state().items():
            arr[...] = np.asarray(state[key], np.int64)
        self._load_staged(state.get("staged"))

    def _staged_state(self) -> dict[str, Any]:
        """The steps :meth:`stage` holds, as plain arrays."""
        return self._block.state_dict()

    def _load_staged(self, state: Mapping[str, Any] | None) -> None:
        """Hold the steps of :meth:`_staged_state`'s output (None: none) as :meth:`stage` held them."""
        if state is None:
            self._block.start(self._open >= 0, self._active_at_open_rows(), self.open_stacks())
            return
        self._block.load_state_dict(state)


class _Plan:
    """The block writer's outputs for up to ``E`` lanes x ``T`` steps: each step's kind per lane, the rows
    each lane writes, and per step and lane the final, episode-start and new rows."""

    def __init__(self, lanes: int, steps: int) -> None:
        self.codes = np.zeros((steps, lanes), np.int8)  # _core.StepKind values
        self.new_rows = np.zeros(lanes, np.int64)
        self.rows = np.zeros((steps, 3, lanes), np.int64)
        self.ranges = np.zeros((lanes, 3), np.int64)  # (lane, lo, hi) of the rows the block overwrites

    def fit(self, lanes: int, steps: int) -> _Plan:
        """These outputs when they fit a block of ``lanes`` x ``steps``, else new ones of that size."""
        if self.codes.shape[1] == lanes and self.codes.shape[0] >= steps:
            return self
        return _Plan(lanes, steps)
