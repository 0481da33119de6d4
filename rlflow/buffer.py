"""ReplayBuffer: a store, an n-step transition adder and one table, behind ``add`` and ``sample``.

For a training loop that already exists and wants a fast buffer and nothing else::

    buffer = ReplayBuffer(env.observation_space, env.action_space, capacity=100_000, n_step=3)
    buffer.add(obs, action, reward, next_obs, terminated, truncated)      # one transition (or a batch)
    buffer.extend(obs_t, action_t, reward_t, next_obs_t, term_t, trunc_t)  # T consecutive transitions
    batch = buffer.sample(256).data                                       # a Transition [256, ...]

Each call records one transition per env (``num_envs`` of them, leading axis ``E``; with one env the
leading axis may be left out). Observations are stored once: when a transition's ``obs`` is the
previous ``next_obs`` of its env (the usual case), only ``next_obs`` is new. When it is not (the loop
skipped or restarted without an episode end), the previous episode is closed as truncated at its last
``next_obs`` and a new one starts at ``obs``, so every transition passed in is kept exactly as given,
but gymnasium's ``NEXT_STEP`` reset steps (after an episode end, ``obs`` is bit for bit that end's
``next_obs``, reward 0, neither flag), which are left out; ``infos=`` supplies the true final observations
of ``SAME_STEP`` vector envs. A step both terminated and truncated is terminated.
Sampled transitions are n-step (``n_step=1``: the transitions as added): ``reward`` is the discounted
sum of up to ``n_step`` rewards, ``discount`` is ``discount ** k`` (0 after termination), and
``next_observation`` the observation ``k`` steps on; truncation bootstraps from the true final
observation. ``sample`` never blocks unless given a ``timeout``: with nothing sampleable it raises at once,
saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rlflow import _core
from rlflow import specs as _specs
from rlflow.adders.block import StepBlock
from rlflow.adders.multiagent import MultiAgentTransition
from rlflow.adders.transition import NStepTransition
from rlflow.replay.rate_limiters import MinSize
from rlflow.replay.row_table import RowTable
from rlflow.replay.sample import Sample
from rlflow.replay.selectors import Fifo, Prioritized
from rlflow.replay.storage import StepStore
from rlflow.replay.table import RateLimitTimeout, Table, TableBase
from rlflow.specs import AgentGroup, Field, Spec, SpecError
from rlflow.types import ONE_LANE_NO, ONE_LANE_YES, TimeStep, step_spec

__all__ = ["ReplayBuffer"]

# What each env's last call left (the call classifier's states, as int8).
_NO_EPISODE_YET, _IN_EPISODE, _ENDED = (state.value for state in _core.CallState)


def _as_spec(value: Any) -> Spec:
    if isinstance(value, _specs.Field | dict | tuple):
        return value
    return _specs.from_space(value)  # a gymnasium space


class ReplayBuffer:
    """A fast drop-in replay buffer of n-step transitions (see the module docstring).

    Args:
        observation: a gymnasium space or an rlflow spec of one observation.
        action: a gymnasium space or an rlflow spec of one action.
        capacity: stored steps (rows) in all; each env gets ``capacity // num_envs``.
        n_step: rewards summed per transition.
        discount: the per-step discount.
        prioritized: sample in proportion to priority ``** alpha`` (weights with ``beta``).
        alpha: prioritized replay's priority exponent.
        beta: prioritized replay's importance-weight exponent.
        num_envs: transitions per :meth:`add` call.
        extras: an rlflow spec of per-step extras stored with each transition (e.g. log-probs).
        reward: the Field of one step's reward (default: a float32 scalar).
        groups: a team's agent groups: the observations are multi-agent rows
            (:class:`rlflow.envs.ParallelEnvironment`'s layout, a reward per agent) and samples are
            :class:`~rlflow.adders.MultiAgentTransition`'s, per agent.
        seed: seeds the sampler.
        disk: a directory (created; must be empty) to keep the rows in as numpy memmaps (the store's
            ``"disk"`` backend); None keeps them in memory.
    """

    def __init__(self, observation: Any, action: Any, capacity: int, *, n_step: int = 1, discount: float = 0.99,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4, num_envs: int = 1,
                 extras: Spec | None = None, reward: Field | None = None,
                 groups: Mapping[str, AgentGroup] | None = None,
                 seed: int | None = None, disk: str | Path | None = None) -> None:
        if int(num_envs) < 1 or int(capacity) // int(num_envs) < n_step + 2:
            raise ValueError(f"capacity {capacity} over num_envs {num_envs} leaves fewer than n_step + 2 = "
                             f"{n_step + 2} rows per env")
        self.num_envs = int(num_envs)
        spec = step_spec(_as_spec(observation), _as_spec(action), extras, reward=reward)
        self.store = StepStore(spec, capacity=int(capacity) // self.num_envs, lanes=self.num_envs,
                               backend="memory" if disk is None else "disk", directory=disk)
        self.table: TableBase = (
            Table(self.store, sampler=Prioritized(alpha=alpha, beta=beta, seed=seed), remover=Fifo(),
                  rate_limiter=MinSize(1), name="replay") if prioritized
            else RowTable(self.store, seed=seed, rate_limiter=MinSize(1), name="replay"))
        # One env's transitions are staged: a larger block spreads each write's fixed cost over more adds.
        self.adder = (NStepTransition(self.store, [self.table], n=n_step, discount=discount, stage_steps=256)
                      if groups is None else MultiAgentTransition(self.store, [self.table], n=n_step, discount=discount,
                                                                   groups=groups, stage_steps=256))
        self._checks = StepBlock(spec, np.arange(self.num_envs), 1)  # checks parts of steps (extend, starts)
        self._obs_fields = {n: f for n, f in self.store.fields.items() if n.split("/")[0] == "observation"}
        self._obs_spec = spec["observation"]
        self._single = isinstance(self._obs_spec, _specs.Field)
        first_name, first_field = next(iter(self._obs_fields.items()))
        self._first_ndim = len(first_field.shape)
        self._first_path = first_name.split("/")[1:]
        self._lanes = np.arange(self.num_envs)
        self._no = np.zeros(self.num_envs, bool)
        self._reward_dtype = self.store.fields["reward"].dtype
        self._has_extras = "extras" in spec
        self._state = np.zeros(self.num_envs, np.int8)  # what each env's last call left (_IN_EPISODE, ...)
        self._was = self._state.copy()  # the state before the call in progress (restored if it fails)
        self._reward_in = np.zeros(1, self.store.fields["reward"].dtype)  # an unbatched call's float reward
        self._calls = np.zeros((5, self.num_envs), bool)  # the call classifier's rows (_core.CallRow)
        self._last_next = {n: np.zeros((self.num_envs, *f.shape), f.dtype) for n, f in self._obs_fields.items()}
        self._bind()

    def _bind(self) -> None:
        """The call classifier over the envs' states and last next_obs, and the views of its output rows (at
        construction and unpickling)."""
        self._classifier = _core.CallClassifier(last=list(self._last_next.values()), state=self._state,
                                                was=self._was, calls=self._calls)
        self._obs_leaves = self._checks.leaves_of("observation")
        self._act_leaves = self._checks.leaves_of("action")
        self._call_rows = [self._calls[row.value] for row in (_core.CallRow.TERMINATED, _core.CallRow.TRUNCATED,
                                                              _core.CallRow.RESET, _core.CallRow.LAST)]
        term, trunc, reset, last = self._call_rows
        self._put_flags = (reset, last, term, trunc)  # a put step's first, last, terminated, truncated

    def __getstate__(self) -> dict[str, Any]:
        """The buffer, less what :meth:`_bind` derives (unpickling binds it again over the unpickled arrays)."""
        return {k: v for k, v in self.__dict__.items() if k not in _DERIVED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind()

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
            extras: Any = None, infos: Any = None) -> None:
        """Record one transition per env (see the module docstring); bad input raises and changes nothing.

        ``infos``: the env's info (a gymnasium vector env's dict, or a list of per-env dicts as Stable-Baselines3's
        VecEnv gives); an env that ended with its true final observation there (``final_obs``,
        ``terminal_observation``) has it stored as its ``next_obs``. After an env's episode end, a transition
        whose ``obs`` is bit for bit the end's ``next_obs``, with reward 0 and neither flag, is gymnasium's
        ``NEXT_STEP`` reset step: not stored; its ``next_obs`` starts the env's next episode."""
        e = self.num_envs
        if e == 1 and type(obs) is np.ndarray and self._single:  # one array: its dimensions tell
            batched = obs.ndim != self._first_ndim
        else:
            batched = not (e == 1 and self._unbatched(obs))
        if batched:
            terminated, truncated = _flags("terminated", terminated, e), _flags("truncated", truncated, e)
        else:  # (the compiled call takes one env's observations without the env axis; the rest of add adds it)
            action = action[None] if type(action) is np.ndarray else _lift(action)
            extras = None if extras is None else _lift(extras)
            if type(reward) in _SCALARS:
                self._reward_in[0] = reward  # to the reward's dtype; the block checks it is finite
                reward = self._reward_in
            else:
                reward = _lift(reward)
            if type(terminated) not in _BOOLS:
                terminated = _flag("terminated", terminated)
            if type(truncated) not in _BOOLS:
                truncated = _flag("truncated", truncated)
            terminated = ONE_LANE_YES if terminated else ONE_LANE_NO  # one env's flags: shared read-only arrays
            truncated = ONE_LANE_YES if truncated else ONE_LANE_NO
        if type(reward) is not np.ndarray:
            reward = np.asarray(reward)
        if reward.dtype != self._reward_dtype and reward.dtype.kind in "fiu":
            reward = reward.astype(self._reward_dtype)  # the cast the spec allows (same kind, or int to float)
        # Each env's call sorted against its last next_obs (a reward not [E, ...] counts as zero here; the adder
        # names it), and the envs' states advanced; in the same compiled call, a step that goes on (no episode
        # starts before it, no final observations from infos) is put into the adder's staged block and its
        # next_obs kept. One env's transitions are staged and written in blocks (sample and len write them
        # first); several envs' are written at once, so that a sampler waiting in another thread sees them.
        obs_leaves = self._obs_leaves(obs)
        if infos is None:
            next_leaves = self._obs_leaves(next_obs)
            filler = self.adder.staging()
            bits = self._classifier.add(filler, obs_leaves, self._act_leaves(action), reward,
                                        self._extras_given(extras), next_leaves, terminated, truncated, self._put_flags)
            if bits & _core.CALL_PUT:
                self.adder.staged(write=e > 1)
                if not bits & _core.CALL_KEPT:
                    self._remember(next_obs, next_leaves)
                return
        else:
            bits = self._classifier.classify(obs_leaves, terminated, truncated, reward)
        if not batched:
            obs, next_obs = _lift(obs), _lift(next_obs)
        if bits == _core.CALL_CONVERT:  # obs or reward not as it compares them: judged again as converted
            nonzero = np.not_equal(reward, 0) if reward.dtype.kind in "biufc" else reward  # all it reads of a reward
            converted = self._converted(obs)
            bits = self._classifier.classify(converted, terminated, truncated, nonzero)
            if bits == _core.CALL_CONVERT:
                raise RuntimeError(f"add: the call classifier cannot compare obs converted to the spec's dtypes "
                                   f"({[v.dtype for v in converted or ()]})")
        try:
            if infos is not None:
                last = self._calls[_core.CallRow.LAST.value]
                next_obs, from_infos = self._with_final_observations(next_obs, infos, last, batched)
                self._state[from_infos] = _NO_EPISODE_YET  # no reset step follows a final observation from infos
            term, trunc, reset, last = self._call_rows
            ts = TimeStep(next_obs, reward, term, trunc, reset, last, next_obs if bits & _core.CALL_ANY_LAST else None)
            if bits & _core.CALL_ANY_START:
                self._start_episodes(obs, action, ts, extras)
            (self.adder.stage if e == 1 else self.adder.add)(action, ts, extras)
        except BaseException:
            self._state[:] = self._was
            raise
        self._remember(next_obs, self._obs_leaves(next_obs))

    def _start_episodes(self, obs: Any, action: Any, ts: TimeStep, extras: Any) -> None:
        """Start an episode at ``obs`` for the envs that start one before their transition (ending the one they
        break off, truncated at its last next_obs), having checked the whole call first."""
        e = self.num_envs
        starts = self._calls[_core.CallRow.STARTS.value]
        lanes = self._lanes[starts]
        first = self._checks.columns("observation", _take_rows(obs, lanes, e), lanes.size, "obs")
        stacks = self.adder.open_stacks()
        if stacks is not None:  # lanes that start here continue from their first observation
            for name, stack in stacks.items():
                stack[lanes] = first[name]
        self._checks.start(~self._calls[_core.CallRow.RESET.value], None, stacks)
        self._checks.check(action, ts, extras)
        adder = self.adder
        with self.store.lock:
            broken = self._lanes[starts & (self._was == _IN_EPISODE)]
            if broken.size:
                adder.truncate(broken)
            no = self._no[starts]
            adder.add_first(TimeStep(adder.top_observation(first), np.zeros(lanes.size, np.float32), no, no, ~no, no),
                            lanes=lanes)

    def _extras_given(self, extras: Any) -> tuple[Any, ...]:
        """The leaves of a call's extras as the block filler takes them; ``(None,)``, which it refuses (so that
        the adder's checks name the fault), when extras are missing or come without an extras spec."""
        if (extras is None) == self._has_extras:
            return (None,)
        return () if extras is None else self._checks.leaves("extras", extras)

    def _unbatched(self, obs: Any) -> bool:
        """Whether ``obs`` is one env's observation without the leading env axis (judged by its first field)."""
        leaf = obs
        try:
            for key in self._first_path:
                leaf = leaf[int(key)] if isinstance(leaf, tuple | list) else leaf[key]
        except (KeyError, IndexError, TypeError, ValueError):
            return False
        return np.ndim(leaf) == self._first_ndim

    def _converted(self, obs: Any) -> tuple[np.ndarray, ...] | None:
        """``obs``'s leaves as the call classifier compares them (each cast to its column's dtype where the spec
        allows), or None where they cannot be: no env's ``obs`` is then its last ``next_obs``."""
        try:
            cols = self._checks.columns("observation", obs, self.num_envs, "obs")
        except SpecError:
            return None
        return tuple(np.ascontiguousarray(cols[name]) for name in self._obs_fields)

    def _remember(self, next_obs: Any, leaves: tuple[Any, ...]) -> None:
        """Keep each env's ``next_obs`` (checked by the adder already; ``leaves``: its leaves) for the next call's
        continuity check."""
        if self._classifier.remember(leaves):
            return
        for name, leaf in _specs.flatten_data(self._obs_spec, next_obs, "observation").items():
            self._last_next[name][...] = leaf

    def _with_final_observations(self, next_obs: Any, infos: Any, last: np.ndarray,
                                 batched: bool) -> tuple[Any, np.ndarray]:
        """``next_obs`` (batched) with each ended env's true final observation from ``infos`` (one env's
        own info for an unbatched call), and the envs that got one."""
        e = self.num_envs
        finals = _final_observations(infos, e, batched)
        ended = [i for i in finals if last[i]]
        got = np.zeros(e, bool)
        got[ended] = True
        if not ended:
            return next_obs, got
        try:
            return _with_rows(next_obs, {i: finals[i] for i in ended}), got
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise SpecError(f"infos: the final observations of envs {ended} do not fit next_obs: {exc!r}") from None

    def flush(self) -> None:
        """Write the staged transitions to the store and table (sampling does this itself)."""
        self.adder.flush()

    def sample(self, batch_size: int, *, timeout: float | None = 0.0) -> Sample:
        """``batch_size`` transitions: ``sample.data`` is a :class:`~rlflow.replay.views.Transition`.

        With no transition sampleable it raises :class:`~rlflow.replay.RateLimitTimeout` at once, saying how
        many transitions the buffer holds and when they become sampleable. ``timeout`` (seconds; ``None``:
        no limit) waits that long for another thread's adds first."""
        self.flush()
        try:
            return self.table.sample(batch_size, timeout=timeout)
        except RateLimitTimeout as exc:
            raise RateLimitTimeout(self._nothing_sampleable(batch_size, timeout)) from exc

    def _nothing_sampleable(self, batch_size: int, timeout: float | None) -> str:
        """Why :meth:`sample` found no transition to draw, and what to do."""
        waiting = int(self.adder.waiting_actions().sum())
        n = self.adder.n
        head = f"ReplayBuffer.sample({batch_size}): no transition is sampleable" + (
            f" after waiting {timeout:g} s" if timeout else "")
        wait = "" if timeout else ", or pass timeout= (seconds; None: no limit) to wait for another thread's adds"
        if not waiting:
            return f"{head}: the buffer holds none; add transitions first{wait}"
        return (f"{head}: the buffer holds {waiting} transition(s) that wait for their episode to go on: with "
                f"n_step={n} a transition becomes sampleable once {n - 1} more of its episode are added, or when "
                f"the episode ends (terminated, truncated, or closed by end_episodes()); add more or call "
                f"end_episodes(){wait}")

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of sampled transitions (keys of overwritten ones are skipped)."""
        return self.table.update_priorities(keys, priorities)

    def extend(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
               extras: Any = None) -> None:
        """Record ``T`` consecutive transitions of each env: every argument leads with ``T`` (then ``E`` with
        several envs), in time order. The same transitions as ``T`` calls of :meth:`add` (continuity,
        episode ends and restarts judged the same way; item keys aside), written as one block per env.
        Everything is checked first: bad input raises and changes nothing."""
        self.flush()
        e = self.num_envs
        term, trunc = _step_flags("terminated", terminated, e), _step_flags("truncated", truncated, e)
        t = term.shape[0]
        if trunc.shape[0] != t:
            raise SpecError(f"extend: terminated and truncated: expected the same number of steps, got {t} and "
                            f"{trunc.shape[0]}")
        if not t:
            return
        if extras is None and self._has_extras:
            raise SpecError("extend: the buffer stores extras; pass extras=")
        if extras is not None and not self._has_extras:
            raise SpecError("extend: extras given, but the buffer has no extras spec")
        # Every env's steps are judged and put into a block first (each checked there); then the blocks are written.
        puts = []
        for lane in range(e):
            o, a, r, x, n = (v if e == 1 or v is None else _take(v, lane)
                             for v in (obs, action, reward, extras, next_obs))
            puts.append(self._put_lane(lane, o, a, r, x, n, np.ascontiguousarray(term[:, lane]),
                                       np.ascontiguousarray(trunc[:, lane])))
        for lane, put in enumerate(puts):
            self._write_lane(lane, put)

    def _put_lane(self, lane: int, obs: Any, action: Any, reward: Any, extras: Any, next_obs: Any,
                  terminated: np.ndarray, truncated: np.ndarray) -> _LanePut:
        """:meth:`extend` of env ``lane`` judged as :meth:`add` judges its calls and put into a block, nothing
        written, in one compiled call (``CallClassifier.extend``): NEXT_STEP reset steps are left out (the step
        after each starts the next episode, at its obs: the reset step's next_obs), an episode starts at the obs
        of each step that starts one, and where no episode ended before such a step, the episode before is
        truncated at the step before it, as :meth:`add` does. What the block filler cannot take as it comes is
        converted (cast where the spec allows) and put again; bad input raises."""
        t = terminated.size
        if type(reward) is not np.ndarray:
            reward = np.asarray(reward)
        if reward.shape[:1] != (t,):
            raise SpecError(f"extend: reward: expected a leading axis of {t} steps (as the flags), got shape "
                            f"{reward.shape}")
        checks, adder = self._checks, self.adder
        block = adder.lane_block(t, lane)  # a block per env: every env's steps are put before any is written
        given = {"observation": obs, "action": action, "reward": reward, "extras": extras, "next_obs": next_obs}
        parts = {"observation": self._obs_leaves(obs), "action": self._act_leaves(action), "reward": reward,
                 "extras": self._extras_given(extras), "next_obs": self._obs_leaves(next_obs)}
        converted: set[str] = set()
        while True:
            adder.begin_steps(block, lane)
            put = self._classifier.extend(block.filler, lane, parts["observation"], parts["action"], parts["reward"],
                                          parts["extras"], parts["next_obs"], terminated, truncated)
            if not put.judged:  # obs, next_obs or the reward as the classifier compares them
                todo = ["observation", "next_obs", "reward"]
            elif put.status is _core.Put.OK:
                break
            elif put.status is _core.Put.CONVERT:
                todo = [_EXTEND_PART[block.filler.fault_part]]
            else:
                raise self._extend_fault(put, block, given, t)
            if converted.issuperset(todo):
                raise RuntimeError(f"extend: the block filler cannot take {todo} converted to the spec's dtypes")
            for key in todo:
                cols = self._extend_columns(key, given[key], t)
                leaves = tuple(np.ascontiguousarray(v) for v in cols.values())
                parts[key] = leaves[0] if key == "reward" else leaves
                converted.add(key)
        then = None  # the episode the last step starts (a reset step's next_obs starts the next one, as add does)
        reset = put.reset
        if reset is not None:  # their next_obs are not stored (but the last's): checked as observations that start one
            resets = np.flatnonzero(reset)
            firsts = checks.starts(self._observation_rows(parts["next_obs"], resets), np.full(resets.size, lane),
                                   "extend: next_obs", f"extend: next_obs of reset steps {resets.tolist()}")
            then = {name: v[-1:] for name, v in firsts.items()} if reset[-1] else None
        if not put.steps:
            return _LanePut(None, None, then, (), False)
        i = put.first_step  # (checked by the compiled call, which starts the block there)
        start = ({name: np.asarray(leaf)[i:i + 1] for name, leaf in zip(self._obs_fields, parts["observation"],
                                                                        strict=True)} if put.starts else None)
        last = tuple(np.asarray(leaf)[put.last_step] for leaf in parts["next_obs"])
        return _LanePut(block, start, then, last, put.ended)

    def _extend_fault(self, put: _core.StepsPut, block: StepBlock, given: dict[str, Any], t: int) -> Exception:
        """The error of a fault of :meth:`_put_lane`'s block filler (bad values are named by the spec's checks)."""
        i = put.fault_step
        if put.status in (_core.Put.STACK_BREAK, _core.Put.STACK_START):
            return block.stack_error(put.status, f"extend: obs[{i}]" if put.fault_first else f"extend: next_obs[{i}]")
        if put.status is _core.Put.VALUE:
            for key in ("action", "reward", "extras", "next_obs", "observation"):
                if given[key] is not None:
                    self._extend_columns(key, given[key], t)  # raises
        return RuntimeError(f"extend: the block filler's fault {put.status} at step {i} that the spec's checks pass")

    def _extend_columns(self, key: str, value: Any, t: int) -> dict[str, np.ndarray]:
        """:meth:`extend`'s argument ``key`` (``[t, ...]``) as checked columns; SpecError naming the argument."""
        spec_key, name = _EXTEND_ARG[key]
        return self._checks.columns(spec_key, value, t, f"extend: {name}")

    def _observation_rows(self, leaves: tuple[Any, ...], rows: Any) -> Any:
        """Rows ``rows`` of observations given as leaves (in the store's column order), nested as the spec."""
        return self.adder.top_observation({name: np.asarray(leaf)[rows]
                                           for name, leaf in zip(self._obs_fields, leaves, strict=True)})

    def _write_lane(self, lane: int, put: _LanePut) -> None:
        """Write what :meth:`_put_lane` put for env ``lane``: the episode started before its steps (ending the one
        in progress as truncated), the steps, and the episode started after them."""
        if put.start is not None:
            with self.store.lock:
                if self._state[lane] == _IN_EPISODE:
                    self.adder.truncate([lane])
                self._start(lane, put.start)
        if put.block is not None:
            self.adder.write(put.block)
            for name, row in zip(self._obs_fields, put.last_next, strict=True):
                self._last_next[name][lane] = row
            self._state[lane] = _ENDED if put.ended else _IN_EPISODE
        if put.then is not None:
            self._start(lane, put.then)

    def _start(self, lane: int, first: dict[str, np.ndarray]) -> None:
        """Start ``lane``'s next episode at ``first`` (checked columns of one observation)."""
        adder = self.adder
        adder.add_first(TimeStep(adder.top_observation(first), np.zeros(1, np.float32), self._no[:1],
                                 self._no[:1], ~self._no[:1], self._no[:1]), lanes=[lane])
        for name, v in first.items():
            self._last_next[name][lane] = v[0]
        self._state[lane] = _IN_EPISODE

    def end_episodes(self) -> None:
        """Close every episode in progress as truncated, so its last transitions become sampleable."""
        self.adder.truncate()
        self._state[:] = _NO_EPISODE_YET

    def __len__(self) -> int:
        """Transitions held."""
        self.flush()
        return self.table.size

    def __repr__(self) -> str:
        return f"ReplayBuffer(n_step={self.adder.n}, envs={self.num_envs}, size={len(self)}, table={self.table!r})"


