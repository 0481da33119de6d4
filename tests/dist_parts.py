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
    restart), so a test can kill it."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, actor: int) -> GymEnvironment:
        import os
        from pathlib import Path

        Path(self.folder, f"actor-{actor}.pid").write_text(str(os.getpid()))
        return make_tagged(actor)

