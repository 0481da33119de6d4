"""Atari games: FIRE after resets and lives lost, and the DQN and PPO baselines on their Atari presets (the
Nature DQN network on frame stacks stored once, rewards clipped in the loss, game scores logged)."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from baselines import dqn, make_env, ppo
from rlflow.envs import EpisodicLife, FireReset, GymEnvironment, atari, atari_env, to_autoreset_mode
from rlflow.loop.actors import EpisodeStats
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
    assert args.clip_rewards and args.hidden == (512,) and args.learning_starts == 80_000 and args.total_steps == 5
    assert capsys.readouterr().out.startswith("preset: atari (RL Baselines3 Zoo's DQN settings for Atari")
    assert ppo.parse_args(["--env-id", "ALE/Pong-v5"]).n_steps == 128
    assert not dqn.parse_args(["--env-id", "ALE/Pong-v5", "--preset", "none"]).clip_rewards


def test_episodic_life_ends_an_episode_at_each_life_lost_and_goes_on_with_the_game():
    env = EpisodicLife(FireReset(Lives()))
    obs, info = env.reset(seed=0)
    assert obs.tolist() == [1] and not info["game_over"]
    steps = [env.step(0)[1:] for _ in range(2)]  # game step 3 loses a life (FIRE follows: step 4, reward 1)
    assert [(r, term, trunc, i["game_over"]) for r, term, trunc, i in steps] == [(0.0, False, False, False),
                                                                                  (1.0, True, False, False)]
    obs, info = env.reset()  # goes on with the game: one no-op step, no new game
    assert obs.tolist() == [5] and not info["game_over"] and info["lives"] == 2
    assert env.unwrapped.log == ["reset", 1, 0, 0, 1, 0]
    assert env.step(0)[1:3] == (1.0, True)  # the second life lost
    env.reset()
    _, reward, terminated, _, info = env.step(0)  # the last life: the game is over
    assert (reward, terminated, info["game_over"]) == (0.0, True, True)
    env.reset()
    assert env.unwrapped.log[-3:] == [0, "reset", 1]  # a new game


@pytest.mark.parametrize("mode", ["one env", "same_step", "next_step", "disabled"])
def test_episode_statistics_count_whole_games_across_lives(mode):
    def game():
        return EpisodicLife(FireReset(Lives()))

    if mode == "one env":
        env = GymEnvironment(game(), seed=0)
    else:
        env = GymEnvironment(gym.vector.SyncVectorEnv([game, game], autoreset_mode=to_autoreset_mode(mode)), seed=0)
    stats = EpisodeStats(env.num_envs)
    ts = env.reset()
    ends, games = 0, []
    per_lane = env.num_envs
    for _ in range(100):  # a game is 4 agent steps (a life each of 2, 1 and 1), 3 episodes, return 2
        ts = env.step(np.zeros(env.num_envs, np.int64))
        ends += int(ts.last.sum())
        games += stats.update(ts)
        if len(games) == 3 * per_lane:
            break
    assert ends == 9 * per_lane  # three games, an episode a life
    assert games == [(2.0, 4)] * (3 * per_lane)
    assert stats.lengths.tolist() == [0] * per_lane and stats.returns.tolist() == [0.0] * per_lane


def test_atari_episodic_life_for_training_whole_games_for_evaluation():
    env = atari("ALE/Breakout-v5", 1, seed=0, episodic_life=True)
    stats = EpisodeStats(1)
    ts = env.reset()
    rng = np.random.default_rng(0)
    lives_lost, games = 0, []
    while not games:
        ts = env.step(rng.integers(0, 4, 1))
        lives_lost += int(ts.last[0])
        games += stats.update(ts)
        if ts.last[0]:  # each life starts a new stack: its first frame, four times
            assert ts.first[0] and all((ts.observation[0, j] == ts.observation[0, 0]).all() for j in range(4))
    assert lives_lost == 5  # Breakout's five lives, an episode each
    assert len(games) == 1 and games[0][0] >= 0
    plain = atari_env("ALE/Breakout-v5")
    assert not any(isinstance(w, EpisodicLife) for w in _wrappers(plain))


def _wrappers(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env