def _flag(name: str, value: Any) -> bool:
    if type(value) is bool or isinstance(value, np.bool_) or (isinstance(value, int | np.integer) and value in (0, 1)):
        return bool(value)
    arr = np.asarray(value)
    if arr.shape in ((), (1,)) and (arr.dtype == np.bool_ or (arr.dtype.kind in "iu" and arr.item() in (0, 1))):
        return bool(arr.item())
    raise SpecError(f"{name}: expected a bool, got {value!r}")


def _flags(name: str, value: Any, n: int) -> np.ndarray:
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if arr.shape != (n,) or arr.dtype != np.bool_:
        if arr.shape == (n,) and arr.dtype.kind in "iu" and ((arr == 0) | (arr == 1)).all():
            return arr.astype(bool)
        raise SpecError(f"{name}: expected {n} bools (one per env), got {arr.dtype} {arr.shape}")
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _step_flags(name: str, value: Any, envs: int) -> np.ndarray:
    """``extend``'s flags as bools ``[T, envs]``: given as ``[T]`` for one env, ``[T, E]`` for several."""
    arr = value if type(value) is np.ndarray else np.asarray(value)
    ok = arr.ndim == 1 if envs == 1 else (arr.ndim == 2 and arr.shape[1] == envs)
    if ok and arr.dtype != np.bool_ and arr.dtype.kind in "iu" and ((arr == 0) | (arr == 1)).all():
        arr = arr.astype(bool)
    if not ok or arr.dtype != np.bool_:
        raise SpecError(f"{name}: expected bools of shape {'[T]' if envs == 1 else f'[T, {envs}]'}, got "
                        f"{arr.dtype} {arr.shape}")
    return arr.reshape(arr.shape[0], envs)


