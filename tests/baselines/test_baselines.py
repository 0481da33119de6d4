"""Baselines: each loss against a hand-computed value on a tiny batch, and a short run of each."""

from __future__ import annotations

import ast
import dataclasses
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from baselines import BestLearner, actor_args, dqn, ppo, replay_rate_limiter, sac, td3
from rlflow import envs
from rlflow.loggers import read_csv
from rlflow.loop import checkpoint as run_checkpoint
from rlflow.loop.actors import evaluate
from rlflow.loop.checkpoint import load_state
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
    saved = load_state(tmp_path / "learner.pt")
    learner = dqn.DQNLearner(dqn.QNetwork(4, 2, (16,), args.dueling), args)
    learner.load_state_dict(saved["learner"])
    assert learner.steps == result.learner_steps


@pytest.mark.parametrize(("train_freq", "lanes", "n_step", "min_diff", "max_diff"), [
    # spi 64, batch 128, learning_starts 1000: offset 64,000. The lanes step 16 times from the offset (diff
    # 65,024) and are refused the next step's up to lanes * n_step transitions; the learner trains back down to
    # 64,000 and is refused below: min_diff 64,000 - 64, max_diff 64,000 + (16 + lanes * n_step - 0.5) * 64.
    (16, 1, 1, 63_936.0, 65_056.0),
    (16, 1, 3, 63_936.0, 65_184.0),  # DQN's 3-step transitions
    (16, 2, 1, 63_936.0, 65_120.0),  # 2 envs
    (0, 1, 1, 64_000.0 - 300, 64_000.0 + 300),  # spread: the error_buffer given
])
def test_train_freq_sets_the_window_of_its_bursts(train_freq, lanes, n_step, min_diff, max_diff):
    args = types.SimpleNamespace(train_freq=train_freq, samples_per_insert=64.0, batch_size=128, learning_starts=1000,
                                 num_actors=0)
    limiter = replay_rate_limiter(args, lanes, n_step, error_buffer=300.0)
    assert (limiter.samples_per_insert, limiter.min_size_to_sample) == (64.0, 1000)
    assert (limiter.min_diff, limiter.max_diff) == (min_diff, max_diff)


@pytest.mark.parametrize("num_envs", [1, 2])
def test_dqn_train_freq_trains_in_bursts(num_envs, tmp_path):
    """Bursts of 16 * 64 / 128 = 8 learner steps every 16 transitions from 1,016 stored on: at 1,016, 1,032, ..,
    1,288 (the run's last burst; 1,300 env steps), 18 bursts, 144 steps, with one env or two (8 steps of both).
    Spread evenly, the same ratio gives 151: (1,298 * 64 - 63,744) // 128, one step whenever the diff is 128
    above min_diff 63,744."""
    args = dqn.Args(total_steps=1300, learning_starts=1000, train_freq=16, samples_per_insert=64.0, batch_size=128,
                    n_step=1, num_envs=num_envs, hidden=(16,), eval_every=0, eval_episodes=1, logdir=str(tmp_path),
                    progress=False)
    assert dqn.main(args).learner_steps == 144
    spread = dqn.main(dataclasses.replace(args, train_freq=0, logdir=str(tmp_path / "spread")))
    assert spread.learner_steps == 151


@pytest.mark.parametrize("baseline", ["sac", "td3"])
def test_continuous_baselines_train_in_bursts_with_train_freq(baseline, tmp_path):
    """Pendulum, learning from 200 stored transitions, 256 samples per transition, batches of 256: with
    --train-freq 8, bursts of 8 learner steps at 208, 216, .., 392 stored (24 bursts, 192 steps in 400 env
    steps); spread, one step per transition from 200 on (the error_buffer of 512 lets two run at 200: 201)."""
    import importlib

    module = importlib.import_module(f"baselines.{baseline}")
    base = ["--env-id", "Pendulum-v1", "--total-steps", "400", "--learning-starts", "200", "--batch-size", "256",
            "--samples-per-insert", "256", "--hidden", "16", "16", "--eval-every", "0", "--eval-episodes", "1",
            "--no-progress"]
    bursts = module.main(module.parse_args([*base, "--train-freq", "8", "--logdir", str(tmp_path / "b")]))
    spread = module.main(module.parse_args([*base, "--logdir", str(tmp_path / "s")]))
    assert (bursts.learner_steps, spread.learner_steps) == (192, 201)


