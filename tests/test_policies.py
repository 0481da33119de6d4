"""rlflow.policies.EpsilonGreedy: its schedule, its greedy and random actions, and its state."""

import numpy as np
import pytest
import torch

from rlflow.policies import EpsilonGreedy


class Fixed(torch.nn.Module):
    """Q-values that make action ``best`` greedy for every observation; counts its calls."""

    def __init__(self, best, n=4):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.best, self.n, self.calls = best, n, 0

    def forward(self, obs):
        self.calls += 1
        q = torch.zeros(len(obs), self.n)
        q[:, self.best] = self.scale
        return q


@pytest.mark.parametrize(("steps", "epsilon"), [(0, 1.0), (50, 0.525), (100, 0.05), (1_000, 0.05)])
def test_epsilon_falls_linearly_then_stays(steps, epsilon):
    policy = EpsilonGreedy(Fixed(0), 4, decay_steps=100, start=1.0, end=0.05)
    policy.steps = steps
    assert policy.epsilon == pytest.approx(epsilon)


def test_actions_are_greedy_with_probability_one_minus_epsilon_and_count_lanes():
    policy = EpsilonGreedy(Fixed(2), 4, decay_steps=1, start=0.3, end=0.3, seed=0)
    actions = np.concatenate([policy.act(np.zeros((100, 3)), None)[0] for _ in range(100)])
    assert policy.steps == 10_000
    # greedy (2) with 0.7, plus a quarter of the random 0.3; each other action a quarter of 0.3
    counts = np.bincount(actions, minlength=4) / actions.size
    np.testing.assert_allclose(counts, [0.075, 0.075, 0.775, 0.075], atol=0.02)


def test_evaluation_is_greedy_counts_no_step_and_the_network_runs_only_when_needed():
    q = Fixed(1)
    policy = EpsilonGreedy(q, 4, decay_steps=10, seed=0)
    actions, extras, state = policy.act(np.zeros((5, 3)), "s", evaluation=True)
    assert actions.tolist() == [1] * 5 and extras is None and state == "s" and policy.steps == 0
    calls = q.calls
    policy.act(np.zeros((1, 3)), None)  # epsilon 1: every lane explores
    assert q.calls == calls and policy.steps == 1


def test_set_params_takes_a_network_and_keeps_its_own_for_none():
    policy = EpsilonGreedy(Fixed(0), 4, decay_steps=1, start=0.0, end=0.0)
    policy.set_params(None)  # a learner with nothing to send
    assert policy.act(np.zeros((2, 3)), None)[0].tolist() == [0, 0]
    policy.set_params(Fixed(3))
    assert policy.act(np.zeros((2, 3)), None)[0].tolist() == [3, 3]


def test_its_state_restores_the_same_actions_and_a_bad_one_changes_nothing():
    policy = EpsilonGreedy(Fixed(0), 4, decay_steps=50, seed=1)
    policy.act(np.zeros((7, 3)), None)
    state = policy.state_dict()
    expected = [policy.act(np.zeros((7, 3)), None)[0] for _ in range(5)]
    other = EpsilonGreedy(Fixed(0), 4, decay_steps=50, seed=2)
    other.load_state_dict(state)
    assert other.steps == 7
    np.testing.assert_array_equal(np.array(expected), np.array([other.act(np.zeros((7, 3)), None)[0]
                                                                 for _ in range(5)]))
    before = other.state_dict()
    with pytest.raises((TypeError, ValueError, KeyError)):
        other.load_state_dict({"steps": 3, "rng": {"bit_generator": "PCG64", "state": "garbage"}})
    assert other.state_dict() == before


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_actions": 0, "decay_steps": 10}, "num_actions and decay_steps"),
    ({"num_actions": 2, "decay_steps": 0}, "num_actions and decay_steps"),
    ({"num_actions": 2, "decay_steps": 10, "end": 1.5}, "start and end"),
])
def test_bad_settings_are_refused_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EpsilonGreedy(Fixed(0), **kwargs)