def _final_observations(infos: Any, envs: int, batched: bool) -> dict[int, Any]:
    """The true final observations an env's ``infos`` holds, by env: gymnasium's ``final_obs`` (a vector env's
    ``[E]`` objects with their mask ``_final_obs``; one env's observation for an unbatched call) or
    Stable-Baselines3's ``terminal_observation`` (a list of ``E`` per-env dicts)."""
    if isinstance(infos, Mapping):
        final = infos.get("final_obs")
        if final is None:
            return {}
        if not batched:
            return {0: final}
        mask = np.asarray(infos.get("_final_obs", np.ones(envs, bool)))
        if mask.shape != (envs,) or len(final) != envs:
            raise SpecError(f"infos['final_obs']: expected one entry per env ({envs}) with its mask "
                            f"infos['_final_obs'], got {len(final)} entries and a mask of shape {mask.shape}")
        return {i: final[i] for i in np.flatnonzero(mask).tolist()}
    if isinstance(infos, list | tuple) and all(isinstance(info, Mapping) for info in infos):
        if len(infos) != envs:
            raise SpecError(f"infos: expected one info dict per env ({envs}), got {len(infos)}")
        return {i: info["terminal_observation"] for i, info in enumerate(infos) if "terminal_observation" in info}
    raise SpecError(f"infos: expected the env's info dict (gymnasium) or a list of per-env info dicts "
                    f"(Stable-Baselines3), got {type(infos).__name__}")


