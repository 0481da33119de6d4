"""An env's state as plain data: a restored env continues bit for bit as the saved one (every real
gymnasium env and autoreset mode the wrapper supports, PettingZoo parallel envs), through a file loaded
without pickle; envs holding other objects are refused, naming the object; a wrongly built env is
refused before it changes."""

from __future__ import annotations

import collections

import gymnasium as gym
import numpy as np
import pytest
from ma_envs import DyingAgents

from rlflow import envs
from rlflow.envs import state as env_state
from rlflow.envs.state import EnvStateError
from rlflow.loop.checkpoint import load_state, save_state

FIELDS = ("observation", "reward", "terminated", "truncated", "first", "last", "final_observation")


def through_a_file(tmp_path, state):
    """``state`` after a round trip through a file read with ``torch.load(weights_only=True)``."""
    save_state(tmp_path / "env.pt", {"env": state})
    return load_state(tmp_path / "env.pt")["env"]


def actions_of(env, rng):
    space = env.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, env.num_envs)
    return rng.uniform(space.low, space.high, (env.num_envs, *space.shape)).astype(space.dtype)


def assert_same_timestep(a, b, where):
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), f"{where}: {name}"
        if x is not None:
            assert np.asarray(x).dtype == np.asarray(y).dtype, f"{where}: {name}"
            np.testing.assert_array_equal(x, y, err_msg=f"{where}: {name}")


CASES = [(env_id, None, "same_step") for env_id in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1")] + [
    (env_id, 3, mode) for env_id in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1")
    for mode in ("next_step", "same_step", "disabled")]


@pytest.mark.parametrize(("env_id", "num_envs", "mode"), CASES)
def test_a_restored_env_continues_bit_for_bit(tmp_path, env_id, num_envs, mode):
    def make():
        return envs.make(env_id, num_envs, autoreset_mode=mode, max_episode_steps=12)

    saved, rng = make(), np.random.default_rng(0)
    saved.reset(seed=4)
    for _ in range(17):  # past an episode end: the sub-envs' RNGs have drawn resets
        saved.step(actions_of(saved, rng))
    state = through_a_file(tmp_path, saved.state_dict())
    restored = make()
    restored.load_state_dict(state)
    ends = 0
    for t in range(40):  # over several more episode ends, where each env's RNG draws the next start
        actions = actions_of(saved, rng)
        a, b = saved.step(actions), restored.step(actions)
        assert_same_timestep(a, b, f"step {t}")
        ends += int(a.last.sum())
    assert ends >= 3


def test_the_wrapper_state_a_first_reset_seed_and_step_before_reset_come_back(tmp_path):
    fresh = envs.make("CartPole-v1", 2, seed=7)  # not reset yet: its first reset takes seed 7
    other = envs.make("CartPole-v1", 2)
    other.load_state_dict(through_a_file(tmp_path, fresh.state_dict()))
    with pytest.raises(RuntimeError, match="before reset"):
        other.step(np.zeros(2, np.int64))
    assert_same_timestep(other.reset(), envs.make("CartPole-v1", 2, seed=7).reset(), "reset")


def test_async_vector_envs_and_objects_in_an_env_are_not_savable():
    env = envs.make("CartPole-v1", 2, vectorization_mode="async")
    try:
        env.reset(seed=0)
        with pytest.raises(EnvStateError, match=r"env\.parent_pipes\[0\]: a multiprocessing\.connection\.Connection"):
            env.state_dict()
    finally:
        env.close()

    class World:
        pass

    plain = gym.make("CartPole-v1")
    plain.unwrapped.world = World()
    with pytest.raises(EnvStateError, match=r"env\.env\.env\.env\.world: a .*World object, which is not plain data"):
        envs.GymEnvironment(plain).state_dict()


def test_configuration_is_not_saved_and_containers_of_state_are():
    class Env(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self):
            self.fn, self.kinds = len, {"mode": gym.vector.AutoresetMode.NEXT_STEP, "n": 3}  # configuration
            self.history = collections.deque([np.zeros(2), 1.5], maxlen=4)
            self.nested = {"a": [1, (2.0, "x", None)], "b": np.arange(3, dtype=np.int16)}
            self.draws = np.random.default_rng(3)

    saved = Env()
    state = env_state.capture(saved)
    assert set(state["attrs"]) == {"history", "nested", "draws"}
    restored = Env()
    restored.history, restored.nested = None, {}
    restored.draws = np.random.default_rng(99)
    env_state.restore(restored, state)
    assert restored.history.maxlen == 4 and list(restored.history)[1] == 1.5
    assert restored.nested["a"] == [1, (2.0, "x", None)] and restored.nested["b"].dtype == np.int16
    np.testing.assert_array_equal(restored.nested["b"], np.arange(3, dtype=np.int16))
    assert restored.draws.integers(1 << 30) == saved.draws.integers(1 << 30)


def test_a_differently_built_env_is_refused_unchanged(tmp_path):
    saved = envs.make("CartPole-v1", 2, max_episode_steps=12)
    saved.reset(seed=0)
    state = through_a_file(tmp_path, saved.state_dict())
    other = envs.make("Acrobot-v1", 2)
    before = env_state.capture(other.env)
    with pytest.raises(ValueError, match="build the env as the checkpointed run did"):
        other.load_state_dict(state)
    after = env_state.capture(other.env)
    assert repr(before) == repr(after)
    with pytest.raises(ValueError, match="pending resets of 3 lanes"):
        envs.make("CartPole-v1", 3).load_state_dict(state)


def test_a_restored_pettingzoo_parallel_env_continues_bit_for_bit(tmp_path):
    def make():
        return envs.ParallelEnvironment([DyingAgents(deaths=(2, None, 4), max_steps=6) for _ in range(2)])

    saved, rng = make(), np.random.default_rng(0)
    saved.reset(seed=0)
    for _ in range(8):
        saved.step(rng.integers(0, 3, (2, 3)))
    restored = make()
    restored.load_state_dict(through_a_file(tmp_path, saved.state_dict()))
    for t in range(15):
        actions = rng.integers(0, 3, (2, 3))
        a, b = saved.step(actions), restored.step(actions)
        for key in a.observation:
            np.testing.assert_array_equal(a.observation[key], b.observation[key], err_msg=f"{t} {key}")
        for name in ("reward", "terminated", "truncated", "first", "last"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{t} {name}")
    with pytest.raises(ValueError, match="expected the state of 3 envs"):
        envs.ParallelEnvironment([DyingAgents() for _ in range(3)]).load_state_dict(saved.state_dict())


def test_mpe_envs_hold_objects_and_are_not_savable():
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    env = envs.ParallelEnvironment([simple_spread_v3.parallel_env(max_cycles=5)])
    env.reset(seed=0)
    with pytest.raises(EnvStateError, match=r"envs\[0\]\..*object, which is not plain data"):
        env.state_dict()
