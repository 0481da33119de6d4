"""Parts for the distributed tests, importable in Ray's worker processes (the tests put this folder on their
``PYTHONPATH``): an env whose observations say where they come from, a random policy, a counting learner."""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import rlflow
from rlflow.envs import GymEnvironment


class Tagged(gymnasium.Env):
    """Observation ``[source, episode, t]``: ``source = 100 * actor + lane``, the lane's episode count and the
    step in it. Episodes last 3 to 9 steps and end terminated or truncated at random; reward ``t``."""

    observation_space = gymnasium.spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, source: int) -> None:
        self.source, self.episode, self.t = source, -1, 0
        self.rng = np.random.default_rng(source)
        self.length, self.cut = 0, False

    def _obs(self) -> np.ndarray:
        return np.array([self.source, self.episode, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.length, self.cut = int(self.rng.integers(3, 10)), bool(self.rng.random() < 0.5)
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        return self._obs(), float(self.t), done and not self.cut, done and self.cut, {}


def make_tagged(actor: int, num_envs: int = 2) -> GymEnvironment:
    vec = SyncVectorEnv([lambda lane=lane: Tagged(100 * actor + lane) for lane in range(num_envs)],
                        autoreset_mode=AutoresetMode.SAME_STEP)
    return GymEnvironment(vec)


class RandomPolicy(rlflow.Policy):
    """Random actions; remembers the last parameters it was given."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.params = None

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 2, len(observation)), None, state

    def set_params(self, params):
        self.params = params


class BadPolicy(RandomPolicy):
    """Actions out of the action space after a few steps (what a broken actor would send)."""

    def act(self, observation, state, *, evaluation=False):
        return np.full(len(observation), 7), None, state


class WindowLearner(rlflow.Learner):
    """Checks that each sampled transition is one lane's consecutive steps of one episode, and counts."""

    def __init__(self) -> None:
        self.steps, self.items, self.bad = 0, 0, []

    def step(self, sample):
        data = sample.data
        obs, nxt = data.observation, data.next_observation
        same = (obs[:, 0] == nxt[:, 0]) & (obs[:, 1] == nxt[:, 1]) & (nxt[:, 2] > obs[:, 2])
        if not same.all():
            self.bad.append((obs[~same], nxt[~same]))
        self.steps += 1
        self.items += len(sample)
        return {"items": float(self.items)}

    def get_params(self):
        return self.steps


class PidFiles:
    """``make_env`` that also writes the actor process's id to ``<folder>/actor-<i>.pid`` (again after a
    restart), so a test can kill it (its envs reset in ``NEXT_STEP`` mode with ``next_step``)."""

    def __init__(self, folder: str, next_step: bool = False) -> None:
        self.folder, self.next_step = folder, next_step

    def __call__(self, actor: int) -> GymEnvironment:
        import os
        from pathlib import Path

        Path(self.folder, f"actor-{actor}.pid").write_text(str(os.getpid()))
        return make_tagged_next_step(actor) if self.next_step else make_tagged(actor)



class NodeFiles:
    """``make_env`` that also writes the id of the Ray node the actor runs on to ``<folder>/actor-<i>.node``
    (again after a restart)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, actor: int) -> GymEnvironment:
        from pathlib import Path

        import ray

        Path(self.folder, f"actor-{actor}.node").write_text(ray.get_runtime_context().get_node_id())
        return make_tagged(actor)


class StatefulLearner(WindowLearner):
    """:class:`WindowLearner` whose state (its counts, the bad windows' count and the id of the process it
    trained in) goes through ``state_dict``, as a learner in a process of its own hands it back."""

    def __init__(self) -> None:
        super().__init__()
        self.pid = None

    def step(self, sample):
        import os

        self.pid = os.getpid()
        return super().step(sample)

    def state_dict(self):
        return {"steps": self.steps, "items": self.items, "bad": len(self.bad), "pid": self.pid}

    def load_state_dict(self, state):
        self.steps, self.items, self.pid = state["steps"], state["items"], state["pid"]
        self.bad = [None] * state["bad"]


class ParityPolicy(rlflow.Policy):
    """Actions from the observation alone (step parity), so that any process acting on the same stream takes
    the same actions."""

    def act(self, observation, state, *, evaluation=False):
        return (np.asarray(observation)[:, 2].astype(np.int64) % 2), None, state


class RecordingLearner(rlflow.Learner):
    """Keeps every sample's observations, in the order it learned from them."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def step(self, sample):
        self.seen.append(np.array(sample.data.observation))
        return {}

    def get_params(self):
        return len(self.seen)


class NumberedSample:
    """A stand-in for a Sample: its number, as the stand-in server made it."""

    def __init__(self, number: int) -> None:
        self.data, self.keys = number, np.array([number])

    def copy(self):
        return self


class OneAtATimeServer:
    """A stand-in replay server (an asyncio Ray actor) whose sample calls take a while and bring numbered
    samples; it records the most sample calls it ever ran at once."""

    def __init__(self) -> None:
        self.running, self.most, self.made = 0, 0, 0

    async def sample(self, batch_size, timeout=None, count=1):
        import asyncio

        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.02)
        self.running -= 1
        out = [NumberedSample(self.made + i) for i in range(count)]
        self.made += count
        return out

    async def update_priorities(self, keys, priorities):
        return 0

    async def most_at_once(self):
        return self.most


class OrderLearner(rlflow.Learner):
    """Keeps the numbers of the samples it learned from."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def step(self, sample):
        self.seen.append(sample.data)
        return {}

    def get_params(self):
        return None


class DyingLearner(WindowLearner):
    """Its process exits at its 20th step (what a learner process killed mid-run looks like)."""

    def step(self, sample):
        import os

        if self.steps == 20:
            os._exit(1)
        return super().step(sample)


def make_tagged_next_step(actor: int, num_envs: int = 2) -> GymEnvironment:
    """:func:`make_tagged` resetting in ``NEXT_STEP`` mode (one row per lane per step: ``on_policy`` actors)."""
    vec = SyncVectorEnv([lambda lane=lane: Tagged(100 * actor + lane) for lane in range(num_envs)],
                        autoreset_mode=AutoresetMode.NEXT_STEP)
    return GymEnvironment(vec)


class VersionPolicy(RandomPolicy):
    """Random actions, each stored with the version of the parameters that chose it (extras ``version``: the
    learner's step count, which is what it publishes)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.params = -1

    def act(self, observation, state, *, evaluation=False):
        n = len(observation)
        return self.rng.integers(0, 2, n), {"version": np.full(n, self.params, np.int64)}, state


class LockstepLearner(rlflow.Learner):
    """Keeps, per learner step, the step count it had and each sampled rollout's observations, versions and
    ``last`` flags; publishes its step count."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def step(self, sample):
        rows = sample.data
        self.seen.append((len(self.seen), np.array(rows["observation"]), np.array(rows["extras"]["version"]),
                          np.array(rows["last"])))
        return {}

    def get_params(self):
        return len(self.seen)


class GpuLearner(StatefulLearner):
    """:class:`StatefulLearner` that sums its samples' sizes on the GPU, and keeps the GPUs Ray gave its
    process."""

    def __init__(self) -> None:
        super().__init__()
        self.total, self.gpu_ids = None, []

    def step(self, sample):
        import ray
        import torch

        self.gpu_ids = ray.get_gpu_ids()
        if self.total is None:
            self.total = torch.zeros((), device="cuda", dtype=torch.float64)
        self.total += torch.ones(len(sample), device="cuda", dtype=torch.float64).sum()
        return super().step(sample)

    def state_dict(self):
        return {**super().state_dict(), "total": self.total, "gpu_ids": self.gpu_ids}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.total, self.gpu_ids = state["total"], state["gpu_ids"]


class ParamsPolicy(RandomPolicy):
    """Acts its parameters (the learner's step count, as :class:`RecordingLearner` publishes it) when evaluating,
    their parity when training: an evaluation's return says which parameters it had (:class:`ParamsEnv`)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.params = 0

    def act(self, observation, state, *, evaluation=False):
        n = len(observation)
        return np.full(n, self.params if evaluation else self.params % 2, np.int64), None, state


class ParamsEnv(gymnasium.Env):
    """One-step episodes whose reward is the action: evaluated with :class:`ParamsPolicy`, the return is the
    parameters the evaluation had."""

    observation_space = gymnasium.spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gymnasium.spaces.Discrete(10**6)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), float(action), True, False, {}


def make_tagged_slowly_for_actor_1(actor: int, num_envs: int = 2) -> GymEnvironment:
    """:func:`make_tagged`, taking 4 seconds to build for actor 1 (a process that starts late)."""
    import time

    if actor == 1:
        time.sleep(4.0)
    return make_tagged(actor, num_envs)