def _with_rows(value: Any, rows: dict[int, Any]) -> Any:
    """A copy of batched (nested) ``value`` whose env rows ``rows`` are replaced by the given observations."""
    if isinstance(value, Mapping):
        return {k: _with_rows(v, {i: row[k] for i, row in rows.items()}) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_with_rows(v, {i: row[j] for i, row in rows.items()}) for j, v in enumerate(value))
    out = np.array(value)
    for i, row in rows.items():
        out[i] = row
    return out


def _take(value: Any, lane: int) -> Any:
    """Env ``lane``'s steps of a ``[T, E, ...]`` argument (nested dicts and tuples followed)."""
    if isinstance(value, dict):
        return {k: _take(v, lane) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_take(v, lane) for v in value)
    arr = np.asarray(value)
    if arr.ndim < 2:
        raise SpecError(f"extend: expected a leading axis of steps and one of envs, got shape {arr.shape}")
    return np.ascontiguousarray(arr[:, lane])


def _lift(value: Any) -> Any:
    """One env's argument with the env axis added to each leaf (nested dicts and tuples followed)."""
    if type(value) is np.ndarray:
        return value[None]
    if isinstance(value, dict):
        return {k: _lift(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_lift(v) for v in value)
    return (value if type(value) is np.ndarray else np.asarray(value))[None]


def _take_rows(value: Any, rows: np.ndarray, envs: int) -> Any:
    """Env rows ``rows`` of a batched argument (nested dicts and tuples followed; all of it when every env)."""
    if rows.size == envs:
        return value
    if isinstance(value, dict):
        return {k: _take_rows(v, rows, envs) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_take_rows(v, rows, envs) for v in value)
    return np.asarray(value)[rows]


class _LanePut(NamedTuple):
    """One env's steps of an extend, checked and put, to be written: the block (None: no transition among them),
    the checked observation an episode starts at before them and the one after them (or None), the last next_obs
    (one row per observation column), and whether the last transition ends its episode."""

    block: StepBlock | None
    start: dict[str, np.ndarray] | None
    then: dict[str, np.ndarray] | None
    last_next: tuple[Any, ...]
    ended: bool


# extend's parts: the block filler's part of each (as it names faults); each part's spec key and argument name.
_EXTEND_PART = {_core.Part.ACTION: "action", _core.Part.REWARD: "reward", _core.Part.EXTRAS: "extras",
                _core.Part.OBSERVATION: "next_obs", _core.Part.FINAL: "next_obs"}
_EXTEND_ARG = {"observation": ("observation", "obs"), "next_obs": ("observation", "next_obs"),  # (spec key, name)
               "action": ("action", "action"), "reward": ("reward", "reward"), "extras": ("extras", "extras")}

# What ReplayBuffer._bind derives, and what a pickle leaves out.
_DERIVED = frozenset({"_classifier", "_call_rows", "_obs_leaves", "_act_leaves", "_put_flags"})

# Rewards of one env given as a number: written into the reward's dtype without making an array of them.
_SCALARS = frozenset({float, int, np.float64, np.float32, np.float16, np.int64, np.int32})
_BOOLS = frozenset({bool, np.bool_})  # flags of one env taken as they come
