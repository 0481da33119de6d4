"""rlflow.compat.harl: HARL's off-policy buffers' shapes and n-step semantics, against a slow reference of HARL's
rule (a window walks a thread's transitions until ``n_step`` or a done, EP per thread, FP per agent)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.compat.harl import OffPolicyBufferEP, OffPolicyBufferFP
from rlflow.replay import RateLimitTimeout

OBS = [3, 5, 3]  # agents 0 and 2 share a shape, agent 1 differs
ACTS = [spaces.Discrete(4), spaces.Box(-1, 1, (2,)), spaces.Discrete(3)]


def make(cls, n_step=3, threads=2, gamma=0.9, batch=64, size=4096, acts=ACTS, obs=OBS):
    args = {"buffer_size": size, "batch_size": batch, "n_step": n_step, "n_rollout_threads": threads, "gamma": gamma}
    return cls(args, spaces.Box(-1, 1, (4,)), len(obs), [spaces.Box(-1, 1, (d,)) for d in obs], acts, seed=0)


class Stream:
    """Transitions of ``threads`` threads with ids in every observation: agent ``i``'s obs of thread ``e`` at its
    step ``t`` of episode ``k`` is ``[e, t, k, i, ...]``; the state ``[e, t, k, -1]`` (FP: ``[e, t, k, i]``)."""

    def __init__(self, fp, threads, rng, p_done=0.2, p_term=0.5):
        self.fp, self.n, self.rng = fp, threads, rng
        self.a = len(OBS)
        self.t = np.zeros(threads, int)
        self.k = np.zeros(threads, int)
        self.p_done, self.p_term = p_done, p_term
        self.log = []  # per insert: (t, k, rewards [n, a], done [n, a], term [n, a], valid [n, a])
        self.dead = np.zeros((threads, self.a), bool)

    def obs(self, t, k):
        return [np.stack([[e, t[e], k[e], i, *([0.5] * (d - 4))][:d] if d >= 4 else [e, t[e], k[e]][:d]
                          for e in range(self.n)]).astype(np.float32) for i, d in enumerate(OBS)]

    def state(self, t, k):
        if self.fp:
            return np.array([[[e, t[e], k[e], i] for i in range(self.a)] for e in range(self.n)], np.float32)
        return np.array([[e, t[e], k[e], -1] for e in range(self.n)], np.float32)

    def step(self):
        n, a, rng = self.n, self.a, self.rng
        t, k = self.t.copy(), self.k.copy()
        rewards = rng.integers(-3, 4, (n, a)).astype(np.float32)
        if self.fp:
            done = (rng.random((n, a)) < self.p_done) | self.dead
            term = done & ((rng.random((n, a)) < self.p_term) | self.dead)
        else:
            done = np.repeat(rng.random((n, 1)) < self.p_done, a, axis=1)
            term = done & np.repeat(rng.random((n, 1)) < self.p_term, a, axis=1)
            rewards[:] = rewards[:, :1]
        valid = ~self.dead
        nt = t + 1
        data = (self.state(t, k), self.obs(t, k),
                [np.full((n, 1), i, np.float32) if isinstance(s, spaces.Discrete) else rng.uniform(-1, 1, (n, 2))
                 for i, s in enumerate(ACTS)],
                [np.ones((n, s.n), np.float32) if isinstance(s, spaces.Discrete) else None for s in ACTS],
                rewards[:, :, None] if self.fp else rewards[:, :1], done[:, :, None] if self.fp else done[:, :1],
                [valid[:, i:i + 1].astype(np.float32) for i in range(a)],
                term[:, :, None] if self.fp else term[:, :1], self.state(nt, k), self.obs(nt, k),
                [np.ones((n, s.n), np.float32) if isinstance(s, spaces.Discrete) else None for s in ACTS])
        self.log.append((t, k, rewards, done, term, valid))
        ended = done.all(axis=1)
        self.dead = np.where(ended[:, None], False, self.dead | (term if self.fp else False))
        self.t = np.where(ended, 0, nt)
        self.k = np.where(ended, k + 1, k)
        return data


def harl_window(stream, e, t, k, agent, n_step, gamma):
    """HARL's n-step rule for the transition at step ``t`` of episode ``k`` of thread ``e`` (agent ``agent``'s
    window in FP): (reward, gamma ** steps, done, term, the last transition's step)."""
    steps = [(entry[0][e], entry[2][e], entry[3][e], entry[4][e]) for entry in stream.log if entry[1][e] == k]
    steps = [s for s in steps if s[0] >= t]
    total, j = 0.0, 0
    for j, (_, r, d, _) in enumerate(steps[:n_step]):
        total += gamma ** j * r[agent]
        if d[agent]:
            break
    last = steps[j]
    return total, gamma ** (j + 1), bool(last[2][agent]), bool(last[3][agent]), int(last[0])


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([OffPolicyBufferEP, OffPolicyBufferFP]), st.integers(1, 4), st.integers(1, 3),
       st.integers(5, 60), st.integers(0, 2**16))
