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

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlflow import specs as _specs
from rlflow.replay.rate_limiters import MinSize
from rlflow.replay.row_table import RowTable
from rlflow.replay.sample import Sample
from rlflow.replay.selectors import Fifo, Prioritized
from rlflow.replay.storage import StepStore
from rlflow.replay.table import RateLimitTimeout, Table
from rlflow.specs import Spec, SpecError
from rlflow.types import TimeStep, step_spec

_BLOCK_BYTES = 8 << 20  # the most memory a one-env block of staged transitions takes
_FLAG_NAMES = ("terminated", "truncated", "first", "last")
_KA: Any = None  # rlflow.adders._kernels, loaded with the first buffer (the adders build on this package)

__all__ = ["ReplayBuffer"]


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
        alpha, beta: prioritized replay exponents.
        num_envs: transitions per :meth:`add` call.
        extras: an rlflow spec of per-step extras stored with each transition (e.g. log-probs).
        seed: seeds the sampler.
        backend, directory: the store's backend (``"memory"`` or ``"disk"``) and the disk directory.
    """

    def __init__(self, observation: Any, action: Any, capacity: int, *, n_step: int = 1, discount: float = 0.99,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4, num_envs: int = 1,
                 extras: Spec | None = None, seed: int | None = None, backend: str = "memory",
                 directory: Any = None) -> None:
        global _KA
        from rlflow.adders import _kernels
        from rlflow.adders.transition import NStepTransition  # adders build on this package

        _KA = _kernels

        if int(num_envs) < 1 or int(capacity) // int(num_envs) < n_step + 2:
            raise ValueError(f"capacity {capacity} over num_envs {num_envs} leaves fewer than n_step + 2 = "
                             f"{n_step + 2} rows per env")
        self.num_envs = int(num_envs)
        spec = step_spec(_as_spec(observation), _as_spec(action), extras)
        self.store = StepStore(spec, capacity=int(capacity) // self.num_envs, lanes=self.num_envs,
                               backend=backend, directory=directory)
        self.table: Table = (
            Table(self.store, sampler=Prioritized(alpha=alpha, beta=beta, seed=seed), remover=Fifo(),
                  rate_limiter=MinSize(1), name="replay") if prioritized
            else RowTable(self.store, seed=seed, rate_limiter=MinSize(1), name="replay"))
        self.adder = NStepTransition(self.store, [self.table], n=n_step, discount=discount)
        self._obs_fields = self.adder._obs_fields
        self._lanes = np.arange(self.num_envs)
        self._no = np.zeros(self.num_envs, bool)
        first_name, first_field = next(iter(self._obs_fields.items()))
        self._single = len(first_field.shape)
        self._first_path = first_name.split("/")[1:]
        self._leaves = {key: (spec[key], [(n, path, f) for n, f in self.store.fields.items()
                                          for path in [_path(n, key)] if path is not False])
                        for key in ("observation", "action", "reward", "extras") if key in spec}
        # One env: transitions are staged in a block of rows and reach the adder (add_steps) together.
        row_bytes = sum(f.nbytes for name, f in self.store.fields.items() if name not in _FLAG_NAMES)
        k = max(1, min(256, self.store.capacity - n_step - 2, _BLOCK_BYTES // max(1, row_bytes)))
        self._block = {name: np.zeros((k, *f.shape), f.dtype) for name, f in self.store.fields.items()
                       if any(_path(name, key) is not False for key in ("observation", "action", "reward", "extras"))
                       } if self.num_envs == 1 else {}
        self._block_rows = np.zeros(1, np.int64)  # rows staged
        # Episodes that ended in the block: the rows they end after, how (1 terminated, 2 truncated), and
        # the first observations of the episodes that followed (``_firsts[name][:_num_firsts]``).
        self._ends: list[int] = []
        self._codes: list[int] = []
        self._firsts = {name: np.zeros_like(col) for name, col in self._block.items() if name in self._obs_fields}
        self._num_firsts = 0
        self._last_next_given: Any = None  # the next_obs object of the last staged transition (identity check)
        # Per env: its last transition ended an episode with next_obs as given (not from infos), so a NEXT_STEP
        # reset step may follow (see add).
        self._after_end = np.zeros(self.num_envs, bool)
        self._fast = _fast_plan(self.adder, self._block) if self.num_envs == 1 else None

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
            extras: Any = None, infos: Any = None) -> None:
        """Record one transition per env (see the module docstring); bad input raises and changes nothing.

        ``infos``: the env's info (a gymnasium vector env's dict, or a list of per-env dicts as Stable-Baselines3's
        VecEnv gives); an env that ended with its true final observation there (``final_obs``,
        ``terminal_observation``) has it stored as its ``next_obs``. After an env's episode end, a transition
        whose ``obs`` is bit for bit the end's ``next_obs``, with reward 0 and neither flag, is gymnasium's
        ``NEXT_STEP`` reset step: not stored; its ``next_obs`` starts the env's next episode."""
        if infos is not None:
            self._add_with_infos(obs, action, reward, next_obs, terminated, truncated, extras, infos)
            return
        if obs is self._last_next_given and obs is not None:  # one env, going on from the last next_obs
            fast = self._fast
            if fast is not None and extras is None:  # one compiled call checks and stages the row
                (act_dtype, act_shape, act_scalars, rew_scalars, obs_dtype, obs_shape, checks, act_blk, rew_blk,
                 obs_blk) = fast
                ta = type(action)
                if ((ta is np.ndarray and action.dtype is act_dtype and action.shape == act_shape)
                        or ta in act_scalars) and type(reward) in rew_scalars and type(next_obs) is np.ndarray \
                        and next_obs.dtype is obs_dtype and next_obs.shape == obs_shape \
                        and type(terminated) in _BOOLS and type(truncated) in _BOOLS:
                    try:
                        rows = _KA.stage_row(self._block_rows, checks, action, act_blk, reward, rew_blk, next_obs,
                                             obs_blk)
                    except (OverflowError, TypeError):  # e.g. a Python int beyond int64: the general path says why
                        rows = -1
                    if rows > 0:
                        self._staged_one(next_obs, bool(terminated), bool(truncated), rows)
                        return
            self._add_one(obs, action, reward, next_obs, terminated, truncated, extras)
            return
        if self.num_envs == 1 and self._unbatched(obs):
            self._add_one(obs, action, reward, next_obs, terminated, truncated, extras)
            return
        self.flush()
        terminated = _flags("terminated", terminated, self.num_envs)
        truncated = _flags("truncated", truncated, self.num_envs) & ~terminated  # termination wins
        reward = reward if type(reward) is np.ndarray else np.asarray(reward, np.float32)
        adder = self.adder
        last = terminated | truncated
        open_rows = adder._open
        if open_rows.min() >= 0 and self._continues(obs, open_rows):
            ts = TimeStep(next_obs, reward, terminated, truncated, self._no, last, next_obs if last.any() else None)
            adder.add(action, ts, extras)  # the common call: every env goes on from its previous next_obs
            self._after_end = last
            return
        # Check the whole call before anything changes, then close broken episodes and start new ones.
        obs_flat = adder._check(self._obs_fields, {"observation": obs}, self.num_envs, "obs")
        step = {"action": action, "reward": reward, **({"extras": extras} if extras is not None else {})}
        checked = adder._check({**adder._act_fields, **adder._reward_fields, **adder._extra_fields}, step,
                               self.num_envs, "add")
        adder._check(self._obs_fields, {"observation": next_obs}, self.num_envs, "next_obs")
        # NEXT_STEP reset steps: their env starts its next episode at next_obs, with no transition.
        quiet = (checked["reward"].reshape(self.num_envs, -1) == 0).all(axis=1) & ~last
        reset = self._ends_again(obs_flat, self._after_end & quiet)
        with self.store.lock:
            is_open = open_rows >= 0
            same = self._same_rows(obs_flat, open_rows)
            adder.truncate(self._lanes[is_open & ~same])
            start = self._lanes[~(is_open & same) & ~reset]
            if start.size:
                sub = {k: v[start] for k, v in obs_flat.items()}
                adder.add_first(TimeStep(adder._top(sub)["observation"], np.zeros(start.size, np.float32),
                                         self._no[start], self._no[start], ~self._no[start], self._no[start]),
                                lanes=start)
            adder.add(action, TimeStep(next_obs, reward, terminated, truncated, reset, last,
                                       next_obs if last.any() else None), extras)
        self._after_end = last

    def _ends_again(self, obs_flat: dict[str, np.ndarray], candidates: np.ndarray) -> np.ndarray:
        """Per env: a candidate whose ``obs`` (checked columns ``[E, ...]``) is, bit for bit, the final
        observation its episode ended on (its lane's last row): a NEXT_STEP reset step."""
        out = np.zeros_like(candidates)
        lanes = np.flatnonzero(candidates)
        if lanes.size:
            out[lanes] = self._final_rows_equal(lanes, {name: v[lanes] for name, v in obs_flat.items()})
        return out

    def _final_rows_equal(self, lanes: np.ndarray, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Per lane of ``lanes``: whether ``obs`` (checked columns, leading axis ``lanes``) is, bit for bit, the
        lane's last row."""
        pos = (self.store.count[lanes] - 1) % self.store.capacity
        equal = np.ones(lanes.size, bool)
        for name, value in obs.items():
            equal &= ~_rows_differ(value, self.store.columns[name][lanes, pos])
        return equal

    def _add_with_infos(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                        extras: Any, infos: Any) -> None:
        """:meth:`add` with the env's ``infos``: each ended env's true final observation found there replaces
        its ``next_obs`` (no NEXT_STEP reset step follows such an end)."""
        batched = not (self.num_envs == 1 and self._unbatched(obs))
        if batched:
            done = _flags("terminated", terminated, self.num_envs) | _flags("truncated", truncated, self.num_envs)
        else:
            done = np.array([_flag("terminated", terminated) or _flag("truncated", truncated)])
        finals = _final_observations(infos, done.size, batched)
        ended = [i for i in finals if done[i]]
        if ended and batched:
            try:
                next_obs = _with_rows(next_obs, {i: finals[i] for i in ended})
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise SpecError(f"infos: the final observations of envs {ended} do not fit next_obs: {exc!r}") from None
        elif ended:
            next_obs = finals[0]
        self.add(obs, action, reward, next_obs, terminated, truncated, extras)
        self._after_end[ended] = False

    # ------------------------------------------------------------------ one env, one transition per call
    def _add_one(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                 extras: Any) -> None:
        """Check one transition and stage it; staged steps reach the table in blocks (:meth:`flush`)."""
        leaves = self._leaves
        nxt = _row(*leaves["observation"], next_obs, "next_obs")
        act = _row(*leaves["action"], action, "action")
        rew = _row(*leaves["reward"], reward, "reward")
        ext = {}
        if "extras" in leaves:
            if extras is None:
                raise SpecError(f"add: the buffer stores extras {list(self.adder._extra_fields)}; pass extras=")
            ext = _row(*leaves["extras"], extras, "extras")
        elif extras is not None:
            raise SpecError("add: extras given, but the buffer has no extras spec")
        term, trunc = _flag("terminated", terminated), _flag("truncated", truncated)
        if (self._after_end[0] and not (term or trunc) and all(not v.any() for v in rew.values())
                and self._is_last_next(obs)):
            self._restart(nxt)  # a NEXT_STEP reset step: next_obs starts the next episode
            self._last_next_given = next_obs
            self._after_end[0] = False
            return
        if obs is not self._last_next_given and not self._continues_one(obs):
            first = _row(*leaves["observation"], obs, "obs")  # a new episode: check its observation too
            if self._ended:
                self._restart(first)
            else:
                self.flush()
                with self.store.lock:
                    self.adder.truncate()
                    self._restart(first)
        s = int(self._block_rows[0])
        for part in (nxt, act, rew, ext):
            for name, value in part.items():
                self._block[name][s] = value
        self._block_rows[0] = s + 1
        self._after_end[0] = False
        self._staged_one(next_obs, term, trunc, s + 1)

    def _restart(self, first: dict[str, np.ndarray]) -> None:
        """Start the one env's next episode at ``first`` (checked columns of one observation): in the block
        when the episode before ended there, else in the store (no episode is in progress)."""
        if self._ended:
            k = self._num_firsts
            for name, value in first.items():
                self._firsts[name][k] = value
            self._num_firsts = k + 1
            return
        self.flush()
        start = self.adder._top({k: v[None] for k, v in first.items()})["observation"]
        self.adder.add_first(TimeStep(start, np.zeros(1, np.float32), self._no, self._no, ~self._no, self._no))

    def _is_last_next(self, obs: Any) -> bool:
        """Whether ``obs`` is, bit for bit, the one env's last next_obs: staged in the block, or the last row
        of its lane."""
        try:
            got = _row(*self._leaves["observation"], obs, "obs")
        except SpecError:
            return False
        s = int(self._block_rows[0])
        if not s:
            return bool(self._final_rows_equal(np.zeros(1, np.int64), {k: v[None] for k, v in got.items()})[0])
        return all(value.tobytes() == self._block[name][s - 1].tobytes() for name, value in got.items())

    def _staged_one(self, next_obs: Any, terminated: bool, truncated: bool, rows: int) -> None:
        """After a transition is staged (``rows`` now held): remember its next_obs, or that the episode ended
        (the block goes on with the next one); write the block when it is full."""
        self._last_next_given = next_obs
        if terminated or truncated:
            self._ends.append(rows)
            self._codes.append(1 if terminated else 2)
            self._last_next_given = None
            self._after_end[0] = True
        if rows >= len(self._block["reward"]):
            self.flush()

    @property
    def _ended(self) -> bool:
        """Whether an episode ended in the block and the next has not started yet (its first observation is
        the next call's ``obs``)."""
        return len(self._ends) > self._num_firsts

    def _continues_one(self, obs: Any) -> bool:
        """Whether ``obs`` equals the last next_obs of the one env's episode in progress (bit for bit)."""
        s = int(self._block_rows[0])
        row = int(self.adder._open[0])
        if self._ended or (not s and row < 0):
            return False
        try:
            got = _row(*self._leaves["observation"], obs, "obs")
        except SpecError:
            return False
        k = self._num_firsts
        fresh = k and self._ends[k - 1] == s  # the newest episode has its first observation and no row yet
        for name, value in got.items():
            prev = (self._firsts[name][k - 1] if fresh else self._block[name][s - 1] if s
                    else self.store.columns[name][0, row % self.store.capacity])
            if value.tobytes() != np.ascontiguousarray(prev).tobytes():
                return False
        return True

    def flush(self) -> None:
        """Write the staged single-env transitions to the store and table (sampling does this itself): one
        ``add_steps`` call, over the episodes that ended in the block and those that followed them. The
        block is emptied only once that call has written it: should it raise, the transitions stay staged."""
        n = int(self._block_rows[0])
        if not n:
            return
        adder = self.adder
        top = adder._top({name: col[:n] for name, col in self._block.items()})
        if not self._ends:
            adder.add_steps(0, top["action"], top["reward"], top["observation"], extras=top.get("extras"))
        else:
            terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
            for end, code in zip(self._ends, self._codes, strict=True):
                (terminated if code == 1 else truncated)[end - 1] = True
            k = self._num_firsts
            firsts = adder._top({name: col[:k] for name, col in self._firsts.items()})["observation"] if k else None
            adder.add_steps(0, top["action"], top["reward"], top["observation"], terminated=terminated,
                            truncated=truncated, extras=top.get("extras"), first_observations=firsts)
        self._block_rows[0] = 0
        self._ends, self._codes, self._num_firsts = [], [], 0

    def _unbatched(self, obs: Any) -> bool:
        """Whether ``obs`` is one env's observation without the leading env axis (judged by its first field)."""
        leaf = obs
        path = self._first_path
        try:
            for key in path:
                leaf = leaf[int(key)] if isinstance(leaf, tuple | list) else leaf[key]
        except (KeyError, IndexError, TypeError, ValueError):
            return False
        return np.ndim(leaf) == self._single

    def _continues(self, obs: Any, open_rows: np.ndarray) -> bool:
        """Whether ``obs`` equals every env's stored open-row observation (the previous ``next_obs``)."""
        if len(self._obs_fields) != 1 or type(obs) is not np.ndarray:
            return False
        name = next(iter(self._obs_fields))
        col = self.store.columns[name]
        r0 = open_rows[0]
        if self.num_envs == 1 or (open_rows == r0).all():
            return bool(np.array_equal(col[:, int(r0) % self.store.capacity], obs))
        return bool(np.array_equal(col[self._lanes, open_rows % self.store.capacity], obs))

    def _same_rows(self, obs_flat: dict[str, np.ndarray], open_rows: np.ndarray) -> np.ndarray:
        """Per env: is there an open row and does its observation equal ``obs``."""
        same = open_rows >= 0
        if not same.any():
            return same
        lanes = self._lanes[same]
        pos = open_rows[same] % self.store.capacity
        for name, value in obs_flat.items():
            stored = self.store.columns[name][lanes, pos]
            eq = stored == value[lanes]
            if eq.ndim > 1:
                eq = eq.reshape(lanes.size, -1).all(axis=1)
            same[lanes[~eq]] = False
        return same

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
        episode ends and restarts judged the same way; item keys aside), written with one ``add_steps``
        call per env. Everything is checked first: bad input raises and changes nothing."""
        self.flush()
        e = self.num_envs
        term, trunc = _step_flags("terminated", terminated, e), _step_flags("truncated", truncated, e)
        t = term.shape[0]
        if trunc.shape[0] != t:
            raise SpecError(f"extend: terminated and truncated: expected the same number of steps, got {t} and "
                            f"{trunc.shape[0]}")
        trunc = trunc & ~term  # a step both terminated and truncated is terminated, as in add
        if not t:
            return
        adder = self.adder
        checked = []
        for lane in range(e):
            def pick(x: Any, lane: int = lane) -> Any:
                return x if e == 1 or x is None else _take(x, lane)
            checked.append((adder._obs_columns(pick(obs), t, "extend: obs"),
                            adder._obs_columns(pick(next_obs), t, "extend: next_obs"),
                            adder._step_columns(pick(action), pick(reward), pick(extras), t, "extend")))
        for lane, (o, nxt, cols) in enumerate(checked):
            self._extend_lane(lane, t, o, nxt, cols, term[:, lane], trunc[:, lane])
        self._last_next_given = None

    def _extend_lane(self, lane: int, t: int, obs: dict[str, np.ndarray], nxt: dict[str, np.ndarray],
                     cols: dict[str, np.ndarray], terminated: np.ndarray, truncated: np.ndarray) -> None:
        """:meth:`extend` of one env, its columns checked: an episode starts wherever ``obs`` is not the step
        before's ``next_obs`` (bit for bit) or that step ended one; without an end there, the episode
        before is truncated at that ``next_obs``, as :meth:`add` does."""
        reset = self._reset_steps(lane, obs, nxt, cols["reward"], terminated, truncated)
        first = None
        if reset[-1]:  # the last step's next_obs starts the next episode, as add does
            first = self.adder._top({name: v[-1:] for name, v in nxt.items()})["observation"]
        if reset.any():  # NEXT_STEP reset steps are left out: the step after each starts the next episode
            keep = ~reset
            obs, nxt, cols = ({name: v[keep] for name, v in part.items()} for part in (obs, nxt, cols))
            terminated, truncated, t = terminated[keep], truncated[keep], int(keep.sum())
        if t:
            self._write_lane(lane, t, obs, nxt, cols, terminated, truncated)
        if first is not None:
            self.adder.add_first(TimeStep(first, np.zeros(1, np.float32), self._no[:1], self._no[:1], ~self._no[:1],
                                          self._no[:1]), lanes=None if self.num_envs == 1 else [lane])
        self._after_end[lane] = first is None and bool(t) and bool(terminated[-1] | truncated[-1])

    def _reset_steps(self, lane: int, obs: dict[str, np.ndarray], nxt: dict[str, np.ndarray], reward: np.ndarray,
                     terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
        """Per step of :meth:`extend` of one env: whether it is a NEXT_STEP reset step (see :meth:`add`): right
        after an episode end, ``obs`` is that end's next_obs bit for bit, reward 0, neither flag."""
        t = terminated.size
        ended = terminated | truncated
        after_end = np.concatenate([self._after_end[lane:lane + 1], ended[:-1]])
        reset = after_end & (reward.reshape(t, -1) == 0).all(axis=1) & ~ended
        if reset.any():
            for name in obs:
                reset[1:] &= ~_rows_differ(obs[name][1:], nxt[name][:-1])
            reset[0] = reset[0] and self._is_final_row(lane, {name: v[0] for name, v in obs.items()})
        return reset

    def _write_lane(self, lane: int, t: int, obs: dict[str, np.ndarray], nxt: dict[str, np.ndarray],
                    cols: dict[str, np.ndarray], terminated: np.ndarray, truncated: np.ndarray) -> None:
        """:meth:`_extend_lane`'s steps (reset steps left out) through ``add_steps``."""
        adder = self.adder
        starts = np.zeros(t, bool)
        for name in obs:
            starts[1:] |= _rows_differ(obs[name][1:], nxt[name][:-1])
        starts[1:] |= terminated[:-1] | truncated[:-1]
        cut = np.append(starts[1:] & ~(terminated[:-1] | truncated[:-1]), False)  # the step before a jump
        if not self._goes_on(lane, obs):
            with self.store.lock:
                if adder._open[lane] >= 0:
                    adder.truncate([lane])
                first = adder._top({name: v[:1] for name, v in obs.items()})["observation"]
                adder.add_first(TimeStep(first, np.zeros(1, np.float32), self._no[:1], self._no[:1],
                                         ~self._no[:1], self._no[:1]), lanes=None if self.num_envs == 1 else [lane])
        cap = self.store.capacity - adder.n - 2  # add_steps's most steps a call
        firsts = np.flatnonzero(starts)
        for a in range(0, t, cap):
            z = min(a + cap, t)
            k = firsts[(firsts > a) & (firsts <= z)]
            top = _top(adder, {name: v[a:z] for name, v in {**cols, **nxt}.items()})
            restart = _top(adder, {name: v[k] for name, v in obs.items()})["observation"] if k.size else None
            adder.add_steps(lane, top["action"], top["reward"], top["observation"], terminated=terminated[a:z],
                            truncated=truncated[a:z] | cut[a:z], extras=top.get("extras"), first_observations=restart)

    def _goes_on(self, lane: int, obs: dict[str, np.ndarray]) -> bool:
        """Whether the first of ``obs`` (checked columns) is, bit for bit, the open row of ``lane``'s episode."""
        r = int(self.adder._open[lane])
        if r < 0:
            return False
        pos = r % self.store.capacity
        return all(v[0].tobytes() == self.store.columns[name][lane, pos].tobytes() for name, v in obs.items())

    def end_episodes(self) -> None:
        """Close every episode in progress as truncated, so its last transitions become sampleable."""
        self.flush()
        self.adder.truncate()
        self._last_next_given = None
        self._after_end[:] = False

    def __len__(self) -> int:
        """Transitions held."""
        self.flush()
        return self.table.size

    def __repr__(self) -> str:
        return f"ReplayBuffer(n_step={self.adder.n}, envs={self.num_envs}, size={len(self)}, table={self.table!r})"


