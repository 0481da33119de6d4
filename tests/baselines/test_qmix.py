"""baselines/qmix.py: the TD loss by hand (termination, truncation from the final row, deaths), mixers, a run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlflow.loggers import read_csv

qmix = pytest.importorskip("baselines.qmix")
pytest.importorskip("mpe2")


def constant_agent(q=(1.0, 2.0), n_agents=2):
    """An agent network whose Q is ``q`` for every observation (only the output bias is non-zero)."""
    net = qmix.AgentNet(obs_dim=1, n_actions=len(q), n_agents=n_agents, hidden=4)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.out.bias.copy_(torch.tensor(q))
    return net


def episode(end, active_final=(False, False), died=None):
    """One episode of two steps (rows 0, 1 and the final row 2), two agents, actions (0, 1) then (1, 1),
    team rewards 3 then 1; the episode ends at step 1 by ``end``."""
    f = np.zeros((1, 3, 2), bool)
    obs = {"obs": np.zeros((1, 3, 2, 1), np.float32), "active": np.array([[[True, True], [True, True],
                                                                          list(active_final)]]),
           "terminated": f.copy(), "truncated": f.copy(), "state": np.zeros((1, 3, 4), np.float32)}
    obs["terminated" if end == "terminated" else "truncated"][0, 2] = True
    if died is not None:  # agent `died` terminated on step 0 instead: inactive at row 1 on
        obs["terminated"][0, 1, died] = True
        obs["active"][0, 1, died] = False
        obs["terminated"][0, 2, died] = obs["truncated"][0, 2, died] = False
    return {"observation": obs, "action": np.array([[[0, 1], [1, 1], [0, 0]]]),
            "reward": np.float32([[[1, 2], [0.5, 0.5], [0, 0]]]),
            "terminated": np.array([[False, end == "terminated", False]]),
            "truncated": np.array([[False, end == "truncated", False]]), "last": np.array([[False, False, True]])}


@pytest.mark.parametrize(("end", "died", "expected"), [
    # Q = (1, 2) per agent, VDN, gamma .5. Step 0: Q_tot = 1 + 2 = 3, y = 3 + .5 * (2 + 2) = 5 (error -2).
    # Terminated at step 1: Q_tot = 4, y = 1 (error 3): loss (4 + 9) / 2 = 6.5.
    ("terminated", None, 6.5),
    # Truncated: the agents were cut arriving at the final row: y = 1 + .5 * (2 + 2) = 3 (error 1): loss 2.5.
    ("truncated", None, 2.5),
    # Agent 0 died on step 0: step 0's target counts agent 1 only: y = 3 + .5 * 2 = 4, Q_tot = 3 (error -1);
    # step 1: Q_tot = 0 + 2 = 2 (agent 0 inactive), y = 1 + .5 * 2 = 2 (error 0): loss .5.
    ("truncated", 0, 0.5),
])
def test_td_loss_by_hand(end, died, expected):
    agent, target = constant_agent(), constant_agent()
    loss, _m = qmix.td_loss(agent, target, qmix.VDNMixer(), qmix.VDNMixer(), episode(end, died=died),
                           np.ones((1, 3), bool), 0.5)
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize(("end", "lam", "mask", "expected"), [
    # Q = (1, 2) per agent, VDN, gamma .5, Q_tot' = 4 at every next row; Q_tot = 3 at step 0, 4 at step 1.
    # Truncated, lambda .5: y1 = 1 + .5 * 4 = 3; y0 = 3 + .5 * (.5 * 4 + .5 * 3) = 4.75: (1.75^2 + 1) / 2.
    ("truncated", 0.5, (True, True, True), (1.75**2 + 1.0) / 2),
    # Terminated: y1 = 1; y0 = 3 + .5 * (.5 * 4 + .5 * 1) = 4.25: (1.25^2 + 3^2) / 2.
    ("terminated", 0.5, (True, True, True), (1.25**2 + 9.0) / 2),
    # lambda 1: y0 = 3 + .5 * y1 = 3.5 (the Monte Carlo return): (.5^2 + 9) / 2.
    ("terminated", 1.0, (True, True, True), (0.25 + 9.0) / 2),
    # The final row is padding: step 0 is the episode's last transition, its one-step target 5: loss 4.
    ("terminated", 0.5, (True, True, False), 4.0),
])
def test_td_lambda_targets_by_hand(end, lam, mask, expected):
    loss, _ = qmix.td_loss(constant_agent(), constant_agent(), qmix.VDNMixer(), qmix.VDNMixer(), episode(end),
                           np.array([mask]), 0.5, td_lambda=lam)
    assert loss.item() == pytest.approx(expected)



def test_td_lambda_keeps_the_episodes_of_a_batch_apart():
    # the truncated and the terminated episode above in one batch of two, lambda .5: the mean of their four
    # squared errors (1.75, 1) and (1.25, 3)
    a, b = episode("truncated"), episode("terminated")
    rows = {k: np.concatenate([a[k], b[k]]) for k in ("action", "reward", "terminated", "truncated", "last")}
    rows["observation"] = {k: np.concatenate([a["observation"][k], b["observation"][k]]) for k in a["observation"]}
    loss, _ = qmix.td_loss(constant_agent(), constant_agent(), qmix.VDNMixer(), qmix.VDNMixer(), rows,
                           np.ones((2, 3), bool), 0.5, td_lambda=0.5)
    assert loss.item() == pytest.approx((1.75**2 + 1.0 + 1.25**2 + 9.0) / 4)


def test_the_learner_passes_its_td_lambda(monkeypatch):
    args = qmix.Args(hidden=4, mixing_embed=2, hypernet_embed=4, td_lambda=0.7)
    learner = qmix.QMIXLearner(constant_agent(), qmix.VDNMixer(), args)
    given, real = [], qmix.td_loss
    monkeypatch.setattr(qmix, "td_loss", lambda *a: given.append(a[-1]) or real(*a))
    learner.step(type("Sample", (), {"data": episode("truncated"), "mask": np.ones((1, 3), bool)}))
    assert given == [0.7]


def test_td_loss_takes_the_rewards_it_is_given():
    # As the terminated case above, with team rewards (-1, 2) given instead of the rows' (3, 1): step 0's
    # y = -1 + .5 * 4 = 1 (error 2), step 1's y = 2 (error 2): loss 4.
    loss, _ = qmix.td_loss(constant_agent(), constant_agent(), qmix.VDNMixer(), qmix.VDNMixer(), episode("terminated"),
                           np.ones((1, 3), bool), 0.5, reward=torch.tensor([[-1.0, 2.0]]))
    assert loss.item() == pytest.approx(4.0)


def test_the_learner_standardises_the_sampled_team_rewards(monkeypatch):
    args = qmix.Args(hidden=4, mixing_embed=2, hypernet_embed=4, target_update_period=10**6, standardise_rewards=True)
    rows, mask = episode("truncated"), np.array([[True, True, True]])
    reward, valid = qmix.team_reward(rows, mask)
    assert reward.tolist() == [[3.0, 1.0]] and valid.tolist() == [[True, True]]
    mask = np.array([[True, True, False]])  # padding: step 1 is no transition, its reward is not counted
    assert qmix.team_reward(rows, mask)[1].tolist() == [[True, False]]

    agent, mixer = constant_agent(), qmix.VDNMixer()
    learner = qmix.QMIXLearner(agent, mixer, args)
    given, real = [], qmix.td_loss
    monkeypatch.setattr(qmix, "td_loss", lambda *a: given.append(a[7]) or real(*a))
    learner.step(type("Sample", (), {"data": rows, "mask": np.ones((1, 3), bool)}))
    learner.step(type("Sample", (), {"data": rows, "mask": mask}))
    # first batch: rewards 3 and 1, mean 2, variance 1 -> (1, -1); then the 3 of the second batch joins:
    # mean 7/3, variance 8/9 -> (3 - 7/3) / sqrt(8/9) and (1 - 7/3) / sqrt(8/9)
    assert given[0][0].tolist() == pytest.approx([1.0, -1.0])
    assert given[1][0].tolist() == pytest.approx([(2 / 3) / math.sqrt(8 / 9), (-4 / 3) / math.sqrt(8 / 9)])
    state = learner.state_dict()
    other = qmix.QMIXLearner(constant_agent(), qmix.VDNMixer(), args)
    other.load_state_dict(state)
    assert other.reward_norm.mean == pytest.approx(7 / 3) and other.reward_norm.var == pytest.approx(8 / 9)
    off = qmix.QMIXLearner(constant_agent(), qmix.VDNMixer(), qmix.Args())  # off by default
    assert off.reward_norm is None and off.state_dict()["reward_norm"] is None


def test_padding_and_masks_are_left_out():
    rows = episode("terminated")
    mask = np.array([[True, True, False]])  # a padded row: the same as the final row here
    loss, _ = qmix.td_loss(constant_agent(), constant_agent(), qmix.VDNMixer(), qmix.VDNMixer(), rows, mask, 0.5)
    assert loss.item() == pytest.approx(4.0)  # only step 0 (error -2): step 1's next row is padding
    # the best next action among the legal ones: only action 0 (Q = 1) legal at row 1 -> y0 = 3 + .5 * 2 = 4
    rows["observation"]["action_mask"] = np.ones((1, 3, 2, 2), bool)
    rows["observation"]["action_mask"][0, 1, :, 1] = False
    loss, _ = qmix.td_loss(constant_agent(), constant_agent(), qmix.VDNMixer(), qmix.VDNMixer(), rows,
                           np.ones((1, 3), bool), 0.5)
    assert loss.item() == pytest.approx((1.0 + 9.0) / 2)


def test_the_qmix_mixer_is_monotonic_and_masked_max_never_nan():
    mixer = qmix.QMixer(n_agents=3, state_dim=4, embed=8, hypernet_embed=16)
    q = torch.randn(64, 3, requires_grad=True)
    mixer(q, torch.randn(64, 4)).sum().backward()
    assert (q.grad >= 0).all()  # dQ_tot / dQ_a >= 0
    best, arg = qmix.masked_max(torch.tensor([[1.0, 5.0], [3.0, 2.0]]), torch.tensor([[True, False], [False, False]]))
    assert best.tolist() == [1.0, 0.0] and arg.tolist() == [0, 0]


def test_a_normalised_state_keeps_the_mixer_from_growing_with_the_state():
    """With ``state_norm`` the hypernetworks see the state's direction, not its scale or offset: a state
    pushed far out (agents drifting off) mixes the agents' Q as the state it came from does; without
    it the mixer's output grows with the state."""
    torch.manual_seed(0)
    q, state = torch.randn(64, 3), torch.randn(64, 4)
    far = 50 * state + 3
    normed = qmix.QMixer(n_agents=3, state_dim=4, embed=8, hypernet_embed=16, state_norm=True)
    torch.testing.assert_close(normed(q, far), normed(q, state), atol=1e-4, rtol=1e-4)
    q_grad = q.clone().requires_grad_()
    normed(q_grad, far).sum().backward()
    assert (q_grad.grad >= 0).all()  # still monotonic
    plain = qmix.QMixer(n_agents=3, state_dim=4, embed=8, hypernet_embed=16)
    assert (plain(q, far) - plain(q, state)).abs().mean() > 1.0