def test_dqn_train_freq_is_a_multiple_of_its_envs(tmp_path):
    args = dqn.parse_args(["--num-envs", "3", "--train-freq", "16", "--logdir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"--train-freq: expected .* a multiple of the 3 envs .* got 16"):
        dqn.main(args)


@pytest.mark.parametrize("baseline", ["dqn", "sac"])
@pytest.mark.parametrize(("flags", "match"), [
    (["--train-freq", "16", "--samples-per-insert", "60", "--batch-size", "128"],
     r"--train-freq: .* whole number >= 1, got 16 \* 60 / 128 = 7.5; set --samples-per-insert"),
    (["--train-freq", "1", "--samples-per-insert", "16", "--batch-size", "64"], r"got 1 \* 16 / 64 = 0.25"),
    (["--train-freq", "-4"], r"--train-freq: expected env steps >= 0, a multiple of the 1 envs .* got -4"),
    (["--train-freq", "4", "--num-actors", "2"], r"--train-freq 4 with --num-actors 2: .* drop --train-freq .* or "
                                                 r"--num-actors"),
])
def test_train_freq_refuses_what_cannot_burst(baseline, flags, match, tmp_path):
    import importlib

    module = importlib.import_module(f"baselines.{baseline}")
    args = module.parse_args([*flags, "--logdir", str(tmp_path)])
    with pytest.raises(ValueError, match=match):
        module.main(args)
    assert not (tmp_path / "config.json").exists()  # refused before the run wrote anything


@pytest.mark.timeout(300)
def test_dqn_with_actor_processes_runs_apex_style(ray_local, tmp_path):
    """--num-actors 2: actor processes with their own networks and Ape-X's epsilons, the replay in a
    replay server, the learner here; the train log tags each episode with its actor, evaluation is greedy,
    and the learner's steps follow the rate limiter's samples per insert."""
    args = dqn.Args(total_steps=3_000, learning_starts=200, samples_per_insert=8.0, batch_size=32, hidden=(16,),
                    eval_every=1_500, eval_episodes=2, logdir=str(tmp_path), progress=False, num_actors=2,
                    prioritized=True, sync_period=100)
    result = dqn.main(args)
    assert result.env_steps >= 3_000 and [e for e, _, _ in result.evaluations] and result.learner_steps > 0
    assert abs(result.learner_steps - (result.env_steps - 200) * 8 / 32) <= 32 * 3 * 8 * 2 / 32 + 64
    assert {float(r["actor"]) for r in read_csv(tmp_path / "train.csv")} == {0.0, 1.0}
    assert [dqn.apex_epsilon(i, 3) for i in range(3)] == pytest.approx([0.4, 0.4 ** 4.5, 0.4 ** 8])
    # Each actor's final epsilon: Ape-X's, no lower than the one-process run's (the env's preset's, or the flag).
    for env_id, n, flag, want in [("CartPole-v1", 2, None, [0.4, 0.04]), ("Acrobot-v1", 2, None, [0.4, 0.1]),
                                  ("CartPole-v1", 4, None, [0.4, 0.4 ** (1 + 7 / 3), 0.04, 0.04]),
                                  ("CartPole-v1", 3, "0.001", [0.4, 0.4 ** 4.5, 0.001]),
                                  ("CartPole-v1", 1, None, [0.4])]:
        given = ["--exploration-final-eps", flag] if flag is not None else []
        a = dqn.parse_args(["--env-id", env_id, "--num-actors", str(n), *given])
        assert [dqn.actor_epsilon(a, i) for i in range(n)] == pytest.approx(want)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["td3", "sac"])
def test_continuous_baselines_run_with_actor_processes(ray_local, tmp_path, name):
    """TD3 and SAC with --num-actors 2: one env per actor, their own seeds and half the random start each;
    the run learns from both actors' episodes."""
    module = {"td3": td3, "sac": sac}[name]
    # Few samples per insert: the learner never holds the actors back, so both run ~600 steps (3 episodes each)
    # however the two cores are shared (with a learner-bound ratio one actor's blocks could take every slot).
    args = module.Args(total_steps=1_200, learning_starts=200, samples_per_insert=4.0, batch_size=32, hidden=(16,),
                       eval_every=1_200, eval_episodes=1, logdir=str(tmp_path), progress=False, num_actors=2,
                       sync_period=64)
    result = module.main(args)
    assert result.env_steps >= 1_200 and result.learner_steps > 0 and result.evaluations
    assert {float(r["actor"]) for r in read_csv(tmp_path / "train.csv")} == {0.0, 1.0}
    firsts = [actor_args(args, i) for i in range(2)]
    assert [a.learning_starts for a in firsts] == [100, 100] and len({a.seed for a in firsts}) == 2


def test_a_saved_learner_is_evaluated_without_training(tmp_path, capsys):
    args = dqn.Args(total_steps=300, learning_starts=100, samples_per_insert=8.0, batch_size=16, hidden=(16,),
                    eval_every=300, eval_episodes=1, logdir=str(tmp_path / "run"), progress=False)
    dqn.main(args)
    saved = str(tmp_path / "run" / "learner.pt")
    again = dataclasses.replace(args, evaluate=saved, eval_episodes=4, seed=7, logdir=str(tmp_path / "eval"))
    result = dqn.main(again)
    assert result.env_steps == 0 and result.learner_steps == 0 and not (tmp_path / "eval").exists()
    # the saved network's own greedy returns over the same seeded episodes
    learner = dqn.DQNLearner(dqn.QNetwork(4, 2, (16,), False), args)
    learner.load_state_dict(load_state(saved)["learner"])
    by_hand = evaluate(envs.make("CartPole-v1", num_envs=None), dqn.exploration(learner.q, 2, args), 4, seed=7)
    assert result.final_evaluation == pytest.approx(np.mean(by_hand))
    assert f"mean return {np.mean(by_hand):.2f} +- " in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"flags saved vs given: \{'hidden': \(\(16,\), \(8,\)\)\}"):
        dqn.main(dataclasses.replace(again, hidden=(8,)))
    # the run's directory names its learner.pt: the same evaluation
    by_dir = dqn.main(dataclasses.replace(again, evaluate=str(tmp_path / "run")))
    assert by_dir.final_evaluation == result.final_evaluation
    assert f"evaluation of {saved}: mean return" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match=r"the directory has no learner.pt"):
        dqn.main(dataclasses.replace(again, evaluate=str(tmp_path)))


