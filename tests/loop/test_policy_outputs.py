"""What a policy may return and what of it reaches the env and the store: torch tensors (copied to numpy),
and Box actions outside the space's bounds (passed on as they are; the env or a wrapper clips them)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.wrappers import ClipAction

import rlflow
from rlflow import adders, envs, specs
from rlflow.loop.actors import Actor
from rlflow.replay import MinSize, StepStore, Table
from rlflow.specs import SpecError


class Recorder(gym.Env):
    """Episodes of 5 steps with a zero observation; keeps every action it is given, as given."""

    def __init__(self, action_space: spaces.Space) -> None:
        self.action_space = action_space
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.received: list = []
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action) or isinstance(self.action_space, spaces.Box), action
        self.received.append(action)
        self.t += 1
        return np.zeros(2, np.float32), 1.0, False, self.t >= 5, {}


class Scripted(rlflow.Policy):
    """Returns ``make(lanes)`` as its actions and ``extras(lanes)`` as its extras."""

    def __init__(self, make, extras=None) -> None:
        self.make, self.extras = make, extras

    def act(self, observation, state, *, evaluation=False):
        n = len(observation)
        return self.make(n), (None if self.extras is None else self.extras(n)), state


def collect(env, policy, *, steps=12, extras=None):
    """rlflow.run without a learner; the store it filled."""
    store = StepStore(envs.GymEnvironment(env).spec if extras is None else
                      rlflow.types.step_spec(specs.from_space(env.observation_space),
                                             specs.from_space(env.action_space), extras=extras),
                      capacity=64, lanes=1)
    table = Table(store, rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1, discount=0.9)
    result = rlflow.run(envs.GymEnvironment(env), policy, None, adder, table, steps=steps, progress=False)
    assert result.env_steps == steps
    return store


# --------------------------------------------------------------------------- torch tensors
def test_torch_actions_and_extras_reach_the_env_and_the_store_as_numpy():
    """A policy returning CPU tensors (the extras with grad, as a network's outputs have it): the env gets numpy
    actions, the store the same values."""
    env = Recorder(spaces.Discrete(3))
    value = torch.tensor([0.5], requires_grad=True)
    policy = Scripted(lambda n: torch.full((n,), 2, dtype=torch.int64),
                      lambda n: {"value": value * 2, "log_prob": torch.zeros(n)})
    store = collect(env, policy, extras={"value": specs.Field((), np.float32),
                                         "log_prob": specs.Field((), np.float32)})
    assert len(env.received) == 12 and all(type(a) is np.int64 and a == 2 for a in env.received)
    count = int(store.count[0])
    rows = store.gather(np.zeros(count, np.int64), np.arange(count))
    acted = ~rows["last"]
    acted[-1] = False  # the open row: its action is still to come
    assert rows["action"][acted].tolist() == [2] * 12 and np.allclose(rows["extras/value"][acted], 1.0)


@pytest.mark.parametrize("space", [
    spaces.Dict({"move": spaces.Discrete(3), "force": spaces.Box(-1.0, 1.0, (2,), np.float32)}),
    spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
])
def test_nested_torch_actions_come_back_as_numpy_in_the_same_nesting(space):
    if isinstance(space, spaces.Dict):
        actions = {"move": torch.tensor([1, 2]), "force": torch.ones(2, 2, requires_grad=True)}
    else:
        actions = (torch.tensor([1, 2]), torch.tensor([[0, 1], [1, 0]], dtype=torch.int8))
    actor = Actor(Scripted(lambda n: actions), specs.from_space(space), 2, space)
    got, extras = actor.select_action(np.zeros((2, 2), np.float32))
    leaves = list(got.values()) if isinstance(got, dict) else list(got)
    assert type(got) is type(actions) and extras is None
    assert all(type(leaf) is np.ndarray for leaf in leaves)
    for leaf, want in zip(leaves, actions.values() if isinstance(actions, dict) else actions, strict=True):
        np.testing.assert_array_equal(leaf, want.detach().numpy())


def test_a_tensor_with_no_values_names_the_policy():
    space = spaces.Discrete(3)
    actor = Actor(Scripted(lambda n: torch.zeros(n, dtype=torch.int64, device="meta")), specs.from_space(space), 2,
                  space)
    with pytest.raises(TypeError, match=r"Scripted.act returned actions as a torch tensor on device meta whose values "
                                        r"cannot be copied to numpy"):
        actor.select_action(np.zeros((2, 2), np.float32))


def test_torch_actions_out_of_the_space_are_refused_as_numpy_ones_are():
    space = spaces.Discrete(3)
    actor = Actor(Scripted(lambda n: torch.full((n,), 5)), specs.from_space(space), 2, space)
    with pytest.raises(SpecError, match=r"Scripted.act returned actions that do not fit the action space "
                                        r"Discrete\(3\) for 2 lanes: field 'action': expected values <= 2, got 5"):
        actor.select_action(np.zeros((2, 2), np.float32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_copied_to_numpy():
    env = Recorder(spaces.Box(-1.0, 1.0, (2,), np.float32))
    policy = Scripted(lambda n: torch.full((n, 2), 0.25, device="cuda", requires_grad=True))
    store = collect(env, policy, steps=6)
    assert all(type(a) is np.ndarray and a.tolist() == [0.25, 0.25] for a in env.received)
    assert np.allclose(store.gather(np.zeros(5, np.int64), np.arange(5))["action"], 0.25)


# --------------------------------------------------------------------------- Box bounds
def test_box_actions_outside_the_bounds_reach_the_env_and_the_store_as_the_policy_returned_them():
    """PPO samples unbounded Gaussian actions and keeps them (their log-probabilities are the policy's): rlflow
    checks shape, dtype and finiteness, not a Box's bounds, and stores what the policy returned."""
    env = Recorder(spaces.Box(-1.0, 1.0, (2,), np.float32))
    store = collect(env, Scripted(lambda n: np.tile(np.array([5.0, -7.0], np.float32), (n, 1))))
    assert all(a.tolist() == [5.0, -7.0] for a in env.received)
    stored = store.gather(np.zeros(5, np.int64), np.arange(5))["action"]
    assert stored.tolist() == [[5.0, -7.0]] * 5


def test_clip_action_keeps_the_env_in_its_bounds_while_the_store_keeps_the_sampled_action():
    inner = Recorder(spaces.Box(-1.0, 1.0, (2,), np.float32))
    store = collect(ClipAction(inner), Scripted(lambda n: np.tile(np.array([5.0, -0.5], np.float32), (n, 1))))
    assert all(a.tolist() == [1.0, -0.5] for a in inner.received)
    assert store.gather(np.zeros(5, np.int64), np.arange(5))["action"].tolist() == [[5.0, -0.5]] * 5


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_box_actions_that_are_not_finite_are_refused(bad):
    env = Recorder(spaces.Box(-1.0, 1.0, (2,), np.float32))
    with pytest.raises(SpecError, match=r"Scripted.act returned actions that do not fit the action space Box"):
        collect(env, Scripted(lambda n: np.full((n, 2), bad, np.float32)))
    assert env.received == []


class NoEvaluationFlag(rlflow.Policy):
    def act(self, observation, state):  # the common mistake: no evaluation keyword
        return np.zeros(len(observation), np.int64), None, state


class KeywordsPolicy(rlflow.Policy):
    def act(self, observation, state, **kwargs):
        return np.zeros(len(observation), np.int64), None, state


def test_a_policy_whose_act_takes_no_evaluation_keyword_is_refused_before_any_step_naming_the_signature():
    env = envs.make("CartPole-v1", num_envs=2)
    store = StepStore(env.spec, capacity=50, lanes=2)
    table = Table(store, rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1, discount=0.9)
    expected = (r"NoEvaluationFlag.act\(observation, state\): expected "
                r"act\(self, observation, state, \*, evaluation=False\)")
    with pytest.raises(TypeError, match=expected):
        rlflow.run(env, NoEvaluationFlag(), None, adder, table, steps=10, progress=False)
    assert store.count.tolist() == [0, 0]  # refused before the envs were reset or anything written
    with pytest.raises(TypeError, match=expected):
        rlflow.evaluate(envs.make("CartPole-v1"), NoEvaluationFlag(), episodes=1)
    result = rlflow.run(env, KeywordsPolicy(), None, adder, table, steps=10, progress=False)  # **kwargs takes it
    assert result.env_steps == 10
