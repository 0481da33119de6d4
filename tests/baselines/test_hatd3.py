"""baselines/hatd3.py: HARL's sequential actor update (each actor sees the new actions of those updated before
it), the targets' smoothing, and a short run on the speaker and the listener, whose spaces differ."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("mpe2")
from baselines import hatd3


def small(tmp_path, **kw):
    return hatd3.Args(total_steps=1_200, num_envs=4, learning_starts=400, batch_size=64, samples_per_insert=1.0,
                      eval_every=600,
                      eval_episodes=2, progress=False, logdir=str(tmp_path / "run"), **kw)


class Recorder(nn.Module):
    """A stand-in critic: Q = -|actions - 0.3|^2, recording the joint actions of every call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, state, actions):
        self.calls.append(actions.detach().clone())
        return -((actions - 0.3) ** 2).sum(dim=1)


def test_each_actor_is_updated_against_the_new_actions_of_those_before_it(tmp_path):
    args = small(tmp_path, fixed_order=True)
    env = hatd3.make_env(args, 2, 0)
    team = hatd3.Team(env, args.hidden)
    learner = hatd3.HATD3Learner(team, 14, args)
    learner.q1, learner.q1_target = Recorder(), Recorder()  # no parameters: the soft update skips them
    obs = {k: torch.as_tensor(v) for k, v in env.reset(seed=0).observation["obs"].items()}
    before = [a.detach().clone() for a in team.act(obs)]
    old_targets = [p.detach().clone() for p in learner.target.parameters()]
    learner.update_actors(obs, torch.zeros(2, 14))
    after = [a.detach() for a in team.act(obs)]
    first, second = learner.q1.calls  # speaker (3 actions) first, then the listener (5)
    assert first.shape == second.shape == (2, 8)
    torch.testing.assert_close(first[:, 3:], before[1])  # the listener's old actions while the speaker learns
    torch.testing.assert_close(second[:, :3], after[0])  # the speaker's new actions while the listener learns
    assert not torch.allclose(after[0], before[0]) and not torch.allclose(after[1], before[1])
    # then the target actors moved tau of the way to the new ones
    for p, tp, old in zip(team.parameters(), learner.target.parameters(), old_targets, strict=True):
        torch.testing.assert_close(tp, old + args.tau * (p.detach() - old))


def test_noise_stays_in_the_box_and_smoothing_is_clipped():
    space = type("Box", (), {"low": np.zeros(3, np.float32), "high": np.full(3, 2.0, np.float32), "shape": (3,)})
    actor = hatd3.Actor(4, space, (8,))
    torch.manual_seed(0)
    x = torch.full((10_000, 3), 1.0)
    noisy = actor.noisy(x, std=10.0, clip=0.5)  # half-width 1: the noise is clipped to +- 0.5
    assert noisy.min() >= 0.5 - 1e-6 and noisy.max() <= 1.5 + 1e-6
    wide = actor.noisy(x, std=10.0)  # unclipped noise, the action kept in [0, 2]
    assert wide.min() >= 0.0 and wide.max() <= 2.0 and (wide == 0.0).any() and (wide == 2.0).any()
    out = actor(torch.randn(100, 4))
    assert out.min() >= 0.0 and out.max() <= 2.0


def test_a_short_run_and_its_config(tmp_path):
    args = small(tmp_path)
    result = hatd3.main(args)
    assert [step for step, *_ in result.evaluations] == [600, 1_200]
    assert all(np.isfinite(mean) for _, mean, _ in result.evaluations)
    assert result.learner_steps == pytest.approx((1_200 - 400) / 64, abs=2)  # one update per batch stored
    assert np.isfinite(result.learner_metrics["critic_loss"]) and np.isfinite(result.learner_metrics["q"])
    again = hatd3.parse_args(["--config", str(tmp_path / "run" / "config.json")])
    assert dataclasses.replace(again, config="") == args  # the run's config.json gives its settings back