def test_dqn_target_moves_tau_of_the_way_every_period():
    # tau .25 every 2 learner steps: step 1 leaves the target; step 2 moves it to .75 target + .25 online
    args = dqn.Args(hidden=(4,), tau=0.25, target_update_period=2, total_steps=2_000, learning_starts=0)
    learner = dqn.DQNLearner(dqn.QNetwork(3, 2, (4,), False), args)
    sample = types.SimpleNamespace(data=Transition(
        observation=np.ones((2, 3), np.float32), action=np.array([0, 1]), reward=np.float32([1, 0]),
        discount=np.float32([0.9, 0]), next_observation=np.zeros((2, 3), np.float32)), weights=np.ones(2, np.float32))
    before = [p.clone() for p in learner.target.parameters()]
    learner.step(sample)
    for p, b in zip(learner.target.parameters(), before, strict=True):
        torch.testing.assert_close(p, b, rtol=0, atol=0)
    learner.step(sample)
    for p, b, q in zip(learner.target.parameters(), before, learner.q.parameters(), strict=True):
        torch.testing.assert_close(p, 0.75 * b + 0.25 * q)
    copy = dqn.DQNLearner(dqn.QNetwork(3, 2, (4,), False), dataclasses.replace(args, tau=1.0, target_update_period=1))
    copy.step(sample)
    for p, q in zip(copy.target.parameters(), copy.q.parameters(), strict=True):
        assert torch.equal(p, q)  # tau 1: an exact copy


def test_dqn_learning_rate_falls_linearly_to_zero_over_the_run():
    # (10,000 - 1,000) stored transitions, 16 samples each, 64 per step: 2,250 learner steps
    args = dqn.Args(total_steps=10_000, learning_starts=1_000, samples_per_insert=16.0, batch_size=64,
                    learning_rate=1e-3, hidden=(4,))
    assert dqn.expected_learner_steps(args) == 2_250
    learner = dqn.DQNLearner(dqn.QNetwork(3, 2, (4,), False), args)
    rates = []
    for steps in (0, 1_125, 2_250, 3_000):
        learner.steps = steps
        rates.append(learner.learning_rate())
    assert rates == pytest.approx([1e-3, 5e-4, 0.0, 0.0])
    learner.args = dataclasses.replace(args, anneal_lr=False)
    assert learner.learning_rate() == 1e-3


@pytest.mark.parametrize(("env_id", "given", "expected"), [
    ("CartPole-v1", None, 0.04), ("Acrobot-v1", None, 0.1), ("Acrobot-v1", "0.2", 0.2), ("CartPole-v1", "0", 0.0)])
def test_dqn_epsilon_falls_to_the_envs_preset_final_value_unless_given(env_id, given, expected):
    flags = ["--env-id", env_id, "--total-steps", "1000", "--exploration-fraction", "0.5"]
    args = dqn.parse_args(flags + (["--exploration-final-eps", given] if given is not None else []))
    policy = dqn.exploration(dqn.QNetwork(4, 2, (4,), False), 2, args)
    assert args.exploration_final_eps == expected
    policy.steps = 250  # half-way through the 500 steps of decay
    assert policy.epsilon == pytest.approx(1.0 + 0.5 * (expected - 1.0))
    policy.steps = 900
    assert policy.epsilon == pytest.approx(expected)