@pytest.mark.parametrize(("mixer", "state_norm"), [("qmix", False), ("qmix", True), ("vdn", False)])
def test_qmix_runs_and_logs(tmp_path, mixer, state_norm):
    args = qmix.Args(mixer=mixer, state_norm=state_norm, td_lambda=0.5 if state_norm else 0.0, total_steps=400,
                     num_envs=2, max_cycles=10, batch_size=4, learning_starts=4,
                     samples_per_insert=4.0, hidden=8, mixing_embed=4, hypernet_embed=8, eval_every=200,
                     eval_episodes=1, logdir=str(tmp_path), progress=False)
    result = qmix.main(args)
    assert result.env_steps == 400 and result.learner_steps > 10
    rows = read_csv(tmp_path / "learner.csv")
    assert rows and all(math.isfinite(float(r["loss"])) for r in rows)
    mixer_state = torch.load(tmp_path / "learner.pt", weights_only=False)["learner"]["mixer"]
    assert ("norm.weight" in mixer_state) == state_norm


def test_sampled_mpe_episodes_stay_whole_after_the_rings_wrap():
    # QMIX's data path on real MPE steps: episodes of 26 rows in rings of 3 episodes per lane, written
    # through 12 episodes (every ring wraps three times), sampled all along. A sampled episode's rows must be
    # one episode in order: first only on row 0, last only on row 25, and each row's position the one before
    # it moved by that row's velocity (MPE's observation: velocity, then position; dt 0.1).
    from rlflow import adders
    from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform

    env = qmix.make_env(qmix.Args(), 2, 0)
    store = StepStore(env.spec, capacity=26 * 3, lanes=2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.Episode(store, [table], max_length=26)
    adder.add_first(env.reset(seed=0))
    rng = np.random.default_rng(0)
    sampled = 0
    for step in range(25 * 12):
        actions = rng.integers(0, 5, (2, 3))
        adder.add(actions, env.step(actions))
        if table.size and step % 5 == 0:
            s = table.sample(4)
            obs, first, last = s.data["observation"]["obs"], s.data["first"], s.data["last"]
            for b in range(4):
                assert s.mask[b].all()
                assert first[b].tolist() == [True] + [False] * 25
                assert last[b].tolist() == [False] * 25 + [True]
                velocity, position = obs[b, :, :, 0:2], obs[b, :, :, 2:4]
                np.testing.assert_allclose(position[1:] - position[:-1], velocity[:-1] * 0.1, atol=1e-5)
                sampled += 1
    assert sampled > 200 and store.count.min() > 3 * 3 * 26  # sampled long after every ring wrapped


@pytest.mark.parametrize("mixer", ["qmix", "vdn"])
def test_target_networks_follow_by_copies_or_soft_updates(mixer):
    def params(*nets):
        return [p.detach().clone() for net in nets for p in net.parameters()]

    rows, mask = episode("truncated"), np.ones((1, 3), bool)
    sample = type("Sample", (), {"data": rows, "mask": mask})
    for tau in (0.0, 0.25):
        torch.manual_seed(0)
        args = qmix.Args(mixer=mixer, hidden=4, mixing_embed=2, hypernet_embed=4, target_update_period=2,
                         target_tau=tau)
        agent = qmix.AgentNet(obs_dim=1, n_actions=2, n_agents=2, hidden=4)
        mix = qmix.QMixer(2, 4, 2, 4) if mixer == "qmix" else qmix.VDNMixer()
        learner = qmix.QMIXLearner(agent, mix, args)
        start = params(agent, mix)
        learner.step(sample)
        first = params(agent, mix)
        after_one = params(learner.target_agent, learner.target_mixer)
        learner.step(sample)
        after_two = params(learner.target_agent, learner.target_mixer)
        if tau == 0:  # a copy every second step: the start, then the online networks after step 2
            expect_one, expect_two = start, params(agent, mix)
        else:  # target <- target + tau (online - target) after every step
            expect_one = [s + tau * (f - s) for s, f in zip(start, first, strict=True)]
            expect_two = [t + tau * (o - t) for t, o in zip(expect_one, params(agent, mix), strict=True)]
        for got, want in zip(after_one + after_two, expect_one + expect_two, strict=True):
            torch.testing.assert_close(got, want)
        assert any(not torch.equal(s, f) for s, f in zip(start, first, strict=True))  # the step moved the nets