def test_samples_follow_harls_n_step_rule(cls, n_step, threads, inserts, seed):
    fp = cls is OffPolicyBufferFP
    gamma = 0.9
    buf = make(cls, n_step=n_step, threads=threads, gamma=gamma)
    stream = Stream(fp, threads, np.random.default_rng(seed))
    for _ in range(inserts):
        buf.insert(stream.step())
    try:
        out = buf.sample()
    except RateLimitTimeout:
        assert inserts < n_step and not any(entry[3].all(axis=1).any() for entry in stream.log)
        return
    (share, obs, actions, avail, reward, done, valid, term, next_share, next_obs, next_avail, sp_gamma) = out
    b, a = 64, len(OBS)
    assert isinstance(obs, list) and [o.shape for o in obs] == [(b, d) for d in OBS]
    assert [x.shape for x in actions] == [(b, 1), (b, 2), (b, 1)]
    for masks in (avail, next_avail):  # Discrete agents' available actions (float32, as HARL's); None for the Box one
        assert masks[1] is None and masks[0].shape == (b, 4) and masks[2].shape == (b, 3)
        assert masks[0].dtype == np.float32 and (masks[0] == 1).all()
    assert valid.shape == (a, b, 1)
    rows = b * a if fp else b
    assert reward.shape == done.shape == term.shape == sp_gamma.shape == (rows, 1)
    for i in range(b):
        e, t, k = (int(x) for x in obs[0][i, :3])
        for agent in range(a):
            assert obs[agent][i, 0] == e and obs[agent][i, 1] == t and obs[agent][i, 2] == k
            step = next(entry for entry in stream.log if entry[0][e] == t and entry[1][e] == k)
            assert valid[agent, i, 0] == step[5][e, agent]
        for agent in range(a if fp else 1):
            r, g, d, tm, last_t = harl_window(stream, e, t, k, agent, n_step, gamma)
            row = agent * b + i if fp else i
            assert reward[row, 0] == pytest.approx(r, rel=1e-5, abs=1e-5)
            assert (done[row, 0], term[row, 0]) == (d, tm)
            assert sp_gamma[row, 0] == pytest.approx(0.0 if tm else g, rel=1e-6)
            nxt = next_share[row] if fp else next_share[i]
            assert (nxt[0], nxt[1], nxt[2]) == (e, last_t + 1, k)
            if fp:
                assert share[row, 3] == agent and nxt[3] == agent
            for j in [agent] if fp else range(a):  # each agent's next observation: its window's end
                assert (next_obs[j][i, 1], next_obs[j][i, 2]) == (last_t + 1, k)


def test_ep_shapes_of_harls_documentation_when_every_agent_has_one_shape():
    buf = make(OffPolicyBufferEP, obs=[3, 3], acts=[spaces.Discrete(4), spaces.Discrete(4)], batch=16)
    stream_obs = [3, 3]
    n = 2
    for t in range(10):
        o = [np.full((n, d), t, np.float32) for d in stream_obs]
        no = [np.full((n, d), t + 1, np.float32) for d in stream_obs]
        ones = [np.ones((n, 4), np.float32)] * 2
        buf.insert((np.full((n, 4), t, np.float32), o, [np.zeros((n, 1))] * 2, ones, np.ones((n, 1)),
                    np.zeros((n, 1), bool), [np.ones((n, 1))] * 2, np.zeros((n, 1), bool),
                    np.full((n, 4), t + 1, np.float32), no, ones))
    out = buf.sample()
    shapes = [np.asarray(x).shape for x in out]
    assert shapes == [(16, 4), (2, 16, 3), (2, 16, 1), (2, 16, 4), (16, 1), (16, 1), (2, 16, 1), (16, 1), (16, 4),
                      (2, 16, 3), (2, 16, 4), (16, 1)]
    np.testing.assert_array_equal(out[9][:, :, 0], out[1][:, :, 0] + 3)  # 3-step windows: next_obs 3 steps on
    np.testing.assert_allclose(out[4][:, 0], 1 + 0.9 + 0.81)
    assert buf.cur_size == 2 * (10 - 2)


def test_bad_input_names_the_part_and_changes_nothing():
    buf = make(OffPolicyBufferEP, threads=2)
    stream = Stream(False, 2, np.random.default_rng(0))
    good = stream.step()
    buf.insert(good)
    size = buf.cur_size
    bad_reward = (*good[:4], np.ones((2, 3, 1)), *good[5:])
    with pytest.raises(ValueError, match=r"reward: expected shape \(2, 1\), got \(2, 3, 1\)"):
        buf.insert(bad_reward)
    with pytest.raises(ValueError, match=r"obs: expected one array per agent \(3\), got 2"):
        buf.insert((good[0], good[1][:2], *good[2:]))
    with pytest.raises(ValueError, match=r"next_obs\[1\]: expected shape \(2, 5\)"):
        buf.insert((*good[:9], [good[9][0], good[9][0], good[9][2]], good[10]))
    with pytest.raises(ValueError, match="HARL's tuple of 11"):
        buf.insert(good[:10])
    with pytest.raises(ValueError, match="missing"):
        OffPolicyBufferEP({"buffer_size": 10}, spaces.Box(-1, 1, (4,)), 1, [spaces.Box(-1, 1, (3,))],
                          [spaces.Discrete(2)])
    assert buf.cur_size == size
    buf.insert(stream.step())  # the stream goes on where it was
    assert buf.cur_size >= size
