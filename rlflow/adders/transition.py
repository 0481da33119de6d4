"""N-step transitions: one item per action taken, a window of the rows it spans.

For the action taken at row ``t`` of an episode with ``T`` actions (rows ``0 .. T``, row ``T`` the final
observation), let ``k = min(n, T - t)``. The item is the window of rows ``t .. t + k`` and its fields
are::

    return   = r_t + g r_{t+1} + ... + g^(k-1) r_{t+k-1}
    discount = 0       if the window ends on the final row of a terminated episode
               g^k     otherwise (mid-episode, and on truncation: bootstrap from the true final observation)

so the learner's target is ``return + discount * Q(next_observation)``. ``n = 1`` gives plain
transitions. Every action yields exactly one item (no extra short windows at episode starts), and
observations are never copied per transition: ``next_observation`` is row ``t + k``.

Worked example (``n = 3``, ``g = 0.9``), an episode of four actions with rewards ``1, 2, 3, 4`` that
terminates::

    start t   rows      return                         discount
    0         0..3      1 + .9*2 + .81*3    = 5.23      .729
    1         1..4      2 + .9*3 + .81*4    = 7.94      0      (ends on the terminal row)
    2         2..4      3 + .9*4            = 6.6       0
    3         3..4      4                   = 4         0

Had the episode been truncated instead, the last three discounts would be ``.729, .81, .9``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from rlflow import _core
from rlflow.adders.base import Adder, PriorityFn, StepEvents
from rlflow.adders.block import StepBlock
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase
from rlflow.replay.views import TransitionView
from rlflow.specs import Field, SpecError

__all__ = ["NStepTransition"]

_BLOCK_BYTES = 32 << 20  # the most memory the staged steps take (observations twice: next and final)


class NStepTransition(Adder):
    """Writes n-step transition items (see the module docstring for the exact semantics).

    Args:
        store: the step rows (spec from :func:`rlflow.types.step_spec`), one lane per env stream.
        tables: tables receiving every transition; sampling them returns
            :class:`~rlflow.replay.views.Transition` batches.
        n: rewards summed per transition (``n >= 1``).
        discount: the per-step discount ``g`` in ``[0, 1]``.
        priority_fns: per table name, ``fn(transitions) -> priorities`` for new items (default 1).
        stage_steps: the most steps :meth:`stage` holds before it writes them as one block; capped so
            that a block never overwrites rows of its own items (``(capacity - n - 2) // 2``) and its
            buffers (every lane's action columns, observations and final observations) stay within 32 MiB.
    """

    def __init__(self, store: StepStore, tables: Sequence[TableBase], *, n: int = 1, discount: float = 0.99,
                 priority_fns: Mapping[str, PriorityFn] | None = None, stage_steps: int = 64) -> None:
        if int(n) != n or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n}")
        if int(stage_steps) != stage_steps or stage_steps < 1:
            raise ValueError(f"stage_steps must be an integer >= 1, got {stage_steps}")
        if not 0.0 <= float(discount) <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        self.n = int(n)
        self.max_items_per_step = self.n  # an episode's end completes up to n windows at once
        self.rows_kept_per_lane = self.n  # an item's n later rows
        self.discount = float(discount)
        reward = store.fields.get("reward")
        item_spec = {"return": Field(reward.shape if reward is not None else (), np.float32),
                     "discount": Field((), np.float32)}
        step_bytes = store.num_lanes * sum((2 if name.startswith("observation") else 1) * f.nbytes
                                           for name, f in store.fields.items())
        stage_steps = min(int(stage_steps), max(1, _BLOCK_BYTES // max(1, step_bytes)))
        super().__init__(store, tables, view=self._item_view(), item_spec=item_spec, priority_fns=priority_fns,
                         min_capacity=self.n + 2, stage_steps=stage_steps)
        self._reward_shape = store.fields["reward"].shape
        self._out = _items_out(self.n * self.num_lanes * self.stage_steps, int(np.prod(self._reward_shape)))
        self._bind_rule()
        self._lane_blocks: dict[int, StepBlock] = {}  # lane_block's, by slot

    _derived = ("_writer", "_rule")

    def _bind(self) -> None:
        super()._bind()
        self._bind_rule()

    def _bind_rule(self) -> None:
        """The compiled n-step rule on the store's rewards (a view), writing into the items' output buffers."""
        self._rule = _core.NStepItems(rewards=self.store.column_rows("reward"), capacity=self.store.capacity,
                                      powers=self.discount ** np.arange(self.n + 1))
        self._rule.set_out(**self._out._asdict())

    def waiting_actions(self) -> np.ndarray:
        """Per lane (int64 ``[E]``): the actions of the episode in progress that no item holds yet. Each becomes
        an item once ``n - 1`` more actions follow it, or when its episode ends (:meth:`truncate` ends it)."""
        self.flush()
        is_open = self._open >= 0
        taken = np.where(is_open, self._open - self._episode_start, 0)
        return np.minimum(taken, self.n - 1)

    def _item_view(self) -> Any:
        """How the tables shape a sample of these items."""
        return TransitionView(self.n, self.discount)

    def add_steps(self, lane: int, actions: Any, rewards: Any, next_observations: Any, *, terminated: Any = False,
                  truncated: Any = False, extras: Any = None, first_observations: Any = None) -> None:
        """``T`` consecutive steps of one lane at once: the same rows and items as ``T`` calls of :meth:`add`.

        The lane's episode must be in progress (its open row holds the observation ``actions[0]`` was
        taken from). ``next_observations[i]`` follows ``actions[i]`` (the final observation when step
        ``i`` ends the episode). ``terminated`` and ``truncated`` are bools (only the last step may then
        end the episode) or bool arrays of shape ``[T]`` marking the steps that end one (a step marked both
        ways is terminated, as in :meth:`add`). Each episode
        that ends before the last step is followed at once by the next, whose first observation is the
        next row of ``first_observations`` (``[K, ...]``, in order; one more row starts an episode after
        a last step that ends one, as a same-step reset does). Every other argument leads with axis
        ``T``; bad input raises and writes nothing.
        """
        self.flush()
        lane = int(lane)
        if not 0 <= lane < self.num_lanes or self._open[lane] < 0:
            raise ValueError(f"add_steps: lane {lane} has no episode in progress (lanes 0..{self.num_lanes - 1})")
        shape = np.shape(rewards)
        t = int(shape[0]) if shape else -1
        if t < 1:
            raise ValueError(f"add_steps: expected at least one step (rewards leading with T), got shape {shape}")
        term, trunc = _end_flags("terminated", terminated, t), _end_flags("truncated", truncated, t)
        ends = term | trunc  # a step marked both ways is terminated, as in add
        inner = np.count_nonzero(ends[:-1])
        block = self.lane_block(t)
        self.begin_steps(block, lane)
        k = 0 if first_observations is None else block.leading_rows(first_observations,
                                                                     "add_steps: first_observations")
        allowed = (inner, inner + 1) if ends[-1] else (inner,)
        if k not in allowed:
            after = ", and optionally one after it" if len(allowed) > 1 else ""
            got = "none" if first_observations is None else k
            raise SpecError(f"add_steps: expected {' or '.join(map(str, allowed))} first_observations (one per "
                            f"episode ending before the last step{after}), got {got}")
        block.put_steps(actions, rewards, next_observations, ends, term, first_observations, extras)
        self.write(block)

    def lane_block(self, t: int, slot: int = 0) -> StepBlock:
        """A one-lane block of at least ``t`` steps, kept in ``slot`` for the next call (:meth:`begin_steps` starts
        it on a lane). :meth:`add_steps` uses slot 0; a caller that puts the steps of several lanes before it
        writes any (``ReplayBuffer.extend``) takes a slot per lane."""
        block = self._lane_blocks.get(slot)
        if block is None or block.max_steps < t:
            block = self._lane_blocks[slot] = StepBlock(self.store.spec, [0], max(t, self.stage_steps))
        return block

    def begin_steps(self, block: StepBlock, lane: int) -> None:
        """Empty one-lane ``block`` and start it on ``lane``: its steps follow from the lane's open row (its frame
        stacks, its agents active there), or start an episode when the lane has none in progress."""
        self.flush()
        block.lanes[0] = lane
        active = self._active_at_open_rows()  # None unless the rows are multi-agent
        block.start(self._open[lane:lane + 1] >= 0, None if active is None else active[lane:lane + 1],
                    self.open_stacks(block.lanes))

    def on_step(self, events: StepEvents) -> None:
        # truncate(): the events of one step as the item maker takes them.
        n = self.num_lanes
        codes = np.full((1, n), _core.StepKind.START.value, np.int8)  # lanes that only start one complete no window
        rows = np.full((1, 3, n), -1, np.int64)  # final row, its episode's first row, new open row
        terminated = np.zeros((1, n), bool)
        codes[0, events.continued] = _core.StepKind.CONTINUE.value
        rows[0, 2, events.continued] = events.continued_rows
        rows[0, 1, events.continued] = events.continued_starts
        codes[0, events.ended] = _core.StepKind.END.value
        rows[0, 0, events.ended] = events.final_rows
        rows[0, 1, events.ended] = events.episode_starts
        terminated[0, events.ended] = events.terminated
        self._items(0, 1, codes, rows, terminated, self._lanes, events.final_was_open)

    def _make_items(self, a: int, steps: int, codes: np.ndarray, rows: np.ndarray, terminated: np.ndarray,
                    lanes: np.ndarray) -> None:
        self._items(a, steps, codes, rows, terminated, lanes, False)

    def _items(self, a: int, steps: int, codes: np.ndarray, rows: np.ndarray, terminated: np.ndarray,
               lanes: np.ndarray, final_was_open: bool) -> None:
        """The n-step items of written steps (the compiled n-step rule), into every table."""
        size = self.n * lanes.size * steps
        if self._out.lanes.size < size:
            self._out = _items_out(size, self._out.returns.shape[1])
            self._rule.set_out(**self._out._asdict())
        out = self._out
        m = self._rule.make(a, steps, codes, rows, terminated, lanes, final_was_open)
        if m:
            # Views of the outputs: every table copies what it keeps before the next write.
            fields = {"return": out.returns[:m].reshape(m, *self._reward_shape), "discount": out.discounts[:m]}
            self.insert_items(out.lanes[:m], out.starts[:m], out.lengths[:m], fields)


class _ItemsOut(NamedTuple):
    """Where the n-step rule writes its items (one entry per item)."""

    lanes: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    returns: np.ndarray  # [items, reward values] float32
    discounts: np.ndarray  # [items] float32


def _items_out(size: int, reward_size: int) -> _ItemsOut:
    return _ItemsOut(np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size, np.int64),
                     np.zeros((size, reward_size), np.float32), np.zeros(size, np.float32))


def _end_flags(name: str, flag: Any, t: int) -> np.ndarray:
    """``add_steps``'s ``terminated`` or ``truncated`` as a bool array ``[T]`` (a bool marks the last step)."""
    if type(flag) is bool or type(flag) is np.bool_:
        out = np.zeros(t, bool)
        out[-1] = bool(flag)
        return out
    arr = np.asarray(flag)
    if arr.dtype != np.bool_ or arr.shape != (t,):
        raise SpecError(f"add_steps: {name}: expected a bool or a bool array of shape ({t},), got {arr.dtype} "
                        f"array of shape {arr.shape}")
    return arr