def test_a_run_saves_the_learner_of_its_best_evaluation(tmp_path, capsys):
    args = dqn.Args(total_steps=2_000, learning_starts=100, samples_per_insert=8.0, batch_size=16, hidden=(16,),
                    eval_every=400, eval_episodes=2, logdir=str(tmp_path / "run"), progress=False, seed=1)
    final = dqn.main(args)
    evals = [(int(r["step"]), float(r["return"])) for r in read_csv(tmp_path / "run" / "eval.csv")]
    returns = [r for _, r in evals]
    index = returns.index(max(returns))  # the first of the best
    assert index < len(evals) - 1 and len(set(returns)) > 1  # this run's best is not its final learner
    best_path = tmp_path / "run" / "learner_best.pt"
    saved = load_state(best_path)
    assert saved["evaluation"] == {"env_steps": evals[index][0], "return": returns[index]}
    assert saved["args"] == dataclasses.asdict(args)
    assert 0 < saved["learner"]["steps"] < final.learner_steps
    # its network plays the best evaluation's episodes (the run seeds evaluation k with seed + 10,000 + k)
    learner = dqn.DQNLearner(dqn.QNetwork(4, 2, (16,), False), args)
    learner.load_state_dict(saved["learner"])
    replay = evaluate(envs.make("CartPole-v1", num_envs=None), dqn.exploration(learner.q, 2, args), 2,
                      seed=args.seed + 10_000 + index)
    assert np.mean(replay) == pytest.approx(returns[index])
    out = capsys.readouterr().out
    assert out.count(f"eval at {evals[-1][0]} env steps: mean return {returns[-1]:.2f}") == 1  # not repeated at the end
    assert f"done: {final.env_steps} env steps, {final.learner_steps} learner steps in " in out
    assert f"best evaluation: mean return {returns[index]:.1f} at {evals[index][0]} env steps" in out
    # it loads with --evaluate like learner.pt
    result = dqn.main(dataclasses.replace(args, evaluate=str(best_path), seed=args.seed + 10_000 + index,
                                          logdir=str(tmp_path / "eval")))
    assert result.final_evaluation == pytest.approx(returns[index])


def test_best_learner_keeps_the_first_best_and_resumes_from_the_saved_one(tmp_path, monkeypatch):
    learner = types.SimpleNamespace(state={"w": torch.zeros(1)})
    learner.state_dict = lambda: {"w": learner.state["w"].clone()}
    path = tmp_path / "learner_best.pt"
    best = BestLearner(path, dqn.Args(), learner, resume=False)
    for step, ret, w in ((100, 5.0, 1.0), (200, 3.0, 2.0), (300, 7.0, 3.0), (400, 7.0, 4.0)):
        learner.state["w"] = torch.tensor([w])
        best("eval", step, {"return": ret, "return_std": 0.0})
        best("train", step, {"return": 100.0, "length": 1})  # training episodes are not evaluations
    saved = load_state(path)
    assert saved["evaluation"] == {"env_steps": 300, "return": 7.0} and saved["learner"]["w"].item() == 3.0
    nothing_to_resume = BestLearner(path, dqn.Args(), learner, resume=True)  # no run checkpoint: a new run
    assert (nothing_to_resume.env_steps, nothing_to_resume.mean_return) == (0, -np.inf)
    monkeypatch.setattr(run_checkpoint, "latest", lambda d: d / "step-000000000300")  # a run checkpoint to resume
    resumed = BestLearner(path, dqn.Args(), learner, resume=True)
    assert (resumed.env_steps, resumed.mean_return) == (300, 7.0)
    resumed("eval", 500, {"return": 6.0, "return_std": 0.0})
    assert load_state(path)["evaluation"]["env_steps"] == 300
    fresh = BestLearner(path, dqn.Args(), learner, resume=False)  # a new run in the same logdir starts over
    fresh("eval", 100, {"return": 1.0, "return_std": 0.0})
    assert load_state(path)["evaluation"] == {"env_steps": 100, "return": 1.0}


# --------------------------------------------------------------------------- TD3
def linear_td3():
    from baselines import td3

    low, high = np.float32([-2.0]), np.float32([2.0])
    actor = td3.Actor(1, low, high, ())
    critics = (td3.Critic(1, 1, ()), td3.Critic(1, 1, ()))
    with torch.no_grad():
        actor.net[0].weight.zero_()
        actor.net[0].bias.zero_()  # mu(s) = 2 tanh(0) = 0
        for critic, w in zip(critics, ([1.0, 1.0], [1.0, 2.0]), strict=True):  # Q1 = s + a, Q2 = s + 2a
            critic.net[0].weight.copy_(torch.tensor([w]))
            critic.net[0].bias.zero_()
    return td3, actor, critics


@pytest.mark.parametrize(("noise", "expected"), [
    # s = 1, a = .5, r = 1, discount .9, s' = 2; Q1(s, a) = 1.5, Q2(s, a) = 2.
    (0.0, (2.8 - 1.5) ** 2 + (2.8 - 2) ** 2),  # a' = 0: min(2, 2) = 2, y = 1 + .9 * 2 = 2.8 -> 2.33
    (0.3, (3.07 - 1.5) ** 2 + (3.07 - 2) ** 2),  # a' = .3: min(2.3, 2.6), y = 3.07 -> 3.6098
    (5.0, (4.6 - 1.5) ** 2 + (4.6 - 2) ** 2),  # a' clipped to 2: min(4, 6), y = 4.6 -> 16.37
])
def test_td3_critic_loss_by_hand(noise, expected):
    td3, actor, critics = linear_td3()
    batch = Transition(observation=torch.tensor([[1.0]]), action=torch.tensor([[0.5]]), reward=torch.tensor([1.0]),
                       discount=torch.tensor([0.9]), next_observation=torch.tensor([[2.0]]))
    loss = td3.critic_loss(critics, critics, actor, batch, torch.tensor([[noise]]))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert td3.actor_loss(actor, critics[0], batch).item() == pytest.approx(-1.0)  # -Q1(1, mu(1) = 0)