def _path(name: str, key: str) -> Any:
    """The path under ``key`` of flat column ``name`` (None: the column is ``key`` itself; False: not under it)."""
    if name == key:
        return None
    return name[len(key) + 1:] if name.startswith(key + "/") else False


def _row(part: Any, leaves: list[tuple[str, Any, Any]], value: Any, what: str) -> dict[str, np.ndarray]:
    """One row's flat columns from ``value`` (``part`` of the row spec), checked (SpecError naming ``what``)."""
    if leaves[0][1] is not None:  # nested: check the structure, then each leaf
        try:
            flat = _specs.flatten_data(part, value, leaves[0][0].split("/")[0])
        except SpecError as exc:
            raise SpecError(f"{what}: {exc}") from None
    else:
        flat = {leaves[0][0]: value}
    out = {}
    for name, _, field in leaves:
        v = flat[name]
        kind = field.dtype.kind
        tv = type(v)
        if tv is float and kind == "f" and not field.shape and math.isfinite(v):
            out[name] = np.array(v, field.dtype)  # a Python float reward: the common single-env case
            continue
        arr = v if tv is np.ndarray else np.asarray(v)
        if not (arr.dtype == field.dtype and arr.shape == field.shape and (
                (kind == "f" and (field.allow_nonfinite or _specs._all_finite(arr)))
                or (kind in "iu" and field.low is None and field.high is None) or kind not in "fiu")):
            try:  # anything else gets the full check (casts, bounds) and its precise error
                arr = _specs.validate({name: field}, {name: arr}, ())[name]
            except SpecError as exc:
                raise SpecError(f"{what}: {exc}") from None
        out[name] = arr.copy() if arr is v else arr  # staged rows must not change with the caller's arrays
    return out


