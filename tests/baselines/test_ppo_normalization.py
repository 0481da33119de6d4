"""PPO's --normalize-obs and --normalize-reward (SB3's VecNormalize): the statistics, the scaled rewards against
a step-by-step reference, what acting and learning see, checkpoints, and a run."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines import ppo
from rlflow.returns import ValueNormalizer


def reference_scaled(rollouts, gamma):
    """VecNormalize's reward scaling written out per lane and step with Python floats: ``rollouts`` is a list
    of calls, each ``(reward [E, T + 1], acted [E, T], ended [E, T])``; the returns' statistics are the plain
    mean and variance of every return so far (floored at 1e-8; none yet: a variance of 1). Returns each call's
    scaled rewards."""
    carry = [0.0] * rollouts[0][0].shape[0]
    seen: list[float] = []
    out = []
    for reward, acted, ended in rollouts:
        for e in range(reward.shape[0]):
            for t in range(acted.shape[1]):
                if acted[e, t]:
                    carry[e] = carry[e] * gamma + float(reward[e, t])
                    seen.append(carry[e])
                    if ended[e, t]:
                        carry[e] = 0.0
        std = max(float(np.var(seen)), 1e-8) ** 0.5 if seen else 1.0  # no return yet: the identity
        out.append(np.clip(reward / std, -10.0, 10.0))
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 3), st.floats(0.0, 0.999), st.integers(0, 2**16))
def test_scaled_rewards_match_a_step_by_step_reference(E, T, calls, gamma, seed):
    """Each lane's running return carries over from one rollout to the next and restarts after an episode's
    end (terminated or truncated); steps that are not actions (final-observation rows, padding) leave it
    alone; every reward is divided by the std of all the returns so far and clipped to +-10."""
    rng = np.random.default_rng(seed)
    rollouts = []
    for _ in range(calls):
        reward = (rng.normal(size=(E, T + 1)) * rng.choice([0.01, 1.0, 100.0])).astype(np.float32)
        acted = rng.random((E, T)) < 0.8
        ended = acted & (rng.random((E, T)) < 0.3)
        rollouts.append((reward, acted, ended))
    stats, carry = ValueNormalizer((), beta=None, min_var=1e-8), np.zeros(E)
    for (reward, acted, ended), want in zip(rollouts, reference_scaled(rollouts, gamma), strict=True):
        got = ppo.scale_rewards(reward, acted, ended, carry, stats, gamma)
        assert got.dtype == np.float32 and got.shape == reward.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_scaled_rewards_by_hand():
    """Two lanes, gamma 0.5: lane 0 ends its episode at its second step, lane 1 runs on."""
    reward = np.array([[1.0, 2.0, 4.0, 0.0], [2.0, 2.0, 2.0, 0.0]], np.float32)
    acted = np.ones((2, 3), bool)
    ended = np.array([[False, True, False], [False, False, False]])
    carry, stats = np.zeros(2), ValueNormalizer((), beta=None, min_var=1e-8)
    ppo.scale_rewards(reward, acted, ended, carry, stats, 0.5)
    # lane 0: 1, 0.5 + 2 = 2.5, then a new episode: 4; lane 1: 2, 3, 3.5
    returns = np.array([1.0, 2.5, 4.0, 2.0, 3.0, 3.5])
    np.testing.assert_allclose(carry, [4.0, 3.5])
    np.testing.assert_allclose(stats.mean, returns.mean())
    np.testing.assert_allclose(stats.var, returns.var())


def rollout_sample(rng, e=2, t=4, obs_dim=3, lanes=None, scale=5.0, version=0):
    no = np.zeros((e, t + 1), bool)
    last = no.copy()
    last[0, 2] = True  # lane 0's row 2 is a final observation: not acted on
    truncated = no.copy()
    truncated[0, 1] = True  # the flags of the action before it: its episode was cut there
    data = {"observation": (rng.normal(size=(e, t + 1, obs_dim)) * scale + 3.0).astype(np.float32),
            "action": rng.normal(size=(e, t + 1, 1)).astype(np.float32), "reward": np.ones((e, t + 1), np.float32),
            "terminated": no, "truncated": truncated, "last": last, "first": no,
            "extras": {"log_prob": np.full((e, t + 1), -1.0, np.float32), "value": np.zeros((e, t + 1), np.float32),
                       "version": np.full((e, t + 1), version, np.int64)}}
    return SimpleNamespace(data=data, mask=np.ones((e, t + 1), bool),
                           lanes=np.arange(e) if lanes is None else np.asarray(lanes))


def test_observation_statistics_follow_every_observation_acted_on(monkeypatch):
    """After each update the networks normalise with the exact mean and std of every observation acted on so
    far (not the final-observation rows, nor the bootstrap row, which the next rollout acts on); during an
    update they still use the statistics the rollout was acted with (the identity before the first)."""
    torch.manual_seed(0)
    args = ppo.Args(env_id="Pendulum-v1", num_envs=2, n_steps=4, n_epochs=1, minibatch_size=8, hidden=(8,),
                    normalize_obs=True)
    net = ppo.ActorCritic(3, 1, (8,), continuous=True, normalize_obs=True)
    learner = ppo.PPOLearner(net, args)
    rng = np.random.default_rng(1)
    seen = []
    used = []
    original = ppo.ppo_loss

    def spy(net_, obs, *rest):
        used.append((net_.obs_norm.mean.clone(), net_.obs_norm.std.clone()))
        return original(net_, obs, *rest)

    monkeypatch.setattr(ppo, "ppo_loss", spy)
    for update in range(3):
        sample = rollout_sample(rng, version=learner.updates)  # acted with the latest parameters
        acted = ~sample.data["last"][:, :-1]
        seen.append(sample.data["observation"][:, :-1][acted])
        learner.step(sample)
        everything = np.concatenate(seen).astype(np.float64)
        np.testing.assert_allclose(net.obs_norm.mean.numpy(), everything.mean(0), rtol=1e-5)
        np.testing.assert_allclose(net.obs_norm.std.numpy(), everything.std(0), rtol=1e-5)
        if update == 0:
            assert all(torch.equal(m, torch.zeros(3)) and torch.equal(s, torch.ones(3)) for m, s in used)
    assert len(seen[0]) == 7  # 2 lanes x 4 steps, less lane 0's final-observation row
    x = torch.tensor([[1e6, -1e6, 3.0]])
    z = net.features(x)
    assert z[0, 0] == 10.0 and z[0, 1] == -10.0  # clipped to +-10
    assert torch.allclose(z[0, 2], (x[0, 2] - net.obs_norm.mean[2]) / net.obs_norm.std[2])


def test_normalised_rewards_reach_the_targets_and_checkpoints_keep_every_statistic(monkeypatch):
    torch.manual_seed(0)
    args = ppo.Args(env_id="Pendulum-v1", num_envs=2, n_steps=4, n_epochs=1, minibatch_size=8, hidden=(8,),
                    normalize_obs=True, normalize_reward=True, gamma=0.9)
    learner = ppo.PPOLearner(ppo.ActorCritic(3, 1, (8,), continuous=True, normalize_obs=True), args)
    rng = np.random.default_rng(2)
    seen_targets = []
    original = ppo.rollout_targets

    def spy(values, rows, mask, gamma, lam):
        seen_targets.append(np.array(rows["reward"]))
        return original(values, rows, mask, gamma, lam)

    monkeypatch.setattr(ppo, "rollout_targets", spy)
    learner.step(rollout_sample(rng, lanes=[1, 0]))
    # rewards of 1: the learner saw them divided by the std of the returns
    std = np.sqrt(learner.return_stats.var)
    np.testing.assert_allclose(seen_targets[0], np.ones((2, 5)) / std, rtol=1e-6)
    # sample row 0 is lane 1: 1, 1.9, its episode cut, then 1 after the final-observation row; lane 0 runs on
    np.testing.assert_allclose(learner.return_carry, [1 + 0.9 + 0.81 + 0.729, 1.0])
    state = learner.state_dict()
    other = ppo.PPOLearner(ppo.ActorCritic(3, 1, (8,), continuous=True, normalize_obs=True), args)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.return_carry, learner.return_carry)
    assert other.return_stats.var == learner.return_stats.var
    assert torch.equal(other.net.obs_norm.std, learner.net.obs_norm.std)
    plain = ppo.PPOLearner(ppo.ActorCritic(3, 1, (8,), continuous=True), ppo.Args(env_id="Pendulum-v1", num_envs=2))
    with pytest.raises(ValueError, match="--normalize-obs: the saved learner was trained with it; run with the "
                                         "saved run's flags"):
        plain.load_state_dict(state)


def test_a_run_with_both_normalisations_and_its_config(tmp_path):
    args = ppo.Args(env_id="Pendulum-v1", total_steps=512, num_envs=2, n_steps=64, n_epochs=1, minibatch_size=64,
                    hidden=(8,), eval_every=0, eval_episodes=1, progress=False, logdir=str(tmp_path / "run"),
                    normalize_obs=True, normalize_reward=True)
    result = ppo.main(args)
    assert result.learner_steps >= 3 and np.isfinite(result.final_evaluation)
    assert result.learner_metrics["steps"] == 128  # every step of a rollout of 2 lanes x 64 trained on
    again = ppo.parse_args(["--config", str(tmp_path / "run" / "config.json")])
    assert again.normalize_obs and again.normalize_reward
