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
from typing import Any

import numpy as np

from rlflow import specs as _specs
from rlflow.adders import _kernels as KA
from rlflow.adders.base import Adder, PriorityFn, StepEvents, _fast_leaves, _row_bytes, _under
from rlflow.replay import _direct
from rlflow.replay import _row_kernels as KR
from rlflow.replay.storage import StepStore
from rlflow.replay.table import Table
from rlflow.replay.views import TransitionView
from rlflow.specs import Field, SpecError
from rlflow.types import ONE_LANE_NO, ONE_LANE_YES, TimeStep

__all__ = ["NStepTransition"]

_BLOCK_BYTES = 32 << 20  # the most memory stage() holds steps in (observations twice: next and final)
_FLAGS = ("terminated", "truncated", "first", "last")
_BOOL = np.dtype(np.bool_)
_ONE = (1,)
_NO, _YES = ONE_LANE_NO, ONE_LANE_YES
_NO_STEPS = np.zeros(0, np.bool_)  # lane_episodes_bag's flag array when a bool marks only the last step
_ITEM_FIELDS = ("return", "discount")


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

    def __init__(self, store: StepStore, tables: Sequence[Table], *, n: int = 1, discount: float = 0.99,
                 priority_fns: Mapping[str, PriorityFn] | None = None, stage_steps: int = 64) -> None:
        if int(n) != n or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n}")
        if int(stage_steps) != stage_steps or stage_steps < 1:
            raise ValueError(f"stage_steps must be an integer >= 1, got {stage_steps}")
        if not 0.0 <= float(discount) <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        self.n = int(n)
        self.max_items_per_step = self.n  # an episode's end completes up to n windows at once
        self.discount = float(discount)
        reward = store.fields.get("reward")
        item_spec = {"return": Field(reward.shape if reward is not None else (), np.float32),
                     "discount": Field((), np.float32)}
        super().__init__(store, tables, view=self._item_view(), item_spec=item_spec, priority_fns=priority_fns,
                         min_capacity=self.n + 2)
        self._powers = self.discount ** np.arange(self.n + 1)  # g^0 .. g^n, float64
        self._reward_shape = store.fields["reward"].shape
        self._reward_size = int(np.prod(self._reward_shape))
        self._rewards = store._flat["reward"].reshape(store.num_lanes * store.capacity, self._reward_size)
        # A block never overwrites rows of its own items, and its buffers stay within _BLOCK_BYTES.
        step_bytes = store.num_lanes * sum((2 if _under(name, "observation") else 1) * f.nbytes
                                           for name, f in store.fields.items() if name not in _FLAGS)
        self.stage_steps = min(int(stage_steps), (store.capacity - self.n - 2) // 2,
                               max(1, _BLOCK_BYTES // max(1, step_bytes)))
        self._block: _Block | None = None  # stage()'s buffers, made on its first call
        self._direct = _direct_plan(self)  # add_steps's one-call path, when the store and table fit it
        self._direct_bufs: tuple[np.ndarray, ...] | None = None
        self._segment_acc = np.zeros(4, np.int64)  # lane_segments_bag's counters
        self._bag: Any = None  # the one-call paths' unchanging arrays (_lane_bag), and what they were made of
        self._bag_key: tuple[Any, ...] | None = None
        self._segment_bufs = (np.zeros(0, np.int64), np.zeros(0, np.int8))  # add_steps's episode ends and codes
        self._no_restart = None if self._direct is None else np.zeros((0, self._direct[8].shape[1]), self._direct[3])
        self._one_step_fits = store.capacity - self.n - 2 >= 1  # add_steps takes one step
        # stage() of one lane: rows staged for add_steps (see _stage_lane), when the store fits its one-call path;
        # the rows' buffers are made on the first call.
        self._lane_staging = self._direct is not None and self.num_lanes == 1 and self.stage_steps >= 1
        self._lane_block: _LaneBlock | None = None
        self._direct_arrays: _direct.Arrays | None = None

    def waiting_actions(self) -> np.ndarray:
        """Per lane (int64 ``[E]``): the actions of the episode in progress that no item holds yet. Each becomes
        an item once ``n - 1`` more actions follow it, or when its episode ends (:meth:`truncate` ends it)."""
        if self._staged:
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
        end the episode) or bool arrays of shape ``[T]`` marking the steps that end one. Each episode
        that ends before the last step is followed at once by the next, whose first observation is the
        next row of ``first_observations`` (``[K, ...]``, in order; one more row starts an episode after
        a last step that ends one, as a same-step reset does). Every other argument leads with axis
        ``T``; bad input raises and writes nothing.
        """
        if self._staged:
            self.flush()
        lane = int(lane)
        if not 0 <= lane < self.num_lanes or self._open[lane] < 0:
            raise ValueError(f"add_steps: lane {lane} has no episode in progress (lanes 0..{self.num_lanes - 1})")
        shape = rewards.shape if type(rewards) is np.ndarray else np.shape(rewards)
        t = int(shape[0]) if shape else -1
        if t < 1 or t > self.store.capacity - self.n - 2:
            raise ValueError(f"add_steps: expected 1 to {self.store.capacity - self.n - 2} steps, got {t}")
        if (first_observations is not None or type(terminated) is np.ndarray or type(truncated) is np.ndarray
                or np.ndim(terminated) or np.ndim(truncated)):
            self._add_episodes(lane, t, actions, rewards, next_observations, terminated, truncated, extras,
                               first_observations)
            return
        if (self._direct is not None and extras is None
                and self._add_steps_direct(lane, t, actions, rewards, next_observations, terminated, truncated)):
            return
        obs = self._obs_columns(next_observations, t, "add_steps: next_observations")
        if self._agent_active is not None:  # agents act only from rows where they are active
            cap = self.store.capacity
            active = np.concatenate([self._agent_active[lane * cap + self._open[lane] % cap][None],
                                     obs["observation/active"][:-1]])
            actions = self._zero_inactive(actions, active)
        cols = self._step_columns(actions, rewards, extras, t)
        ended = bool(terminated) or bool(truncated)
        store = self.store
        with store.lock:
            r, s0 = int(self._open[lane]), int(self._episode_start[lane])
            store._announce_range(lane, t)
            flat = store._flat
            f = KA.write_lane_steps(lane, ended, bool(terminated), bool(truncated), store.count, store.episode_id,
                                    store.episode_step, store._next_episode, store._next_step, store.capacity, r,
                                    self._act_cols, tuple(_row_bytes(cols[k], t) for k in self._act_names),
                                    self._obs_cols, tuple(_row_bytes(obs[k], t) for k in self._obs_names),
                                    flat["terminated"], flat["truncated"], flat["first"], flat["last"])
            self._open[lane] = -1 if ended else f
            lo = max(s0, r + 1 - self.n)
            hi = f if ended else f - self.n + 1
            if hi <= lo:
                return
            self._insert_items(hi - lo, KA.nstep_lane_items, lane, lo, hi, f, bool(terminated), self.n,
                               self._powers, self._rewards, store.capacity)

    def _add_episodes(self, lane: int, t: int, actions: Any, rewards: Any, next_obs: Any, terminated: Any,
                      truncated: Any, extras: Any, first_observations: Any) -> None:
        """:meth:`add_steps` over episode ends: one compiled call for all (:meth:`_episodes_direct`) when the
        inputs and the table allow it, else everything is checked and each episode written in turn."""
        if (self._direct is not None and extras is None
                and self._episodes_direct(lane, t, actions, rewards, next_obs, terminated, truncated,
                                          first_observations)):
            return
        term, trunc = _end_flags("terminated", terminated, t), _end_flags("truncated", truncated, t)
        bufs = self._segments_out(t)
        m, inner, both = KA.episode_segments(term, trunc, *bufs)
        if both >= 0:
            raise ValueError(f"add_steps: step {both} is both terminated and truncated; an episode ends one way")
        ends, codes = bufs[0][:m], bufs[1][:m]
        k = 0 if first_observations is None else self._leading_rows(first_observations, "add_steps: first_observations")
        allowed = (inner, inner + 1) if codes[m - 1] else (inner,)
        if k not in allowed:
            after = ", and optionally one after it" if len(allowed) > 1 else ""
            got = "none" if first_observations is None else k if k >= 0 else "a scalar"
            raise SpecError(f"add_steps: expected {' or '.join(map(str, allowed))} first_observations (one per "
                            f"episode ending before the last step{after}), got {got}")
        cols = self._step_columns(actions, rewards, extras, t)
        obs = self._obs_columns(next_obs, t, "add_steps: next_observations")
        firsts = {} if not k else self._obs_columns(first_observations, k, "add_steps: first_observations")
        self._write_episodes(lane, ends, codes, 0, cols, obs, firsts)

    def _leading_rows(self, observations: Any, what: str) -> int:
        """How many observations ``observations`` holds (the leading axis of its first leaf, nested Dict and
        Tuple spaces followed), or -1 when that leaf has no axis; SpecError naming ``what`` when its structure
        is not the observation spec's."""
        try:
            flat = _specs.flatten_data(self.store.spec["observation"], observations, "observation")
        except SpecError as exc:
            raise SpecError(f"{what}: {exc}") from None
        shape = np.shape(next(iter(flat.values())))
        return int(shape[0]) if shape else -1

    def _segments_out(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Buffers for the episode ends and codes of ``t`` steps (:func:`~rlflow.adders._kernels.episode_segments`)."""
        bufs = self._segment_bufs
        if bufs[0].size <= t:
            bufs = self._segment_bufs = (np.zeros(2 * t + 2, np.int64), np.zeros(2 * t + 2, np.int8))
        return bufs

    def _episodes_direct(self, lane: int, t: int, actions: Any, rewards: Any, next_obs: Any, terminated: Any,
                         truncated: Any, first_observations: Any) -> bool:
        """:meth:`add_steps` over episode ends in one compiled call (:func:`~rlflow.adders._kernels.lane_episodes_bag`
        finds the ends and checks them there), for inputs in the store's dtypes and shapes and flags that are
        bools or bool arrays ``[T]``; what a call that stopped early left goes episode by episode. False,
        having changed nothing, for anything the general path must convert, check or raise on."""
        act_dtype, act_shape, rew_dtype, obs_dtype, obs_shape = self._direct[:5]
        flags: list[Any] = [None, None, False, False]
        for i, flag in enumerate((terminated, truncated)):
            if type(flag) is np.ndarray:
                if flag.dtype is not _BOOL or flag.shape != (t,):
                    return False
                flags[i] = flag
            elif type(flag) is bool or type(flag) is np.bool_:
                flags[i], flags[2 + i] = _NO_STEPS, bool(flag)
            else:
                return False
        if first_observations is None:
            restarts = self._no_restart
        elif (type(first_observations) is np.ndarray and first_observations.dtype is obs_dtype
              and first_observations.shape[1:] == obs_shape and first_observations.ndim == len(obs_shape) + 1):
            restarts = first_observations.reshape(first_observations.shape[0], self._no_restart.shape[1])
        else:
            return False
        if not (type(actions) is np.ndarray and actions.dtype is act_dtype and actions.shape == (t, *act_shape)
                and type(rewards) is np.ndarray and rewards.dtype is rew_dtype and rewards.shape == (t,)
                and type(next_obs) is np.ndarray and next_obs.dtype is obs_dtype and next_obs.shape == (t, *obs_shape)):
            return False
        ends, codes = self._segments_out(t)
        done, count = self._segments_direct(lane, ends, codes, restarts, actions, rewards, next_obs, tuple(flags))
        if not done:
            return False
        if done < count:  # the call stopped where the table's own insert had to take over: the rest in turn
            k = restarts.shape[0]
            self._write_episodes(lane, ends[:count], codes[:count], done, self._step_columns(actions, rewards, None, t),
                                 self._obs_columns(next_obs, t, "add_steps: next_observations"),
                                 self._obs_columns(restarts.reshape(k, *obs_shape), k, "add_steps: first_observations"))
        return True

    def _write_episodes(self, lane: int, ends: np.ndarray, codes: np.ndarray, done: int, cols: dict[str, Any],
                        obs: dict[str, Any], firsts: dict[str, Any]) -> None:
        """Segments ``done ..`` of :meth:`_add_episodes` (checked flat columns), each through :meth:`add_steps`
        and :meth:`add_first` of the next episode's first row."""
        k = next(iter(firsts.values())).shape[0] if firsts else 0
        a = int(ends[done - 1]) if done else 0
        for j in range(done, ends.size):
            z = int(ends[j])
            top = self._top({name: col[a:z] for name, col in {**cols, **obs}.items()})
            self.add_steps(lane, top["action"], top["reward"], top["observation"], terminated=bool(codes[j] == 1),
                           truncated=bool(codes[j] == 2), extras=top.get("extras"))
            if j < k:
                first = self._top({name: col[j:j + 1] for name, col in firsts.items()})["observation"]
                self.add_first(TimeStep(first, np.zeros(1, np.float32), _NO, _NO, _YES, _NO), lanes=[lane])
            a = z

    def add_first(self, timestep: TimeStep, lanes: Any = None) -> None:
        if (lanes is None and self._direct is not None and self.num_lanes == 1 and not self._staged
                and self._add_first_direct(timestep)):
            return
        super().add_first(timestep, lanes)

    add_first.__doc__ = Adder.add_first.__doc__

    def add(self, actions: Any, next_timestep: TimeStep, extras: Any = None) -> None:
        ts = next_timestep
        if self._direct is not None and extras is None and self.num_lanes == 1 and not self._staged:
            # One lane: a step that goes on, or ends the episode (and may start the next), in add_steps's one
            # compiled call; a lone reset and anything else the general path must see go there.
            flags = _lane_flags(ts)
            if flags is not None and self._open[0] >= 0 and self._one_step_fits:
                first, last, terminated, truncated = flags
                if not (first or last or terminated or truncated):
                    if ts.final_observation is None and self._add_steps_direct(0, 1, actions, ts.reward,
                                                                               ts.observation, False, False):
                        return
                elif last and terminated != truncated and ts.final_observation is not None:
                    if self._add_steps_direct(0, 1, actions, ts.reward, ts.final_observation, terminated,
                                              truncated, ts.observation if first else None):
                        return
        super().add(actions, ts, extras)

    add.__doc__ = Adder.add.__doc__

    def _direct_table(self) -> tuple[Table, _direct.Arrays] | None:
        """The one table and its arrays for the one-call paths (:mod:`rlflow.replay._direct`), counters
        loaded, or None when it needs the general path (another table listens to the store, or the table's
        kind does not fit). The caller holds the store's lock."""
        table, listeners = self.tables[0], self.store._listeners
        if len(listeners) != 1 or listeners[0] is not table:
            return None
        arrays = self._direct_arrays
        if arrays is None or not arrays.of(table):
            arrays = self._direct_arrays = _direct.Arrays(table, _ITEM_FIELDS)
        return (table, arrays) if arrays.ready() else None

    def _add_first_direct(self, timestep: TimeStep) -> bool:
        """:meth:`add_first` of a one-lane store in one compiled call
        (:func:`~rlflow.adders._kernels.lane_first_direct`); False, having changed nothing, when the input,
        the lane or the table need the general path."""
        obs_dtype, obs_shape = self._direct[3], self._direct[4]
        first, obs = timestep.first, timestep.observation
        if not (type(obs) is np.ndarray and obs.dtype is obs_dtype and obs.shape == (1, *obs_shape)
                and type(first) is np.ndarray and first.dtype is _BOOL and first.shape == (1,) and first[0]
                and self._open[0] < 0):
            return False
        store = self.store
        with store.lock:
            got = self._direct_table()
            if got is None:
                return False
            table, arrays = got
            bag, bufs = self._lane_bag(arrays, 0)
            if KA.lane_first_bag(bag, 0, obs.reshape(1, -1)) < 0:
                return False
            evicted, times, row = bufs[-1].tolist()[:3]
            self._open[0] = self._episode_start[0] = row
            _direct.settle(table, arrays.state, evicted, times)
        return True

    def _lane_bag(self, arrays: _direct.Arrays, m: int) -> tuple[Any, tuple[np.ndarray, ...]]:
        """The one-call paths' unchanging arrays in one :class:`~rlflow.replay._direct.LaneBag` (made again
        when the table's arrays or the output buffers change), and the output buffers for ``m`` items."""
        bufs = self._direct_buffers(m)
        key = self._bag_key
        if key is None or key[0] is not arrays or key[1] is not bufs:
            store, flat = self.store, self.store._flat
            checks, act_col, rew_col, obs_col = self._direct[5:]
            self._bag = _direct.make_bag(checks, store.count, store.episode_id, store.episode_step,
                                         store._next_episode, store._next_step, store.capacity, act_col, rew_col,
                                         obs_col, flat["terminated"], flat["truncated"], flat["first"], flat["last"],
                                         self._powers, arrays.tab, arrays.kind, arrays.state, *bufs,
                                         self._segment_acc)
            self._bag_key = (arrays, bufs)
        return self._bag, bufs

    def _direct_buffers(self, m: int) -> tuple[np.ndarray, ...]:
        """Outputs of the one-call paths for ``m`` items: lanes, starts, lengths, returns, discounts, slots,
        keys, clash flags, and five counters."""
        bufs = self._direct_bufs
        if bufs is None or bufs[0].size < m:
            k = max(2 * m, 64)
            bufs = self._direct_bufs = (*np.empty((3, k), np.int64), np.empty((k, 1), np.float32),
                                        np.empty(k, np.float32), *np.empty((2, k), np.int64), np.empty(k, np.bool_),
                                        np.empty(5, np.int64))
        return bufs

    def _add_steps_direct(self, lane: int, t: int, actions: Any, rewards: Any, next_obs: Any, terminated: bool,
                          truncated: bool, restart: Any = None) -> bool:
        """:meth:`add_steps` in one compiled call (:func:`~rlflow.adders._kernels.lane_steps_direct`), which
        updates the table in place (:mod:`rlflow.replay._direct`); with ``restart`` (``[1, ...]``, the episode
        ending here) also the next episode's first observation, as ``add`` of a step that ends one episode
        and starts the next. Returns False, having changed nothing, when the inputs or the table need the
        general path (which converts them or raises)."""
        act_dtype, act_shape, rew_dtype, obs_dtype, obs_shape = self._direct[:5]
        if not (type(actions) is np.ndarray and actions.dtype is act_dtype and actions.shape == (t, *act_shape)
                and type(rewards) is np.ndarray and rewards.dtype is rew_dtype and rewards.ndim == 1
                and type(next_obs) is np.ndarray and next_obs.dtype is obs_dtype
                and next_obs.shape == (t, *obs_shape)):
            return False
        if restart is None:
            restart = self._no_restart
        elif (type(restart) is np.ndarray and restart.dtype is obs_dtype and restart.shape == (1, *obs_shape)
              and (terminated or truncated)):
            restart = restart.reshape(1, -1)
        else:
            return False
        store = self.store
        with store.lock:
            got = self._direct_table()
            if got is None:
                return False
            table, arrays = got
            state = arrays.state
            ended = bool(terminated) or bool(truncated)
            r, s0 = int(self._open[lane]), int(self._episode_start[lane])
            last = int(store.count[lane]) + t - 1
            m = max(0, (last if ended else last - self.n + 1) - max(s0, r + 1 - self.n))
            bag, (lanes, starts, _, _, _, slots, _, clash, out) = self._lane_bag(arrays, m)
            status = KA.lane_steps_bag(bag, lane, ended, bool(terminated), bool(truncated), r, s0, self.n,
                                       actions.reshape(t, -1), rewards.reshape(t, 1), next_obs.reshape(t, -1), restart,
                                       arrays.alpha, m == 0 or table.rate_limiter.can_insert(m), table.cross_episodes)
            if status == -2:
                return False
            evicted, times, made, last, clashes = out.tolist()
            inserted = made if status == 1 else 0
            self._open[lane] = -1 if ended else last
            if restart.shape[0]:  # the next episode's first row follows the final row
                self._open[lane] = self._episode_start[lane] = last + 1
            _direct.settle(table, state, evicted, times, inserted, clashes, slots, lanes, starts, clash)
            if status == -3:
                raise RuntimeError(f"add_steps: lane {lane}'s new items are not stored (a broken invariant)")
            if made and not inserted:
                self._insert_left(made)
        return True

    def _insert_left(self, made: int) -> None:
        """Insert through the table the ``made`` items a one-call path left in its outputs (no room or no
        consent yet: the table's own insert waits or evicts)."""
        lanes, starts, lengths, returns, discounts = self._direct_bufs[:5]
        self._insert(lanes[:made].copy(), starts[:made].copy(), lengths[:made].copy(),
                     {"return": returns[:made, 0].copy(), "discount": discounts[:made].copy()})

    def stage(self, actions: Any, next_timestep: TimeStep, extras: Any = None) -> None:
        """:meth:`add`, held back: the step is checked now and written at the next :meth:`flush`.

        Up to ``stage_steps`` steps are held, then written as one block: the rows and items that many
        :meth:`add` calls write (item keys aside), in a few compiled calls instead of a few per step.
        Held steps are not in the store or its tables until then: call :meth:`flush` before anything
        reads them (``rlflow.run`` does, and every other method of the adder flushes first). Input that
        the block path cannot take as it is (values to cast, other shapes, bad flags) flushes and goes
        through :meth:`add`, which raises on bad input, having written nothing of that step.
        """
        ts = next_timestep
        if self._lane_staging:
            if extras is None and self._stage_lane(actions, ts):
                return
            self.add(actions, ts, extras)  # flushes the steps before, then writes or raises the precise error
            return
        block = self._block
        if block is None:
            if self.stage_steps < 1 or self._agent_active is not None:  # a small store, or multi-agent rows
                self.add(actions, ts, extras)
                return
            block = self._block = _Block(self)
        simple = block.simple
        if simple is not None and extras is None:  # one compiled call checks and copies the whole step
            act_dtype, act_shape, rew_dtype, rew_shape, obs_dtype, obs_shape, flag_shape = simple
            first, last, terminated, truncated = ts.first, ts.last, ts.terminated, ts.truncated
            reward, observation, final = ts.reward, ts.observation, ts.final_observation
            if (type(actions) is np.ndarray and actions.dtype is act_dtype and actions.shape == act_shape
                    and type(reward) is np.ndarray and reward.dtype is rew_dtype and reward.shape == rew_shape
                    and type(observation) is np.ndarray and observation.dtype is obs_dtype
                    and observation.shape == obs_shape
                    and (final is None or (type(final) is np.ndarray and final.dtype is obs_dtype
                                           and final.shape == obs_shape))
                    and type(first) is np.ndarray and first.dtype is _BOOL and first.shape == flag_shape
                    and type(last) is np.ndarray and last.dtype is _BOOL and last.shape == flag_shape
                    and type(terminated) is np.ndarray and terminated.dtype is _BOOL
                    and terminated.shape == flag_shape
                    and type(truncated) is np.ndarray and truncated.dtype is _BOOL and truncated.shape == flag_shape):
                s = KA.stage_simple(block.staged, self._open, block.open, first, last, terminated, truncated,
                                    block.flags, block.checks, actions, block.act[0], reward, block.act[1],
                                    observation, block.obs[0], final, block.final[0])
                if s > 0:
                    self._staged = s
                    if s == self.stage_steps:
                        self.flush()
                    return
            self.add(actions, ts, extras)  # flushes the steps before, then converts or raises the precise error
            return
        step = self._fast_step(actions, ts, extras)
        if step is None:
            self.add(actions, ts, extras)
            return
        cols, obs, final = step
        given = final is not None
        s = self._staged
        if not s:
            block.open[:] = self._open >= 0
        if not KA.stage_flow(block.open, ts.first, ts.last, ts.terminated, ts.truncated, given, block.flags[s]):
            self.add(actions, ts, extras)  # flushes the steps before, then raises the precise error
            return
        for col, name in zip(block.act, self._act_names, strict=True):
            col[s] = cols[name]
        for col, name in zip(block.obs, self._obs_names, strict=True):
            col[s] = obs[name]
        if final is not None:
            for col, name in zip(block.final, self._obs_names, strict=True):
                col[s] = final[name]
        self._staged = s + 1
        if self._staged == self.stage_steps:
            self.flush()

    def _stage_lane(self, actions: Any, ts: TimeStep) -> bool:
        """:meth:`stage` of a one-lane store on the :meth:`add_steps` path: the step's action, reward and next
        observation (the final one when the episode ends) are checked and copied to a block of rows in one
        compiled call; the block goes to :meth:`add_steps`'s one-call path when full or when the episode ends
        (with a same-step restart's first row). False, having staged nothing, for anything else: a lone
        reset, flags that do not follow, inputs to convert or bad values."""
        flags = _lane_flags(ts)
        if flags is None or self._open[0] < 0:
            return False
        restart, ends, term, trunc = flags
        blk = self._lane_block
        if blk is None:
            blk = self._lane_block = _LaneBlock(self)
        act_dtype, act_shape, obs_dtype, obs_shape, rew_dtype, obs_field, checks = blk.plan
        if ends:  # the step ends the episode; a same-step restart's observation must be good before anything
            nxt = ts.final_observation
            if term == trunc:  # an end needs exactly one of the two: the general path says what is wrong
                return False
            if restart and not _specs.fits(obs_field, ts.observation, 1):
                return False
        else:
            if restart or term or trunc or ts.final_observation is not None:
                return False
            nxt = ts.observation
        reward = ts.reward
        if not (type(actions) is np.ndarray and actions.dtype is act_dtype and actions.shape == act_shape
                and type(reward) is np.ndarray and reward.dtype is rew_dtype and reward.shape == _ONE
                and type(nxt) is np.ndarray and nxt.dtype is obs_dtype and nxt.shape == obs_shape):
            return False
        rows = KA.stage_row(blk.staged, checks, actions, blk.act, reward, blk.rew, nxt, blk.obs)
        if rows < 0:
            return False
        self._staged = rows
        if ends:
            if not restart:
                self._flush_lane(term, trunc)
            elif rows < self.stage_steps and type(ts.observation) is np.ndarray and ts.observation.dtype is obs_dtype \
                    and ts.observation.shape == obs_shape:  # the block goes on with the next episode
                j = blk.segments
                blk.ends[j], blk.codes[j] = rows, 1 if term else 2
                blk.restart[j] = ts.observation
                blk.segments = j + 1
            else:
                self._flush_lane(term, trunc, ts.observation)
        elif rows == self.stage_steps:
            self._flush_lane(False, False)
        return True

    def _env_sink(self) -> _LaneBlock | None:
        """The block :meth:`stage` holds a one-lane store's steps in, for a caller that stages a step which
        continues the episode straight from a gymnasium env's output, as :meth:`_stage_lane` would stage
        the env wrapper's TimeStep of it (``rlflow.run``'s one-env path, with
        :func:`~rlflow.adders._kernels.stage_env_step`; it keeps ``_staged`` in step with the block's count
        and calls :meth:`flush` when the block is full). None unless :meth:`stage` stages one lane's steps
        that way and the rewards are stored as float32, as the wrapper makes them."""
        if not self._lane_staging or type(self).stage is not NStepTransition.stage:
            return None
        blk = self._lane_block
        if blk is None:
            blk = self._lane_block = _LaneBlock(self)
        return blk if blk.plan[4] == np.float32 else None

    def _flush_lane(self, terminated: bool, truncated: bool, restart: Any = None) -> None:
        """Write the rows :meth:`_stage_lane` holds, the episode ending on the last one when ``terminated`` or
        ``truncated`` (and the next one starting with ``restart`` when given). The block's episodes (its
        segments: those that ended and restarted inside it, then the last) go in one compiled call
        (:meth:`_segments_direct`), each as :meth:`add_steps` of its rows and :meth:`add_first` of the next
        episode would write them; what that call leaves goes episode by episode through those methods."""
        n, blk = self._staged, self._lane_block
        self._staged = 0
        blk.staged[0] = 0
        acts, rews = blk.act[:n].reshape(n, *blk.plan[1][1:]), blk.rew[:n, 0]
        obs = blk.obs[:n].reshape(n, *blk.plan[3][1:])
        segments = blk.segments
        blk.segments = 0
        tail = segments == 0 or int(blk.ends[segments - 1]) < n  # rows after the last restart: the last episode
        exact = restart is None or (type(restart) is np.ndarray and restart.dtype is blk.restart.dtype
                                    and restart.shape == blk.restart.shape[1:])
        count = segments
        if tail and exact:
            blk.ends[segments], blk.codes[segments] = n, 1 if terminated else 2 if truncated else 0
            if restart is not None:
                blk.restart[segments] = restart
            count += 1
        with_restart = count if restart is not None and count > segments else segments
        done = 0 if not count else self._segments_direct(
            0, blk.ends[:count], blk.codes[:count],
            blk.restart[:with_restart].reshape(with_restart, self._direct[8].shape[1]), acts, rews, obs)[0]
        if done == count and (count > segments or not tail):
            return
        a = int(blk.ends[done - 1]) if done else 0
        for j in range(done, segments):  # what the one call left, episode by episode
            z = int(blk.ends[j])
            self._write_lane(acts[a:z], rews[a:z], obs[a:z], blk.codes[j] == 1, blk.codes[j] == 2,
                             blk.restart[j].copy())
            a = z
        if tail:
            self._write_lane(acts[a:], rews[a:], obs[a:], terminated, truncated, restart)

    def _write_lane(self, acts: np.ndarray, rews: np.ndarray, obs: np.ndarray, terminated: bool, truncated: bool,
                    restart: Any) -> None:
        """One segment of staged rows through :meth:`add_steps` (its one-call path, or its general path), then
        :meth:`add_first` of ``restart``."""
        n = rews.shape[0]
        if self._direct is None or not self._add_steps_direct(0, n, acts, rews, obs, terminated, truncated):
            self.add_steps(0, acts, rews, obs, terminated=terminated, truncated=truncated)
        if restart is not None:
            self.add_first(TimeStep(restart, np.zeros(1, np.float32), _NO, _NO, _YES, _NO))

    def _segments_direct(self, lane: int, ends: np.ndarray, codes: np.ndarray, restarts: np.ndarray, acts: np.ndarray,
                         rews: np.ndarray, obs: np.ndarray, flags: tuple[Any, ...] | None = None) -> tuple[int, int]:
        """Episodes of one lane in one compiled call (:func:`~rlflow.adders._kernels.lane_segments_bag`:
        ``ends``, ``codes`` and ``restarts`` as it takes them; ``acts``, ``rews``, ``obs`` in the store's
        dtypes and shapes). With ``flags`` (``lane_episodes_bag``'s terminated, truncated and last-step
        flags), the segments are found from them in the same call, into ``ends`` and ``codes``. Returns how
        many segments were written and how many there are, having settled the table's counters and finished
        what the call left of the last one written (items to insert through the table, overflow lists); no
        segment written means nothing changed: the table needs the general path, or a value or flag is bad."""
        t = rews.shape[0]
        store = self.store
        with store.lock:
            got = self._direct_table()
            if got is None:
                return 0, 0
            table, arrays = got
            state = arrays.state
            m = t + self.n  # at most the items of the rows, and the windows open before the block
            bag, (lanes, starts, _, _, _, slots, _, clash, out) = self._lane_bag(arrays, m)
            acc = self._segment_acc
            args = (int(self._open[lane]), int(self._episode_start[lane]), self.n, acts.reshape(t, -1),
                    rews.reshape(t, 1), obs.reshape(t, -1), arrays.alpha, table.rate_limiter.can_insert(m),
                    table.cross_episodes)
            if flags is None:
                count = ends.shape[0]
                done, status = KA.lane_segments_bag(bag, lane, ends, codes, restarts, *args)
            else:
                done, status, count = KA.lane_episodes_bag(bag, lane, *flags, ends, codes, restarts, *args)
            if not done:
                return 0, count
            evicted, times, inserted, start = acc.tolist()
            made, last, clashes = out.tolist()[2:]
            j = done - 1
            stopped = (made and status != 1) or clashes or status == -3  # before the segment's restart, if any
            if j < restarts.shape[0] and not stopped:  # the next episode's first row follows the final row
                self._open[lane] = self._episode_start[lane] = last + 1
            else:
                self._open[lane] = -1 if codes[j] else last
                self._episode_start[lane] = start
            placed = made if status == 1 else 0
            if clashes:  # the last segment's items that share a start row
                _direct.settle(table, state, evicted, times, inserted, clashes, slots[:placed], lanes[:placed],
                               starts[:placed], clash[:placed])
            else:
                _direct.settle(table, state, evicted, times, inserted)
            if status == -3:
                raise RuntimeError(f"lane {lane}: new items of a write of several episodes are not stored (a broken "
                                   "invariant)")
            if made and not placed:
                self._insert_left(made)
            if stopped and j < restarts.shape[0]:
                first = restarts[j:j + 1].reshape(1, *self._direct[4]).copy()
                self.add_first(TimeStep(first, np.zeros(1, np.float32), _NO, _NO, _YES, _NO), lanes=[lane])
        return done, count

    def flush(self) -> None:
        """Write the steps :meth:`stage` holds, and their items, as one block."""
        steps = self._staged
        if not steps:
            return
        if self._lane_staging:
            self._flush_lane(False, False)
            return
        self._staged = 0
        b = self._block
        b.staged[0] = 0
        store = self.store
        with store.lock:
            m = KA.plan_block(steps, b.flags, self._open, store.count, store.capacity, b.codes, b.old_lanes,
                              b.old_rows)
            if m < 0:  # stage() checked every step against the one before: a broken invariant
                raise RuntimeError(f"flush: staged step {-1 - m} does not follow from the lanes' state")
            flat = store._flat
            direct = self._rows_table()
            if direct is None and m and store._listeners:
                store._announce(b.old_lanes[:m], b.old_rows[:m])
            table, arrays = direct if direct is not None else (None, None)
            k = KA.write_steps(b.codes[:steps], np.ascontiguousarray(b.flags[:steps, 2]),
                               np.ascontiguousarray(b.flags[:steps, 3]), self._open, self._episode_start, store.count,
                               store.episode_id, store.episode_step, store._next_episode, store._next_step,
                               store.capacity, self._act_cols, b.act_bytes, self._obs_cols, b.obs_bytes, b.final_bytes,
                               flat["terminated"], flat["truncated"], flat["first"], flat["last"], b.rows,
                               KA.STEP_ITEMS if direct is None else KA.ROW_ITEMS, self.n, self._powers, self._rewards,
                               _direct.NO_ROWS if direct is None else arrays.tab,
                               _direct.NO_STATE if direct is None else arrays.state, b.lanes, b.starts, b.lengths,
                               b.returns, b.discounts, b.out)
            if direct is not None:  # the RowTable's items dropped and placed by the write
                evicted, times, placed = b.out.tolist()
                _direct.settle(table, arrays.state, evicted, times)  # the drops first, as the table's insert sees them
                state = arrays.state
                if placed and table.rate_limiter.can_insert(placed):  # all k of them
                    state[_direct.NUM_FREE] -= placed
                    state[_direct.NEXT_SEQ] += placed
                    _direct.settle(table, state, 0, 0, placed)
                    return
                if placed:  # not admitted at once: taken back, for the table's insert (which waits)
                    KR.unplace(table._items.meta, store.capacity, b.lanes[:k], b.starts[:k],
                               int(state[_direct.NEXT_SEQ]))
            if k:  # the table's own insert: it waits for the rate limiter, evicts, or explains a refusal
                self._insert(b.lanes[:k], b.starts[:k], b.lengths[:k],
                             {"return": b.returns[:k].reshape(k, *self._reward_shape), "discount": b.discounts[:k]})

    def _staged_state(self) -> dict[str, Any]:
        s = self._staged
        if self._lane_staging:
            blk, j = self._lane_block, self._lane_block.segments
            return {"steps": s, "act": blk.act[:s].copy(), "rew": blk.rew[:s].copy(), "obs": blk.obs[:s].copy(),
                    "ends": blk.ends[:j].copy(), "codes": blk.codes[:j].copy(), "restart": blk.restart[:j].copy()}
        b = self._block
        return {"steps": s, "act": [c[:s].copy() for c in b.act], "obs": [c[:s].copy() for c in b.obs],
                "final": [c[:s].copy() for c in b.final], "flags": b.flags[:s].copy(), "open": b.open.copy()}

    def _load_staged(self, state: Mapping[str, Any] | None) -> None:
        if state is not None:  # checked before anything changes
            s = int(state["steps"])
            if not 0 < s < self.stage_steps or ("rew" in state) != self._lane_staging:
                raise ValueError(f"adder state: {s} staged steps of a {'one-lane' if 'rew' in state else 'block'} "
                                 f"stage, expected fewer than stage_steps={self.stage_steps} of a "
                                 f"{'one-lane' if self._lane_staging else 'block'} stage; build the adder as the "
                                 "checkpointed run did")
        self._staged = 0
        for blk in (self._lane_block, self._block):
            if blk is not None:
                blk.staged[0] = 0
        if self._lane_block is not None:
            self._lane_block.segments = 0
        if state is None:
            return
        if self._lane_staging:
            blk = self._lane_block = self._lane_block or _LaneBlock(self)
            j = len(state["ends"])
            blk.act[:s], blk.rew[:s], blk.obs[:s] = state["act"], state["rew"], state["obs"]
            blk.ends[:j], blk.codes[:j], blk.restart[:j] = state["ends"], state["codes"], state["restart"]
            blk.segments = j
            blk.staged[0] = s
        else:
            b = self._block = self._block or _Block(self)
            for cols, key in ((b.act, "act"), (b.obs, "obs"), (b.final, "final")):
                for col, saved in zip(cols, state[key], strict=True):
                    col[:s] = saved
            b.flags[:s], b.open[:] = state["flags"], state["open"]
            b.staged[0] = s
        self._staged = s

    def _rows_table(self) -> tuple[Table, _direct.Arrays] | None:
        """The adder's one table and its arrays when it is a RowTable without a priority function that only
        it listens to the store (:meth:`flush` then writes into it directly); else None. The caller holds
        the store's lock."""
        got = self._direct_table()
        if got is None or got[1].kind != _direct.ROWS or self.tables[0].name in self.priority_fns:
            return None
        return got

    def _step_columns(self, actions: Any, rewards: Any, extras: Any, t: int,
                      what: str = "add_steps") -> dict[str, np.ndarray]:
        """The action columns (action, reward, extras) of ``t`` steps, checked; SpecError names ``what`` and what
        is wrong."""
        cols = self._fast_action_columns(actions, rewards, extras, t)
        if cols is not None:
            return cols
        if "extras" not in self._layout and extras is not None:
            raise SpecError(f"{what}: extras given, but the store's spec has no 'extras'")
        if "extras" in self._layout and extras is None:
            raise SpecError(f"{what}: the store has extras {list(self._extra_fields)}; pass extras=")
        row = {"action": actions, "reward": rewards}
        fields = {**self._act_fields, **self._reward_fields}
        if extras is not None:
            row["extras"] = extras
            fields.update(self._extra_fields)
        return self._check(fields, row, t, what)

    def _obs_columns(self, observations: Any, t: int, what: str) -> dict[str, np.ndarray]:
        """``t`` observations as flat columns: as given when each is an array of exactly its stored dtype and
        shape with good values, else checked and converted (SpecError naming ``what``)."""
        obs: dict[str, np.ndarray] = {}
        if _fast_leaves(self._layout["observation"], observations, t, obs):
            return obs
        return self._check(self._obs_fields, {"observation": observations}, t, what)

    def _emit(self, events: StepEvents) -> None:
        # add_first, truncate and the general add path: the events as per-lane arrays, for the one kernel.
        n = self.num_lanes
        code = np.full(n, KA.START, np.int8)  # lanes that only start an episode complete no window
        rows = np.full((3, n), -1, np.int64)  # final row, its episode's first row, new open row
        terminated = np.zeros(n, bool)
        code[events.continued] = KA.CONTINUE
        rows[2, events.continued] = events.continued_rows
        code[events.ended] = KA.END
        rows[0, events.ended] = events.final_rows
        rows[1, events.ended] = events.episode_starts
        terminated[events.ended] = events.terminated
        self._emit_lanes(code, rows[0], rows[1], rows[2], terminated, events.final_was_open)

    def _emit_lanes(self, code: np.ndarray, final_rows: np.ndarray, ended_starts: np.ndarray, new_rows: np.ndarray,
                    terminated: np.ndarray, final_was_open: bool = False) -> None:
        # Lanes that go on complete the window that now reaches n steps ahead; ended lanes complete every
        # window that reaches their final row (see the module docstring).
        self._insert_items(self.n * code.size, KA.nstep_items, code, final_rows, ended_starts, new_rows,
                           self._episode_start, terminated, self.n, self._powers, self._rewards, self.store.capacity,
                           final_was_open)

    def _insert_items(self, size: int, kernel: Any, *args: Any) -> None:
        """Run an item kernel (``args``, then outputs for up to ``size`` items) and insert what it wrote."""
        lanes, starts, lengths = np.empty((3, size), np.int64)
        returns = np.empty((size, self._reward_size), np.float32)
        discounts = np.empty(size, np.float32)
        m = kernel(*args, lanes, starts, lengths, returns, discounts)
        if m:
            self._insert(lanes[:m], starts[:m], lengths[:m],
                         {"return": returns[:m].reshape(m, *self._reward_shape), "discount": discounts[:m]})


_GOING_ON = (False, False, False, False)


def _end_flags(name: str, flag: Any, t: int) -> np.ndarray:
    """``add_steps``'s ``terminated`` or ``truncated`` as a bool array ``[T]`` (a bool marks the last step)."""
    if type(flag) is np.ndarray and flag.dtype is _BOOL and flag.shape == (t,):
        return flag
    if np.ndim(flag) == 0:
        out = np.zeros(t, bool)
        out[-1] = bool(flag)
        return out
    arr = np.asarray(flag)
    if arr.dtype != np.bool_ or arr.shape != (t,):
        raise SpecError(f"add_steps: {name}: expected a bool or a bool array of shape ({t},), got {arr.dtype} "
                        f"array of shape {arr.shape}")
    return arr


def _lane_flags(ts: TimeStep) -> tuple[bool, bool, bool, bool] | None:
    """One lane's ``first, last, terminated, truncated`` as bools (the shared one-lane arrays known by identity),
    or None when they are not ``[1]`` bool arrays."""
    first, last, terminated, truncated = ts.first, ts.last, ts.terminated, ts.truncated
    if first is _NO and last is _NO and terminated is _NO and truncated is _NO:
        return _GOING_ON
    if not (type(first) is np.ndarray and first.dtype is _BOOL and first.shape == _ONE
            and type(last) is np.ndarray and last.dtype is _BOOL and last.shape == _ONE
            and type(terminated) is np.ndarray and terminated.dtype is _BOOL and terminated.shape == _ONE
            and type(truncated) is np.ndarray and truncated.dtype is _BOOL and truncated.shape == _ONE):
        return None
    return bool(first[0]), bool(last[0]), bool(terminated[0]), bool(truncated[0])


class _LaneBlock:
    """:meth:`NStepTransition._stage_lane`'s rows: ``stage_steps`` actions, rewards and next observations of
    the one lane, in the store's dtypes, with what a step is checked against."""

    def __init__(self, adder: NStepTransition) -> None:
        k = adder.stage_steps
        act_dtype, act_shape, rew_dtype, obs_dtype, obs_shape, checks = adder._direct[:6]
        self.act = np.zeros((k, 1, *act_shape), act_dtype)
        self.rew = np.zeros((k, 1), rew_dtype)
        self.obs = np.zeros((k, 1, *obs_shape), obs_dtype)
        self.staged = np.zeros(1, np.int64)  # rows held, as stage_row counts them
        # Episodes that ended inside the block: segment j ends at row ends[j] (exclusive), terminated
        # (code 1) or truncated (2), and the next episode starts with restart[j]; one more entry for the
        # block's last rows at the flush.
        self.ends = np.zeros(k + 1, np.int64)
        self.codes = np.zeros(k + 1, np.int8)
        self.restart = np.zeros((k + 1, 1, *obs_shape), obs_dtype)
        self.segments = 0
        obs_field = next(iter(adder._obs_fields.values()))
        self.plan = (act_dtype, (1, *act_shape), obs_dtype, (1, *obs_shape), rew_dtype, obs_field, checks)


class _Block:
    """:meth:`NStepTransition.stage`'s buffers: ``stage_steps`` steps of every lane's inputs in the store's
    dtypes (with ``(steps, E, row_bytes)`` byte views for the kernels), flags, plans and item outputs."""

    def __init__(self, adder: NStepTransition) -> None:
        k, e = adder.stage_steps, adder.num_lanes
        fields = adder.store.fields

        def column(name: str) -> np.ndarray:
            f = fields[name]
            return np.zeros((k, e, *f.shape), f.dtype)

        def as_bytes(cols: list[np.ndarray]) -> tuple[np.ndarray, ...]:
            return tuple(c.reshape(k, e, -1).view(np.uint8) if c.size else np.zeros((k, e, 0), np.uint8) for c in cols)

        self.act = [column(name) for name in adder._act_names]
        self.obs = [column(name) for name in adder._obs_names]
        self.final = [column(name) for name in adder._obs_names]
        self.act_bytes, self.obs_bytes, self.final_bytes = as_bytes(self.act), as_bytes(self.obs), as_bytes(self.final)
        self.flags = np.zeros((k, 4, e), np.bool_)
        self.open = np.zeros(e, np.bool_)
        self.codes = np.zeros((k, e), np.int8)
        self.old_lanes, self.old_rows = np.zeros((2, 2 * e * k), np.int64)
        self.rows = np.zeros((k, 3, e), np.int64)  # write_steps's rows of each step
        self.staged = np.zeros(1, np.int64)  # the steps held, as the one-call path counts them
        self.simple, self.checks = _simple_plan(adder, e)
        items = adder.n * e * k
        self.lanes, self.starts, self.lengths = np.zeros((3, items), np.int64)
        self.returns = np.zeros((items, adder._reward_size), np.float32)
        self.discounts = np.zeros(items, np.float32)
        self.out = np.zeros(3, np.int64)  # write_steps's counters


def value_checks(fields: Sequence[Field]) -> np.ndarray | None:
    """The compiled staging kernels' value checks of ``fields``: (mode, low, high) of each, in a row
    (:func:`rlflow.specs.check_mode`); None when one of them cannot be checked there."""
    modes = [_specs.check_mode(f) for f in fields]
    if any(m is None for m in modes):
        return None
    return np.array([x for m in modes for x in m], np.float64)


def exact_dtype(field: Field) -> np.dtype | None:
    """``field``'s dtype when the staging kernels take it and arrays of it can be recognised by identity (a
    builtin, native bool, integer or 32/64-bit float dtype); None otherwise (e.g. float16: the general path)."""
    d = np.dtype(field.dtype)
    kernel_typed = d.kind in "biu" or (d.kind == "f" and d.itemsize in (4, 8))
    return d if kernel_typed and d.isnative and d is np.dtype(d.str) else None


def single_fields(adder: Adder) -> list[tuple[str, Field]] | None:
    """The (column, field) of the action, the reward and the observation when each is one field and the
    store has no extras (what the one-call staging kernels take); None otherwise."""
    layout = adder._layout
    if "extras" in layout or any(layout[k] is None or len(layout[k]) != 1 or layout[k][0][1] is not None
                                 for k in ("action", "reward", "observation")):
        return None
    return [(layout[k][0][0], layout[k][0][2]) for k in ("action", "reward", "observation")]


def _direct_plan(adder: NStepTransition) -> tuple[Any, ...] | None:
    """What :meth:`NStepTransition.add_steps`'s one-call path checks and writes: the action's, reward's and
    observation's dtypes and shapes, their value checks and the store's columns as 2-D views; None unless
    each is one field (:func:`single_fields`) of a kernel dtype, the reward a scalar, and the adder has
    one table with no priority function."""
    single = single_fields(adder)
    if (single is None or len(adder.tables) != 1 or adder.tables[0].name in adder.priority_fns
            or adder._agent_active is not None):
        return None
    fields = [f for _, f in single]
    checks, dtypes = value_checks(fields), [exact_dtype(f) for f in fields]
    if checks is None or any(d is None for d in dtypes) or fields[1].shape != ():
        return None
    store = adder.store
    rows = store.num_lanes * store.capacity
    act, obs = (np.asarray(store._flat[name]).reshape(rows, -1) for name in (single[0][0], single[2][0]))
    return (dtypes[0], fields[0].shape, dtypes[1], dtypes[2], fields[2].shape, checks, act,
            np.asarray(adder._rewards), obs)


def _simple_plan(adder: NStepTransition, e: int) -> tuple[tuple[Any, ...] | None, np.ndarray | None]:
    """What :meth:`NStepTransition.stage` checks a step against in one compiled call (see
    :func:`single_fields`): the dtypes and shapes (``None`` when it cannot), and the value checks of
    :func:`~rlflow.adders._kernels.stage_simple`."""
    single = single_fields(adder)
    if single is None:
        return None, None
    fields = [f for _, f in single]
    checks, dtypes = value_checks(fields), [exact_dtype(f) for f in fields]
    if checks is None or any(d is None for d in dtypes):
        return None, None
    act, rew, obs = fields
    return (dtypes[0], (e, *act.shape), dtypes[1], (e, *rew.shape), dtypes[2], (e, *obs.shape), (e,)), checks
