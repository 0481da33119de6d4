"""baselines/mappo.py: per-agent GAE and the masked PPO loss by hand, and short runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlflow.loggers import read_csv

mappo = pytest.importorskip("baselines.mappo")
pytest.importorskip("mpe2")


def test_agent_targets_by_hand():
    # One env, two agents, rows 0..3 (three steps), gamma = lam = .5. Agent 0 terminates on step 1 (row 2 says
    # so) and is inactive after; agent 1 is cut (truncated) on step 2, its final observation in row 3.
    t_, f_ = True, False
    rows = {"observation": {"active": np.array([[[t_, t_], [t_, t_], [f_, t_], [f_, t_]]]),
                            "terminated": np.array([[[f_, f_], [f_, f_], [t_, f_], [f_, f_]]]),
                            "truncated": np.array([[[f_, f_], [f_, f_], [f_, f_], [f_, t_]]])},
            "reward": np.float32([[[1, 2], [3, 4], [0, 5], [0, 0]]]), "last": np.zeros((1, 4), bool)}
    values = torch.tensor([[[1.0, 1.0], [2.0, 1.0], [9.0, 1.0], [0.0, 4.0]]])
    out = mappo.agent_targets(values, rows, np.ones((1, 4), bool), 0.5, 0.5)
    assert out["active"][:, 0].tolist() == [[True, True], [True, True], [False, True]]
    # agent 0: A1 = 3 - 2 = 1 (terminal); A0 = (1 + .5 * 2 - 1) + .25 * 1 = 1.25
    # agent 1: A2 = 5 + .5 * 4 - 1 = 6 (bootstraps from its final observation); A1 = 4 + .5 - 1 + .25 * 6 = 5;
    #          A0 = 2 + .5 - 1 + .25 * 5 = 2.75
    np.testing.assert_allclose(out["advantages"][:2, 0, 0].numpy(), [1.25, 1.0])
    np.testing.assert_allclose(out["advantages"][:, 0, 1].numpy(), [2.75, 5.0, 6.0])
    np.testing.assert_allclose(out["returns"][:2, 0, 0].numpy(), [2.25, 3.0])
    np.testing.assert_allclose(out["returns"][:, 0, 1].numpy(), [3.75, 6.0, 7.0])


def test_a_final_row_is_no_action_for_any_agent():
    rows = {"observation": {k: np.zeros((1, 3, 2), bool) for k in ("active", "terminated", "truncated")},
            "reward": np.ones((1, 3, 2), np.float32), "last": np.array([[False, True, False]])}
    rows["observation"]["active"][:] = True
    out = mappo.agent_targets(torch.zeros(1, 3, 2), rows, np.ones((1, 3), bool), 0.9, 0.9)
    assert out["active"][:, 0].tolist() == [[True, True], [False, False]]


def constant_net(n_actions=2, n_agents=2):
    args = mappo.Args(hidden=())
    net = mappo.MAPPONet(obs_dim=3, state_dim=4, n_actions=n_actions, n_agents=n_agents, args=args)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
    return net


def test_mappo_loss_counts_only_the_agents_that_acted():
    net = constant_net()
    obs = {"obs": torch.zeros(1, 2, 3), "state": torch.zeros(1, 4)}
    # agent 0 acted: pi(a) = 1/2, old 1/4: ratio 2, advantage 1 (one sample: not normalised) -> clipped 1.2.
    # V = 0 against the return 3: value loss 9. Entropy log 2. Agent 1 did not act: its numbers are ignored.
    loss, m = mappo.mappo_loss(net, obs, torch.tensor([[0, 1]]), torch.log(torch.tensor([[0.25, 0.9]])),
                               torch.tensor([[1.0, -50.0]]), torch.tensor([[3.0, 100.0]]),
                               torch.tensor([[True, False]]), 0.2, 0.01, 0.5)
    assert m["policy_loss"] == pytest.approx(-1.2) and m["value_loss"] == pytest.approx(9.0)
    assert loss.item() == pytest.approx(-1.2 + 0.5 * 9.0 - 0.01 * math.log(2), rel=1e-6)


def test_action_masks_and_all_false_masks_stay_finite():
    net = constant_net(n_actions=3, n_agents=1)
    obs = {"obs": torch.zeros(2, 1, 3), "action_mask": torch.tensor([[[False, True, False]], [[False, False, False]]])}
    dist = net.policy(obs)
    assert dist.probs[0, 0].tolist() == [0.0, 1.0, 0.0]  # only the legal action
    assert torch.isfinite(dist.logits).all() and torch.isfinite(dist.entropy()).all()  # a dead agent's empty mask


@pytest.mark.parametrize("options", [{}, {"critic": "local", "shared": False}])
def test_mappo_runs_and_logs(tmp_path, options):
    args = mappo.Args(total_steps=200, num_envs=2, n_steps=10, n_epochs=2, hidden=(16,), eval_every=100,
                      eval_episodes=1, max_cycles=10, logdir=str(tmp_path), progress=False, **options)
    result = mappo.main(args)
    assert result.env_steps == 200 and result.learner_steps >= 9
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r["policy_loss"])) for r in rows)
    assert (tmp_path / "learning_curve.png").exists()


def test_recurrent_unroll_restarts_where_told():
    args = mappo.Args(hidden=(8,), recurrent=True)
    net = mappo.MAPPONet(obs_dim=3, state_dim=4, n_actions=2, n_agents=2, args=args)
    gen = torch.Generator().manual_seed(0)
    obs = {"obs": torch.randn(1, 5, 2, 3, generator=gen), "state": torch.randn(1, 5, 4, generator=gen)}
    h = torch.randn(1, 2, 8, generator=gen)
    with torch.no_grad():
        logits, values = net.unroll(obs, h, h, torch.tensor([[False, False, False, True, False]]))
        fresh_logits, fresh_values = net.unroll({k: v[:, 3:] for k, v in obs.items()}, torch.zeros(1, 2, 8),
                                                torch.zeros(1, 2, 8), torch.zeros(1, 2, dtype=torch.bool))
        carried, _ = net.unroll(obs, h, h, torch.zeros(1, 5, dtype=torch.bool))
    torch.testing.assert_close(logits[:, 3:], fresh_logits)  # the restart forgets everything before it
    torch.testing.assert_close(values[:, 3:], fresh_values)
    torch.testing.assert_close(logits[:, :3], carried[:, :3])  # and changes nothing before it
    assert not torch.allclose(logits[:, 3:], carried[:, 3:])


def test_recurrent_mappo_runs(tmp_path):
    args = mappo.Args(total_steps=200, num_envs=2, n_steps=10, n_epochs=2, hidden=(16,), eval_every=100,
                      eval_episodes=1, max_cycles=10, recurrent=True, chunk_length=4, num_minibatches=2,
                      logdir=str(tmp_path), progress=False)
    result = mappo.main(args)
    assert result.env_steps == 200 and result.learner_steps >= 9
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r["policy_loss"])) for r in rows)


def _original_mpe_team_reward(world) -> tuple[float, int]:
    """The original MPE's simple_spread, which the MAPPO paper and EPyMARL report: every agent gets minus the
    landmarks' nearest-agent distances and minus 1 for each agent it touches, itself included; summed over
    agents. Also returns the number of touching pairs of distinct agents."""
    agents, total, pairs = world.agents, 0.0, 0
    spread = -sum(min(np.linalg.norm(a.state.p_pos - lm.state.p_pos) for a in agents) for lm in world.landmarks)
    for a in agents:
        touching = [b for b in agents if np.linalg.norm(a.state.p_pos - b.state.p_pos) < a.size + b.size]
        total += spread - len(touching)
        pairs += len(touching) - 1
    return total, pairs


def test_paper_scale_matches_the_original_mpe_reward():
    from mpe2 import simple_spread_v3

    from baselines._mpe import paper_scale

    env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    rng = np.random.default_rng(0)
    episodes, collisions = [], 0
    for episode in range(100):
        env.reset(seed=episode)
        mpe2_team, paper_team = 0.0, 0.0
        while env.agents:
            _, rewards, _, _, _ = env.step({a: int(rng.integers(5)) for a in env.agents})
            paper, pairs = _original_mpe_team_reward(env.unwrapped.world)
            mpe2_team += sum(rewards.values())
            paper_team += paper
            collisions += pairs
        episodes.append((mpe2_team, paper_team))
    assert collisions > 0  # the collision term is exercised
    for mpe2_team, paper_team in episodes:
        assert paper_scale(mpe2_team, 3, 25) == pytest.approx(paper_team, rel=1e-9, abs=1e-9)
    # uniform random play: the papers put it at about -233; mpe2 gives -238.2 over these 100 episodes
    assert -245 < np.mean([p for _, p in episodes]) < -228


def test_mappo_with_its_value_normaliser_resumes_from_a_run_checkpoint(tmp_path):
    # The learner's state holds the value normaliser's numpy statistics: a run checkpoint must load them.
    args = mappo.Args(total_steps=200, num_envs=2, n_steps=10, n_epochs=1, hidden=(8,), eval_every=10**6,
                      eval_episodes=1, max_cycles=10, logdir=str(tmp_path), progress=False, checkpoint_every=100)
    first = mappo.main(args)
    assert first.learner_steps > 0
    resumed = mappo.main(mappo.Args(**{**vars(args), "total_steps": 300, "resume": True}))
    assert resumed.env_steps == 300 and resumed.learner_steps > first.learner_steps


@pytest.mark.parametrize("anneal", [False, True])
def test_the_learning_rate_falls_linearly_to_zero_when_annealed(tmp_path, anneal):
    from rlflow.loop.checkpoint import load_state

    # 200 joint steps of 2 envs x 10 steps: 10 learner updates; update u (from 0) trains at lr * (1 - u / 10).
    args = mappo.Args(total_steps=200, num_envs=2, n_steps=10, n_epochs=1, hidden=(8,), eval_every=10**6,
                      eval_episodes=1, max_cycles=10, anneal_lr=anneal, learning_rate=1e-3, logdir=str(tmp_path),
                      progress=False)
    result = mappo.main(args)
    saved = load_state(tmp_path / "learner.pt")["learner"]
    assert saved["updates"] == result.learner_steps == 10
    lr = saved["optimizer"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(1e-3 * (1 - 9 / 10) if anneal else 1e-3)


def test_team_rewards_give_every_agent_the_mean_over_agents():
    reward = np.array([[[1.0, -2.0, 4.0], [0.0, 0.0, -3.0]]], np.float32)  # [E=1, T=2, A=3]
    team = mappo.team_rewards(reward)
    np.testing.assert_array_equal(team, [[[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]])
    assert team.dtype == np.float32 and team.flags.writeable


def test_mappo_with_team_rewards_trains_every_agent_on_the_team_reward(tmp_path, monkeypatch):
    seen = []

    def spy(values, rows, mask, gamma, lam):
        seen.append(np.asarray(rows["reward"]))
        return real(values, rows, mask, gamma, lam)

    real = mappo.agent_targets
    monkeypatch.setattr(mappo, "agent_targets", spy)
    for team in (False, True):
        seen.clear()
        args = mappo.Args(total_steps=200, num_envs=2, n_steps=10, n_epochs=1, hidden=(8,), eval_every=10**6,
                          eval_episodes=1, max_cycles=10, team_reward=team, logdir=str(tmp_path / str(team)),
                          progress=False)
        assert mappo.main(args).learner_steps == len(seen) == 10
        rewards = np.concatenate(seen)  # [E, T + 1, A] per update
        same = np.all(rewards == rewards[..., :1])
        assert same == team  # simple_spread's agents' own rewards differ (collisions); the team's are one
