"""Atari games: FIRE after resets and lives lost, and the DQN and PPO baselines on their Atari presets (the
Nature DQN network on frame stacks stored once, rewards clipped in the loss, game scores logged)."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from baselines import dqn, make_env, ppo
from rlflow.envs import FireReset
from rlflow.replay import Transition


class Lives(gym.Env):
    """A game with NOOP and FIRE: each step scores its action's number; a life is lost at steps 3 and 6, the
    game ends at step 9 (3 lives)."""

    observation_space = gym.spaces.Box(0, 255, (1,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.log = []

    def get_action_meanings(self):
        return ["NOOP", "FIRE"]

    def reset(self, *, seed=None, options=None):
        self.t = 0
        self.log.append("reset")
        return np.zeros(1, np.uint8), {"lives": 3}

    def step(self, action):
        self.t += 1
        self.log.append(int(action))
        lives = 3 - (self.t >= 3) - (self.t >= 6) - (self.t >= 9)
        return np.full(1, self.t, np.uint8), float(action), lives == 0, False, {"lives": lives}


def test_fire_reset_fires_after_resets_and_lives_lost():
    env = FireReset(Lives())
    obs, info = env.reset()
    assert obs.tolist() == [1] and env.unwrapped.log == ["reset", 1]
    rewards = []
    for _ in range(5):
        obs, reward, _, _, info = env.step(0)
        rewards.append(reward)
    # game step 3 loses a life: FIRE follows at once (game step 4, its reward 1 added); step 6 likewise
    assert env.unwrapped.log == ["reset", 1, 0, 0, 1, 0, 0, 1, 0]
    assert rewards == [0.0, 1.0, 0.0, 1.0, 0.0] and obs.tolist() == [8] and info["lives"] == 1
    _, _, terminated, _, _ = env.step(0)
    assert terminated  # the last life lost ends the game: no FIRE after it
    assert env.unwrapped.log[-2:] == [0, 0]


def test_a_game_without_fire_passes_through():
    class NoFire(Lives):
        def get_action_meanings(self):
            return ["NOOP", "RIGHT"]

    env = FireReset(NoFire())
    env.reset()
    for _ in range(4):
        env.step(0)
    assert env.unwrapped.log == ["reset", 0, 0, 0, 0]


def test_nature_q_network_on_frame_stacks():
    q = dqn.QNetwork((4, 84, 84), 6, (512,), dueling=False)
    out = q(torch.zeros(3, 4, 84, 84, dtype=torch.uint8))
    assert out.shape == (3, 6)
    assert q.torso.out_features == 3136


def test_clipped_rewards_are_signs_in_the_td_target():
    q = dqn.QNetwork(1, 2, (), dueling=False)
    with torch.no_grad():
        q.head.weight.zero_()
        q.head.bias.zero_()
    batch = Transition(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long), torch.tensor([5.0, -0.5, 0.0]),
                       torch.zeros(3), torch.zeros(3, 1))
    _, td = dqn.td_loss(q, q, batch, torch.ones(3), double_q=False, clip_rewards=True)
    assert td.tolist() == [1.0, -1.0, 0.0]
    _, td = dqn.td_loss(q, q, batch, torch.ones(3), double_q=False)
    assert td.tolist() == [5.0, -0.5, 0.0]


def test_clipped_rewards_need_one_step_transitions(tmp_path):
    args = dqn.parse_args(["--env-id", "ALE/Pong-v5", "--n-step", "3", "--logdir", str(tmp_path)])
    with pytest.raises(ValueError, match="expected --n-step 1, got 3"):
        dqn.main(args)


def test_atari_envs_take_no_gymnasium_wrappers():
    with pytest.raises(ValueError, match=r"Atari envs take no \['wrappers'\]"):
        make_env("ALE/Pong-v5", 2, 0, wrappers=[])


@pytest.mark.timeout(300)
def test_dqn_runs_pong_on_its_preset(tmp_path):
    args = dqn.parse_args(["--env-id", "ALE/Pong-v5", "--total-steps", "400", "--learning-starts", "200",
                           "--buffer-size", "2000", "--eval-every", "0", "--eval-episodes", "1", "--no-progress",
                           "--logdir", str(tmp_path)])
    result = dqn.main(args)
    assert result.env_steps == 400 and result.learner_steps > 0
    assert result.evaluations and -21 <= result.evaluations[-1][1] <= 21  # a game's score
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["clip_rewards"] and config["hidden"] == [512] and config["n_step"] == 1


@pytest.mark.timeout(300)
def test_ppo_runs_breakout_on_its_preset(tmp_path):
    args = ppo.parse_args(["--env-id", "ALE/Breakout-v5", "--total-steps", "256", "--num-envs", "2", "--n-steps",
                           "32", "--minibatch-size", "32", "--n-epochs", "1", "--eval-every", "0", "--eval-episodes",
                           "1", "--no-progress", "--logdir", str(tmp_path)])
    result = ppo.main(args)
    assert result.env_steps == 256 and result.learner_steps >= 3
    assert result.evaluations and result.evaluations[-1][1] >= 0
    assert json.loads((tmp_path / "config.json").read_text())["clip_rewards"]
    assert all(math.isfinite(v) for v in (result.learner_metrics or {}).values() if isinstance(v, float))


def test_every_atari_game_takes_the_atari_preset_unless_it_has_its_own(capsys):
    args = dqn.parse_args(["--env-id", "ALE/Breakout-v5", "--total-steps", "5"])
    assert args.clip_rewards and args.hidden == (512,) and args.learning_starts == 100_000 and args.total_steps == 5
    assert capsys.readouterr().out.startswith("preset: atari (RL Baselines3 Zoo's DQN settings for Atari")
    assert ppo.parse_args(["--env-id", "ALE/Pong-v5"]).n_steps == 128
    assert not dqn.parse_args(["--env-id", "ALE/Pong-v5", "--preset", "none"]).clip_rewards