def test_td3_runs_and_logs(tmp_path):
    from baselines import td3

    args = td3.Args(total_steps=400, learning_starts=200, batch_size=32, samples_per_insert=32.0, hidden=(16,),
                    eval_every=200, eval_episodes=1, logdir=str(tmp_path), progress=False)
    result = td3.main(args)
    assert result.env_steps == 400 and result.learner_steps == 201
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r["critic_loss"])) for r in rows)
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


# --------------------------------------------------------------------------- SAC
def test_sac_losses_by_hand():
    from baselines import sac

    _, _, critics = linear_td3()  # Q1 = s + a, Q2 = s + 2a
    actor = sac.GaussianActor(1, np.float32([-2.0]), np.float32([2.0]), ())
    with torch.no_grad():
        for layer in (actor.mean, actor.log_std):
            layer.weight.zero_()
            layer.bias.zero_()  # mean 0, log std 0
    # noise 0: u = 0, a = 2 tanh(0) = 0, log pi = log N(0; 0, 1) - log(2 (1 - tanh(0)^2) + 1e-6).
    log_pi = -0.5 * math.log(2 * math.pi) - math.log(2 + 1e-6)
    batch = Transition(observation=torch.tensor([[1.0]]), action=torch.tensor([[0.5]]), reward=torch.tensor([1.0]),
                       discount=torch.tensor([0.9]), next_observation=torch.tensor([[2.0]]))
    zero = torch.zeros(1, 1)
    y = 1 + 0.9 * (min(2.0, 2.0) - 0.5 * log_pi)  # s' = 2, a' = 0, alpha = .5
    loss = sac.critic_loss(critics, critics, actor, 0.5, batch, zero)
    assert loss.item() == pytest.approx((y - 1.5) ** 2 + (y - 2.0) ** 2, rel=1e-5)
    a_loss, lp = sac.actor_loss(actor, critics, 0.5, batch.observation, zero)
    assert lp.item() == pytest.approx(log_pi, rel=1e-5)
    assert a_loss.item() == pytest.approx(0.5 * log_pi - 1.0, rel=1e-5)  # min(Q1, Q2)(1, 0) = 1


def test_sac_runs_and_logs(tmp_path):
    from baselines import sac

    args = sac.Args(total_steps=300, learning_starts=100, batch_size=32, samples_per_insert=32.0, hidden=(16,),
                    eval_every=150, eval_episodes=1, logdir=str(tmp_path), progress=False)
    result = sac.main(args)
    assert result.env_steps == 300 and result.learner_steps == 201
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r[k])) for r in rows for k in ("critic_loss", "actor_loss", "alpha"))


# --------------------------------------------------------------------------- PPO
def constant_actor_critic(obs_dim: int, hidden=(4,)):
    from baselines import ppo

    net = ppo.ActorCritic(obs_dim, 2, hidden)
    with torch.no_grad():
        for head in (net.pi[-1], net.v[-1]):
            head.weight.zero_()
            head.bias.zero_()  # logits 0 (pi = 1/2, 1/2) and V = 0 everywhere
    return ppo, net


def test_ppo_loss_by_hand():
    ppo, net = constant_actor_critic(3)
    # pi(a|s) = 1/2 now; old pi(a|s) = 1/4 and 4/5, so the ratios are 2 and 0.625. Advantages 1, -1
    # normalise to +-0.7071 (std with Bessel's correction: sqrt 2). Clip 0.2:
    # min(2 * .7071, 1.2 * .7071) = .8485; min(.625 * -.7071, .8 * -.7071) = -.5657; policy loss -.1414.
    # V = 0 against returns 1 and 2: value loss 2.5. Entropy log 2.
    loss, m = ppo.ppo_loss(net, torch.zeros(2, 3), torch.tensor([0, 1]), torch.log(torch.tensor([0.25, 0.8])),
                           torch.tensor([1.0, -1.0]), torch.tensor([1.0, 2.0]), 0.2, 0.01, 0.5)
    a = 1 / math.sqrt(2)
    policy = -(min(2 * a, 1.2 * a) + min(-0.625 * a, -0.8 * a)) / 2
    assert m["policy_loss"] == pytest.approx(policy, rel=1e-5) and m["value_loss"] == pytest.approx(2.5)
    assert loss.item() == pytest.approx(policy + 0.5 * 2.5 - 0.01 * math.log(2), rel=1e-5)


