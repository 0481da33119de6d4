"""An environment of one's own, brought to rlflow: a simulator that is neither gymnasium nor PettingZoo, stepped
as ``E`` lanes that return TimeSteps (an ``rlflow.Environment``). docs/extending.md walks through it.

    python examples/custom_env.py
"""

import numpy as np

import rlflow
from rlflow import specs
from rlflow.types import TimeStep, step_spec


class Corridor:
    """The simulator (dm_env-like): ``reset() -> obs`` and ``step(action) -> (obs, reward, done)``. An agent walks
    a corridor of ``length`` cells (action 1 right, 0 left); reaching the last cell pays 1 and ends the episode."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.position = 0

    def reset(self) -> np.ndarray:
        self.position = 0
        return self.observe()

    def observe(self) -> np.ndarray:
        return np.float32([self.position / (self.length - 1)])

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        self.position = max(0, self.position + (1 if action == 1 else -1))
        done = self.position == self.length - 1
        return self.observe(), float(done), done


class CorridorEnv:
    """``num_envs`` corridors as an ``rlflow.Environment``. An episode that reaches the end is terminated; one still
    going after ``max_steps`` actions is truncated (a time limit). An ended lane starts its next episode in the
    same call (``first`` and ``last`` both set, its true final observation in ``final_observation``)."""

    def __init__(self, num_envs: int, length: int = 6, max_steps: int = 20) -> None:
        self.num_envs = num_envs
        self.corridors = [Corridor(length) for _ in range(num_envs)]
        self.max_steps = max_steps
        self.steps = np.zeros(num_envs, np.int64)
        self.action_spec = specs.Field((), np.int64, low=0, high=1)
        self.single_action_space = None  # (no gymnasium space: errors name the action spec)
        self.spec = step_spec(specs.Field((1,), np.float32), self.action_spec)  # a store's columns

    def reset(self, seed: int | None = None) -> TimeStep:
        obs = np.stack([c.reset() for c in self.corridors])
        self.steps[:] = 0
        no, yes = np.zeros(self.num_envs, bool), np.ones(self.num_envs, bool)
        return TimeStep(obs, np.zeros(self.num_envs, np.float32), no, no.copy(), yes, no.copy())

    def step(self, actions: np.ndarray) -> TimeStep:
        obs, reward = np.empty((self.num_envs, 1), np.float32), np.empty(self.num_envs, np.float32)
        terminated = np.empty(self.num_envs, bool)
        for i, (corridor, action) in enumerate(zip(self.corridors, actions, strict=True)):
            obs[i], reward[i], terminated[i] = corridor.step(int(action))
        self.steps += 1
        truncated = ~terminated & (self.steps >= self.max_steps)
        last = terminated | truncated
        final = obs.copy() if last.any() else None
        for i in np.flatnonzero(last):  # the next episode starts in this call
            obs[i] = self.corridors[i].reset()
            self.steps[i] = 0
        return TimeStep(obs, reward, terminated, truncated, last.copy(), last, final)


class Random(rlflow.Policy):
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 2, len(observation)), None, state


def main() -> None:
    env = CorridorEnv(num_envs=4)
    assert isinstance(env, rlflow.Environment)
    returns = rlflow.evaluate(env, Random(seed=0), episodes=20)
    print(f"a random walk reaches the end of the corridor in {np.mean(returns):.0%} of 20 episodes")


if __name__ == "__main__":
    main()
