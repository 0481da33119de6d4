"""Baselines: each loss against a hand-computed value on a tiny batch, and a short run of each."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from baselines import dqn
from rlflow.loggers import read_csv
from rlflow.replay import Transition


def linear_q(weight) -> dqn.QNetwork:
    """A Q-network with no hidden layer: Q(s) = W s."""
    q = dqn.QNetwork(2, 2, (), dueling=False)
    with torch.no_grad():
        q.head.weight.copy_(torch.tensor(weight, dtype=torch.float32))
        q.head.bias.zero_()
    return q


@pytest.mark.parametrize(("double_q", "expected"), [
    # Q(s) = s, target Q(s) = s swapped. Items: (s=[1,2], a=1, R=1, discount .9, s'=[.5,1]) and
    # (s=[3,0], a=0, R=-1, discount 0, s'=[2,4]); importance weights 1 and .5. Q(s, a) = [2, 3].
    # max_a target Q(s') = [1, 4] -> y = [1 + .9, -1] = [1.9, -1], td = [-.1, -4],
    #   Huber = [.5 * .01, 4 - .5] = [.005, 3.5], loss = (.005 + .5 * 3.5) / 2 = .8775.
    # Double Q: argmax_a Q(s') = [1, 1] -> target Q(s', 1) = [.5, 2] -> y = [1.45, -1], td = [-.55, -4],
    #   Huber = [.15125, 3.5], loss = (.15125 + 1.75) / 2 = .950625.
    (False, 0.8775),
    (True, 0.950625),
])
def test_dqn_td_loss_by_hand(double_q, expected):
    q, target = linear_q([[1, 0], [0, 1]]), linear_q([[0, 1], [1, 0]])
    batch = Transition(observation=torch.tensor([[1.0, 2.0], [3.0, 0.0]]), action=torch.tensor([1, 0]),
                       reward=torch.tensor([1.0, -1.0]), discount=torch.tensor([0.9, 0.0]),
                       next_observation=torch.tensor([[0.5, 1.0], [2.0, 4.0]]))
    loss, td = dqn.td_loss(q, target, batch, torch.tensor([1.0, 0.5]), double_q)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    np.testing.assert_allclose(td.numpy(), [1.45 - 2 if double_q else -0.1, -4.0], rtol=1e-6)


def test_dueling_head_centres_the_advantages():
    q = dqn.QNetwork(3, 4, (8,), dueling=True)
    obs = torch.randn(5, 3)
    x = q.body(obs)
    adv, value = q.head(x), q.value(x)
    torch.testing.assert_close(q(obs), value + adv - adv.mean(dim=1, keepdim=True))
    torch.testing.assert_close(q(obs).mean(dim=1, keepdim=True), value)


@pytest.mark.parametrize("options", [{}, {"double_q": True, "dueling": True, "prioritized": True, "n_step": 3,
                                          "num_envs": 2}])
def test_dqn_runs_and_logs(tmp_path, options):
    args = dqn.Args(total_steps=400, learning_starts=100, samples_per_insert=8.0, batch_size=16, hidden=(16,),
                    eval_every=200, eval_episodes=2, logdir=str(tmp_path), progress=False, **options)
    result = dqn.main(args)
    assert result.env_steps == 400 and result.learner_steps > 0
    losses = [float(r["loss"]) for r in read_csv(tmp_path / "learner.csv")]
    assert losses and all(math.isfinite(v) for v in losses)
    assert [int(r["step"]) for r in read_csv(tmp_path / "eval.csv")] == [200, 400]
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    saved = torch.load(tmp_path / "learner.pt", weights_only=False)
    learner = dqn.DQNLearner(dqn.QNetwork(4, 2, (16,), args.dueling), args)
    learner.load_state_dict(saved["learner"])
    assert learner.steps == result.learner_steps
