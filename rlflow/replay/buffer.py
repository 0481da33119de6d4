"""ReplayBuffer: a store, an n-step transition adder and one table, behind ``add`` and ``sample``.

For a training loop that already exists and wants a fast buffer and nothing else::

    buffer = ReplayBuffer(env.observation_space, env.action_space, capacity=100_000, n_step=3)
    buffer.add(obs, action, reward, next_obs, terminated, truncated)      # one transition (or a batch)
    batch = buffer.sample(256).data                                       # a Transition [256, ...]

Each call records one transition per env (``num_envs`` of them, leading axis ``E``; with one env the
leading axis may be left out). Observations are stored once: when a transition's ``obs`` is the
previous ``next_obs`` of its env (the usual case), only ``next_obs`` is new. When it is not (the loop
skipped or restarted without an episode end), the previous episode is closed as truncated at its last
``next_obs`` and a new one starts at ``obs``, so every transition passed in is kept exactly as given.
Sampled transitions are n-step (``n_step=1``: the transitions as added): ``reward`` is the discounted
sum of up to ``n_step`` rewards, ``discount`` is ``discount ** k`` (0 after termination), and
``next_observation`` the observation ``k`` steps on; truncation bootstraps from the true final
observation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow import specs as _specs
from rlflow.replay.rate_limiters import MinSize
from rlflow.replay.sample import Sample
from rlflow.replay.selectors import Fifo, Prioritized, Uniform
from rlflow.replay.storage import StepStore
from rlflow.replay.table import Table
from rlflow.specs import Spec, SpecError
from rlflow.types import TimeStep, step_spec

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
        from rlflow.adders.transition import NStepTransition  # adders build on this package

        if int(num_envs) < 1 or int(capacity) // int(num_envs) < n_step + 2:
            raise ValueError(f"capacity {capacity} over num_envs {num_envs} leaves fewer than n_step + 2 = "
                             f"{n_step + 2} rows per env")
        self.num_envs = int(num_envs)
        spec = step_spec(_as_spec(observation), _as_spec(action), extras)
        self.store = StepStore(spec, capacity=int(capacity) // self.num_envs, lanes=self.num_envs,
                               backend=backend, directory=directory)
        sampler = Prioritized(alpha=alpha, beta=beta, seed=seed) if prioritized else Uniform(seed=seed)
        self.table = Table(self.store, sampler=sampler, remover=Fifo(), rate_limiter=MinSize(1), name="replay")
        self.adder = NStepTransition(self.store, [self.table], n=n_step, discount=discount)
        self._obs_fields = self.adder._obs_fields
        self._lanes = np.arange(self.num_envs)
        self._no = np.zeros(self.num_envs, bool)
        self._single = len(next(iter(self._obs_fields.values())).shape)

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
            extras: Any = None) -> None:
        """Record one transition per env (see the module docstring); bad input raises and changes nothing."""
        if self.num_envs == 1 and self._unbatched(obs):
            obs, action, next_obs, extras = (_lead(x) for x in (obs, action, next_obs, extras))
            reward, terminated, truncated = (np.asarray(x).reshape(1) for x in (reward, terminated, truncated))
        terminated = _flags("terminated", terminated, self.num_envs)
        truncated = _flags("truncated", truncated, self.num_envs)
        reward = reward if type(reward) is np.ndarray else np.asarray(reward, np.float32)
        adder = self.adder
        last = terminated | truncated
        ts = TimeStep(next_obs, reward, terminated, truncated, self._no, last, next_obs if last.any() else None)
        open_rows = adder._open
        if open_rows.min() >= 0 and self._continues(obs, open_rows):
            adder.add(action, ts, extras)  # the common call: every env goes on from its previous next_obs
            return
        # Check the whole call before anything changes, then close broken episodes and start new ones.
        obs_flat = adder._check(self._obs_fields, {"observation": obs}, self.num_envs, "obs")
        adder._check({**adder._act_fields, **adder._reward_fields, **adder._extra_fields},
                     {"action": action, "reward": reward, **({"extras": extras} if extras is not None else {})},
                     self.num_envs, "add")
        adder._check(self._obs_fields, {"observation": next_obs}, self.num_envs, "next_obs")
        with self.store.lock:
            is_open = open_rows >= 0
            same = self._same_rows(obs_flat, open_rows)
            adder.truncate(self._lanes[is_open & ~same])
            start = self._lanes[~(is_open & same)]
            if start.size:
                sub = {k: v[start] for k, v in obs_flat.items()}
                adder.add_first(TimeStep(adder._top(sub)["observation"], np.zeros(start.size, np.float32),
                                         self._no[start], self._no[start], ~self._no[start], self._no[start]),
                                lanes=start)
            adder.add(action, ts, extras)

    def _unbatched(self, obs: Any) -> bool:
        leaf = obs
        while isinstance(leaf, dict | tuple):
            leaf = next(iter(leaf.values())) if isinstance(leaf, dict) else leaf[0]
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
            eq = stored == value[same]
            if eq.ndim > 1:
                eq = eq.reshape(lanes.size, -1).all(axis=1)
            same[lanes[~eq]] = False
        return same

    def sample(self, batch_size: int, *, timeout: float | None = None) -> Sample:
        """``batch_size`` transitions: ``sample.data`` is a :class:`~rlflow.replay.views.Transition`."""
        return self.table.sample(batch_size, timeout=timeout)

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of sampled transitions (keys of overwritten ones are skipped)."""
        return self.table.update_priorities(keys, priorities)

    def end_episodes(self) -> None:
        """Close every episode in progress as truncated, so its last transitions become sampleable."""
        self.adder.truncate()

    def __len__(self) -> int:
        """Transitions held."""
        return self.table.size

    def __repr__(self) -> str:
        return f"ReplayBuffer(n_step={self.adder.n}, envs={self.num_envs}, size={len(self)}, table={self.table!r})"


def _lead(x: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: _lead(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_lead(v) for v in x)
    return np.asarray(x)[None]


def _flags(name: str, value: Any, n: int) -> np.ndarray:
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if arr.shape != (n,) or arr.dtype != np.bool_:
        if arr.shape == (n,) and arr.dtype.kind in "iu" and ((arr == 0) | (arr == 1)).all():
            return arr.astype(bool)
        raise SpecError(f"{name}: expected {n} bools (one per env), got {arr.dtype} {arr.shape}")
    return arr