def test_ppo_gaussian_loss_by_hand():
    """Box actions: a diagonal Gaussian, log-probabilities and entropy summed over the action's dims."""
    from baselines import ppo

    net = ppo.ActorCritic(3, 2, (4,), continuous=True)
    with torch.no_grad():
        for head in (net.pi[-1], net.v[-1]):
            head.weight.zero_()
            head.bias.zero_()  # mean 0 and V = 0 everywhere
        net.log_std.copy_(torch.tensor([0.0, math.log(2.0)]))  # std 1 and 2
    actions = torch.tensor([[0.5, -1.0], [0.0, 2.0]])

    def log_prob(a):  # log N(a0; 0, 1) + log N(a1; 0, 2)
        return -0.5 * a[0] ** 2 - 0.5 * (a[1] / 2) ** 2 - math.log(2.0) - math.log(2 * math.pi)

    new = [log_prob(a) for a in actions.tolist()]
    old = torch.tensor([new[0] - math.log(1.5), new[1] + math.log(2.0)])  # ratios 1.5 and 0.5
    loss, m = ppo.ppo_loss(net, torch.zeros(2, 3), actions, old, torch.tensor([1.0, -1.0]),
                           torch.tensor([1.0, 2.0]), 0.2, 0.01, 0.5)
    a = 1 / math.sqrt(2)  # advantages 1, -1 normalised
    policy = -(min(1.5 * a, 1.2 * a) + min(-0.5 * a, -0.8 * a)) / 2
    entropy = 0.5 * math.log(2 * math.pi * math.e) * 2 + math.log(2.0)  # dims of std 1 and 2
    assert m["policy_loss"] == pytest.approx(policy, rel=1e-5) and m["value_loss"] == pytest.approx(2.5)
    assert m["entropy"] == pytest.approx(entropy, rel=1e-5)
    assert loss.item() == pytest.approx(policy + 0.5 * 2.5 - 0.01 * entropy, rel=1e-5)
    policy_ = ppo.SamplingPolicy(net)  # evaluation acts with the mean; training samples
    mean_actions, extras, _ = policy_.act(np.zeros((2, 3), np.float32), None, evaluation=True)
    assert mean_actions.dtype == np.float32 and mean_actions.shape == (2, 2) and not mean_actions.any()
    np.testing.assert_allclose(extras["log_prob"], [log_prob([0.0, 0.0])] * 2, rtol=1e-6)


def test_ppo_runs_on_box_actions(tmp_path):
    """Pendulum (a Box action): the env clips the Gaussian's actions, the rollout keeps them as sampled."""
    from baselines import ppo

    args = ppo.Args(env_id="Pendulum-v1", total_steps=640, num_envs=4, n_steps=16, n_epochs=2, minibatch_size=32,
                    hidden=(16,), eval_every=320, eval_episodes=1, logdir=str(tmp_path), progress=False)
    seen = []
    original = ppo.PPOLearner.step

    def step(self, sample):
        seen.append(sample.data["action"].copy())
        return original(self, sample)

    ppo.PPOLearner.step = step
    try:
        result = ppo.main(args)
    finally:
        ppo.PPOLearner.step = original
    assert result.env_steps == 640 and result.learner_steps >= 8
    actions = np.concatenate([a.reshape(-1) for a in seen])
    assert actions.dtype == np.float32 and np.abs(actions).max() > 2.0  # beyond Pendulum's bound of 2, as sampled
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r[k])) for r in rows for k in ("policy_loss", "entropy"))
    assert math.isfinite(result.final_evaluation)


@pytest.mark.parametrize(("end", "advantages", "returns"), [
    # Rows: observations 1, 2, 3, 4 (V(s) = s), rewards 1, 1; step 1 ends the episode, row 2 holds its final
    # observation (last), row 3 starts the next one. gamma = lam = .5.
    # Termination: A1 = 1 - 2 = -1 (R1 = 1); A0 = (1 + .5 * 2 - 1) + .25 * A1 = .75 (R0 = 1.75).
    ("terminated", [0.75, -1.0], [1.75, 1.0]),
    # Truncation: step 1 bootstraps from the final observation: A1 = 1 + .5 * 3 - 2 = .5 (R1 = 2.5);
    # A0 = 1 + .25 * .5 = 1.125 (R0 = 2.125).
    ("truncated", [1.125, 0.5], [2.125, 2.5]),
])
def test_ppo_rollout_targets_by_hand(end, advantages, returns):
    from baselines import ppo

    values = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # V(s) = s
    rows = {"observation": np.float32([[[1], [2], [3], [4]]]), "reward": np.float32([[1, 1, 0, 0]]),
            "terminated": np.array([[False, end == "terminated", False, False]]),
            "truncated": np.array([[False, end == "truncated", False, False]]),
            "last": np.array([[False, False, True, False]])}
    out = ppo.rollout_targets(values, rows, np.ones((1, 4), bool), 0.5, 0.5)
    assert out["valid"][:, 0].tolist() == [True, True, False]  # the final-observation row is no action
    np.testing.assert_allclose(out["advantages"][:2, 0].numpy(), advantages, rtol=1e-6)
    np.testing.assert_allclose(out["returns"][:2, 0].numpy(), returns, rtol=1e-6)