_BOOLS = (bool, np.bool_)


def _fast_plan(adder: Any, block: dict[str, np.ndarray]) -> tuple[Any, ...] | None:
    """What one compiled call (:func:`rlflow.adders._kernels.stage_row`) checks a one-env transition
    against, when the action, reward and observation are one field each and there are no extras: their
    dtypes and shapes, the scalar types taken as an action or a reward, the value checks and the blocks."""
    from rlflow.adders.transition import exact_dtype, single_fields, value_checks

    single = single_fields(adder)
    if single is None:
        return None
    (act_name, act), (rew_name, rew), (obs_name, obs) = single
    checks, dtypes = value_checks([act, rew, obs]), [exact_dtype(f) for f in (act, rew, obs)]
    if checks is None or any(d is None for d in dtypes) or rew.shape or rew.dtype.kind != "f":
        return None
    # Scalars that the general path would store unchanged in kind: Python ints as int64 actions, Python
    # and numpy floats as float rewards (a float64 reward rounds to the reward's dtype, as the general
    # path casts it).
    act_scalars = (int, np.int64) if not act.shape and dtypes[0] == np.int64 else ()
    return (dtypes[0], act.shape, act_scalars, (float, np.float32, np.float64), dtypes[2], obs.shape, checks,
            block[act_name], block[rew_name], block[obs_name])


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
    return arr


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


def _top(adder: Any, flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """The adder's ``_top`` (flat columns back into a row's parts), as they are when every part is one field."""
    return flat if all("/" not in name for name in flat) else adder._top(flat)


def _take(value: Any, lane: int) -> Any:
    """Env ``lane``'s steps of a ``[T, E, ...]`` argument (nested dicts and tuples followed)."""
    if isinstance(value, dict):
        return {k: _take(v, lane) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_take(v, lane) for v in value)
    arr = np.asarray(value)
    if arr.ndim < 2:
        raise SpecError(f"extend: expected a leading axis of steps and one of envs, got shape {arr.shape}")
    return arr[:, lane]


_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _rows_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row (leading axis) of two arrays of one dtype and shape: whether their bits differ anywhere."""
    n, width = a.shape[0], int(np.prod(a.shape[1:], dtype=np.int64))
    unit = _UINTS.get(a.itemsize)
    if unit is None:  # compare the bytes
        unit, width = np.uint8, width * a.itemsize
    a, b = (np.ascontiguousarray(x).view(unit).reshape(n, width) for x in (a, b))
    return (a != b).any(axis=1)
