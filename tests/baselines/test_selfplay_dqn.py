"""baselines/selfplay_dqn.py: the legal-move TD loss by hand, and a short run on tictactoe."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from baselines import selfplay_dqn
from rlflow.replay import Transition

pytest.importorskip("pettingzoo.classic.tictactoe_v3")


def constant_q(values):
    net = selfplay_dqn.QNetwork(obs_shape=2, n_actions=len(values), hidden=(), dueling=False)
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.bias.copy_(torch.tensor(values))
    return net


def test_td_loss_maximises_over_legal_moves_only():
    q, target = constant_q([1.0, 5.0, 3.0]), constant_q([1.0, 5.0, 3.0])
    obs = {"observation": np.zeros((2, 2), np.float32), "action_mask": np.ones((2, 3), bool)}
    nxt = {"observation": np.zeros((2, 2), np.float32),
           "action_mask": np.array([[True, False, True], [False, False, False]])}
    batch = Transition(obs, np.array([0, 2]), np.float32([1.0, -1.0]), np.float32([0.5, 0.0]), nxt)
    # move 1 (Q 5) is illegal next: y0 = 1 + .5 * 3 = 2.5 against Q 1; the game is over for row 1: y1 = -1
    # against Q 3. Loss ((1 - 2.5)^2 + (3 + 1)^2) / 2 = 9.125.
    assert selfplay_dqn.td_loss(q, target, batch).item() == pytest.approx(9.125)


def test_selfplay_runs_and_evaluates(tmp_path):
    args = selfplay_dqn.Args(total_turns=600, num_envs=2, learning_starts=100, batch_size=16, hidden=(16,),
                             eval_every=300, eval_games=6, logdir=str(tmp_path), progress=False)
    final = selfplay_dqn.main(args)
    assert final["win"] + final["draw"] + final["loss"] == pytest.approx(1.0)
    assert (tmp_path / "eval.csv").exists() and (tmp_path / "learning_curve.png").exists()
    # the saved network evaluated on its own: the run's final evaluation used seed 99_999
    again = dataclasses.replace(args, evaluate=str(tmp_path / "q.pt"), seed=99_999, logdir=str(tmp_path / "eval"))
    assert selfplay_dqn.main(again) == final and not (tmp_path / "eval").exists()
    assert selfplay_dqn.main(dataclasses.replace(again, evaluate=str(tmp_path))) == final  # the run's directory
    with pytest.raises(ValueError, match="run checkpoints are not supported; got checkpoint_every=10"):
        selfplay_dqn.main(dataclasses.replace(args, checkpoint_every=10))