def test_ppo_runs_and_logs(tmp_path):
    from baselines import ppo

    args = ppo.Args(total_steps=640, num_envs=4, n_steps=16, n_epochs=2, minibatch_size=32, hidden=(16,),
                    eval_every=320, eval_episodes=1, logdir=str(tmp_path), progress=False)
    result = ppo.main(args)
    assert result.env_steps == 640 and result.learner_steps >= 8
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r["policy_loss"])) for r in rows)
    assert all(float(r["stale_rollouts"]) == 0 for r in rows)  # one process: no rollout is two updates old


@pytest.mark.parametrize("baseline", ["dqn", "sac", "td3"])
def test_learning_that_could_never_start_is_refused(baseline, tmp_path):
    import importlib

    module = importlib.import_module(f"baselines.{baseline}")
    args = module.parse_args(["--buffer-size", "1000", "--learning-starts", "5000", "--logdir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"--learning-starts: expected at most --buffer-size \(1000\) .* got 5000"):
        module.main(args)


def test_ppo_async_envs_run_the_same_as_sync(tmp_path):
    """--async-envs steps each env in its own process: the same seeded run, step for step."""
    import gymnasium

    from baselines import ppo

    rows, kinds = {}, []
    original = ppo.make_env

    def make_env(*args, **kwargs):
        env = original(*args, **kwargs)
        kinds.append(type(env.env))
        return env

    ppo.make_env = make_env
    try:
        for mode in (False, True):
            args = ppo.Args(total_steps=256, num_envs=2, n_steps=32, n_epochs=2, minibatch_size=32, hidden=(16,),
                            eval_every=0, eval_episodes=1, async_envs=mode, logdir=str(tmp_path / str(mode)),
                            progress=False, seed=3)
            assert ppo.main(args).env_steps == 256
            rows[mode] = read_csv(tmp_path / str(mode) / "learner.csv")
    finally:
        ppo.make_env = original
    assert kinds == [gymnasium.vector.SyncVectorEnv, gymnasium.vector.AsyncVectorEnv]
    assert rows[True] and rows[True] == rows[False]


def test_ppo_drops_rollouts_acted_two_or_more_updates_ago():
    """A rollout with an action of parameters two or more updates older than the learner's is left out of the
    update and counted; one whose first action is one update old is trained on; a batch of stale rollouts
    only makes no update."""
    from types import SimpleNamespace

    from baselines import ppo

    torch.manual_seed(0)
    args = ppo.Args(num_envs=2, n_steps=4, n_epochs=1, minibatch_size=8, hidden=(8,))
    learner = ppo.PPOLearner(ppo.ActorCritic(4, 2, (8,)), args)
    learner.updates = 3
    rng = np.random.default_rng(0)

    def sample(versions):
        e = len(versions)
        no = np.zeros((e, 5), bool)
        data = {"observation": rng.normal(size=(e, 5, 4)).astype(np.float32), "action": np.zeros((e, 5), np.int64),
                "reward": np.ones((e, 5), np.float32), "terminated": no, "truncated": no, "last": no, "first": no,
                "extras": {"log_prob": np.full((e, 5), -0.69, np.float32), "value": np.zeros((e, 5), np.float32),
                           "version": np.array(versions, np.int64)}}
        return SimpleNamespace(data=data, mask=np.ones((e, 5), bool))

    metrics = learner.step(sample([[2, 3, 3, 3, 3], [3, 1, 3, 3, 3]]))
    assert metrics["stale_rollouts"] == 1 and metrics["steps"] == 4 and learner.updates == 4
    before = [p.detach().clone() for p in learner.net.parameters()]
    metrics = learner.step(sample([[2, 2, 2, 2, 2], [0, 0, 0, 0, 0]]))
    assert metrics == {"stale_rollouts": 2.0, "steps": 0.0} and learner.updates == 4
    assert all(torch.equal(a, b) for a, b in zip(before, learner.net.parameters(), strict=True))


def test_ppo_lstm_unroll_restarts_where_told():
    from baselines import ppo

    torch.manual_seed(0)
    net = ppo.ActorCritic(obs_shape=3, n_actions=2, hidden=(8,), lstm=6)
    obs = torch.randn(2, 5, 3)
    state = tuple(torch.randn(2, 6) for _ in range(4))
    resets = torch.zeros(2, 5, dtype=torch.bool)
    resets[0, 2] = True
    with torch.no_grad():
        dist, values = net.unroll(obs, state, resets)
        fresh_dist, fresh_values = net.unroll(obs[:1, 2:], tuple(torch.zeros(1, 6) for _ in range(4)),
                                              torch.zeros(1, 3, dtype=torch.bool))
        _carried_dist, carried_values = net.unroll(obs, state, torch.zeros(2, 5, dtype=torch.bool))
    torch.testing.assert_close(values[:1, 2:], fresh_values)  # lane 0 restarts at step 2
    torch.testing.assert_close(dist.logits[:1, 2:], fresh_dist.logits)
    torch.testing.assert_close(values[1], carried_values[1])  # lane 1 never restarts
    assert not torch.allclose(values[0, 2:], carried_values[0, 2:])


@pytest.mark.parametrize("options", [{"lstm": 16, "chunk_length": 4}, {"value_norm": True}])
def test_ppo_lstm_and_value_norm_run(tmp_path, options):
    from baselines import ppo

    args = ppo.Args(total_steps=640, num_envs=4, n_steps=16, n_epochs=2, minibatch_size=32, hidden=(16,),
                    eval_every=320, eval_episodes=1, logdir=str(tmp_path), progress=False, **options)
    result = ppo.main(args)
    assert result.env_steps == 640 and result.learner_steps >= 8
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r["value_loss"])) for r in rows)


def baseline_modules_imported(path: Path) -> set[str]:
    """The modules of the ``baselines`` package that the Python file at ``path`` imports."""
    folder = path.parent
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "baselines":
            names.add("baselines")
            for alias in node.names:  # `from baselines import dqn` imports a module, `... import train` a name
                if (folder / f"{alias.name}.py").exists():
                    names.add(f"baselines.{alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return {name for name in names if name.split(".")[0] == "baselines"}


def test_no_baseline_imports_another():
    """Each baseline reads on its own: besides rlflow it imports the shared runner (``baselines``) and the
    shared pieces (``baselines._nets``, ``baselines._mpe``, ``baselines._presets``), never another baseline."""
    folder = Path(__file__).resolve().parents[2] / "baselines"
    allowed = {"baselines", "baselines._nets", "baselines._mpe", "baselines._presets"}
    others = {}
    for path in sorted(folder.glob("*.py")):
        imported = baseline_modules_imported(path)
        if imported - allowed:
            others[path.stem] = sorted(imported - allowed)
    expected = {"dqn", "hatd3", "mappo", "ppo", "qmix", "sac", "selfplay_dqn", "td3"}
    assert {p.stem for p in folder.glob("*.py")} >= expected
    assert others == {}


@pytest.mark.parametrize("num_actors", [1, 2, 4])
@pytest.mark.parametrize("n_steps", [16, 64, 1024])
def test_rollout_queue_with_actors_admits_a_lockstep_block_beside_a_batch(num_actors, n_steps):
    """PPO's on-policy set-up with actor processes builds (the queue's bound fits the store) and passes the
    on_policy launch check: the table admits one actor's longest block beside a batch of every lane."""
    from baselines import rollout_queue
    from rlflow import specs
    from rlflow.distributed.launcher import _lockstep_block_steps
    from rlflow.types import step_spec

    num_envs = 2
    spec = step_spec(specs.Field((3,), np.float32), specs.Field((), np.int64, low=0, high=1))
    store, table, adder = rollout_queue(spec, num_envs, n_steps, num_actors)
    assert store.num_lanes == num_envs * num_actors
    assert _lockstep_block_steps(adder, table, store.num_lanes, num_envs) == 2 * n_steps + 2


def test_capture_video_records_the_first_episode_of_each_evaluation(tmp_path):
    from moviepy import VideoFileClip

    args = dqn.Args(total_steps=400, learning_starts=100, samples_per_insert=4.0, batch_size=16, hidden=(8,),
                    eval_every=200, eval_episodes=2, logdir=str(tmp_path), progress=False, capture_video=True)
    dqn.main(args)
    videos = sorted((tmp_path / "videos").glob("*.mp4"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    assert len(videos) == 2  # evaluations at 200 and 400 env steps, one video each
    # the same seeded evaluation replayed by hand gives the length of the first recorded episode
    learner = dqn.DQNLearner(dqn.QNetwork(4, 2, (8,), False), args)
    learner.load_state_dict(load_state(tmp_path / "learner.pt")["learner"])
    env = envs.make("CartPole-v1", num_envs=None)
    ts, length = env.reset(seed=args.seed + 10_000 + 1), 0
    policy = dqn.exploration(learner.q, 2, args)
    while not ts.last[0]:
        ts = env.step(policy.act(ts.observation, None, evaluation=True)[0])
        length += 1
    with VideoFileClip(str(videos[-1])) as clip:
        frames = sum(1 for _ in clip.iter_frames())
        assert clip.size == [600, 400] and clip.fps == 50  # CartPole's render size and frame rate
    assert frames == length + 1  # the reset's frame and one per step


@pytest.mark.parametrize("name", ["ppo", "td3"])
def test_capture_video_in_the_continuous_baselines(tmp_path, name):
    """PPO's clipped-action evaluation env and TD3's (and SAC's: the same continuous_replay) record too."""
    args = {"ppo": lambda: ppo.Args(env_id="Pendulum-v1", total_steps=256, num_envs=2, n_steps=64, n_epochs=1,
                                    minibatch_size=64, eval_every=256, eval_episodes=1),
            "td3": lambda: td3.Args(total_steps=300, learning_starts=100, samples_per_insert=4.0, batch_size=16,
                                    hidden=(8,), eval_every=300, eval_episodes=1)}[name]()
    {"ppo": ppo, "td3": td3}[name].main(dataclasses.replace(args, logdir=str(tmp_path), progress=False,
                                                          capture_video=True))
    assert len(list((tmp_path / "videos").glob("eval-episode-*.mp4"))) == 1
