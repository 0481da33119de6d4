"""rlflow.compat.harl's on-policy buffers: HARL's returns in its four cases against a step-by-step reference of
HARL's loops, the generators' layouts, insert and after_update."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.compat.harl import OnPolicyActorBuffer, OnPolicyCriticBufferEP, OnPolicyCriticBufferFP
from rlflow.returns import ValueNormalizer


def critic_args(T=8, n=3, use_gae=True, proper=True):
    return {"episode_length": T, "n_rollout_threads": n, "hidden_sizes": [16, 8], "recurrent_n": 1, "gamma": 0.9,
            "gae_lambda": 0.8, "use_gae": use_gae, "use_proper_time_limits": proper}


def harl_returns(rewards, values, masks, bad, next_value, gamma, lam, use_gae, proper, denorm):
    """HARL's compute_returns, step by step (its four cases), on copies: returns ``returns[:-1]``."""
    values, ret = values.copy(), np.zeros_like(values)
    T = rewards.shape[0]
    if use_gae:
        values[-1] = next_value
        v = denorm(values)
        gae = 0.0
        for t in reversed(range(T)):
            delta = rewards[t] + gamma * v[t + 1] * masks[t + 1] - v[t]
            gae = delta + gamma * lam * masks[t + 1] * gae
            if proper:
                gae = bad[t + 1] * gae
            ret[t] = gae + v[t]
    else:
        ret[-1] = next_value
        for t in reversed(range(T)):
            ret[t] = ret[t + 1] * gamma * masks[t + 1] + rewards[t]
            if proper:
                ret[t] = ret[t] * bad[t + 1] + (1 - bad[t + 1]) * denorm(values[t])
    return ret[:-1]


@settings(max_examples=40, deadline=None)
@given(st.booleans(), st.booleans(), st.booleans(), st.sampled_from([OnPolicyCriticBufferEP, OnPolicyCriticBufferFP]),
       st.integers(0, 2**16))
def test_returns_match_harls_four_cases(use_gae, proper, normalised, cls, seed):
    rng = np.random.default_rng(seed)
    T, n, a = 8, 3, 2
    buf = cls(critic_args(T, n, use_gae, proper), spaces.Box(-1, 1, (5,)), a)
    lanes = (n, a) if cls is OnPolicyCriticBufferFP else (n,)
    norm = None
    if normalised:
        norm = ValueNormalizer(beta=None)
        norm.update(rng.normal(3.0, 2.0, 100))
    for _ in range(T):
        done = rng.random((*lanes, 1)) < 0.25
        cut = done & (rng.random((*lanes, 1)) < 0.5)
        buf.insert(rng.normal(size=(*lanes, 5)), np.zeros((*lanes, 1, 8)), rng.normal(size=(*lanes, 1)),
                   rng.normal(size=(*lanes, 1)), (~done).astype(np.float32), (~cut).astype(np.float32))
    nv = rng.normal(size=(*lanes, 1)).astype(np.float32)
    denorm = (lambda x: x) if norm is None else (lambda x: np.asarray(norm.denormalize(x), np.float32))
    expected = harl_returns(buf.rewards, buf.value_preds, buf.masks, buf.bad_masks, nv, 0.9, 0.8, use_gae, proper,
                            denorm)
    buf.compute_returns(nv, norm)
    np.testing.assert_allclose(buf.returns[:-1], expected, rtol=1e-4, atol=1e-4)
    if use_gae:
        np.testing.assert_array_equal(buf.value_preds[-1], nv)
    else:
        np.testing.assert_array_equal(buf.returns[-1], nv)


def test_a_worked_case_of_truncation_and_termination():
    # one thread, 3 steps, rewards 1, 2, 4; values .5 each; a termination after step 0, a truncation after step 1
    buf = OnPolicyCriticBufferEP(critic_args(T=3, n=1), spaces.Box(-1, 1, (2,)))
    for r, m, b in [(1.0, 0.0, 1.0), (2.0, 0.0, 0.0), (4.0, 1.0, 1.0)]:
        buf.insert(np.zeros((1, 2)), np.zeros((1, 1, 8)), np.full((1, 1), 0.5), np.full((1, 1), r),
                   np.full((1, 1), m), np.full((1, 1), b))
    buf.compute_returns(np.full((1, 1), 10.0))
    # t=2: 4 + .9 * 10 = 13 (advantage 12.5); t=1: truncated, return V = .5; t=0: terminated, 1
    np.testing.assert_allclose(buf.returns[:3, 0, 0], [1.0, 0.5, 13.0], rtol=1e-6)


def actor(T=8, n=4, seed=0, act=None):
    args = {"episode_length": T, "n_rollout_threads": n, "hidden_sizes": [16, 8], "recurrent_n": 1}
    buf = OnPolicyActorBuffer(args, spaces.Box(-1, 1, (3,)), act or spaces.Discrete(5), seed=seed)
    t, e = np.meshgrid(np.arange(T + 1), np.arange(n), indexing="ij")
    buf.obs[:] = np.stack([t, e, np.zeros_like(t)], axis=-1)  # each step's (t, e)
    buf.rnn_states[:] = (100 * t + e)[:, :, None, None]
    buf.actions[:] = (100 * t + e)[:T, :, None]
    buf.masks[:] = ((t + e) % 3 != 0)[:, :, None]
    return buf, (100 * t[:T] + e[:T])[:, :, None].astype(np.float32)  # advantages name each step too


@pytest.mark.parametrize(("num", "size"), [(4, None), (3, None), (None, 10)])
def test_feed_forward_minibatches_are_single_steps_each_at_most_once(num, size):
    buf, adv = actor()
    seen = []
    for obs, rnn, actions, masks, active, logp, adv_b, avail in buf.feed_forward_generator_actor(adv, num, size):
        t, e = obs[:, 0].astype(int), obs[:, 1].astype(int)
        assert len(t) == (size or 32 // num) and avail.shape == (len(t), 5) and logp.shape == (len(t), 1)
        np.testing.assert_array_equal(actions[:, 0], 100 * t + e)
        np.testing.assert_array_equal(adv_b[:, 0], 100 * t + e)
        np.testing.assert_array_equal(rnn[:, 0, 0], 100 * t + e)
        np.testing.assert_array_equal(masks[:, 0], (t + e) % 3 != 0)
        assert (t < 8).all() and active.shape == (len(t), 1)
        seen += list(zip(t, e, strict=True))
    assert len(seen) == len(set(seen)) == (32 // size * size if size else 32 // num * num)  # the rest left out


def test_naive_recurrent_minibatches_are_whole_threads_time_major():
    buf, adv = actor(T=6, n=4)
    threads = []
    for obs, rnn, actions, *_ in buf.naive_recurrent_generator_actor(adv, 2):
        assert obs.shape == (6 * 2, 3) and rnn.shape == (2, 1, 8)
        grid = obs.reshape(6, 2, 3)  # [T, N]: time-major, as HARL flattens
        for j in range(2):
            np.testing.assert_array_equal(grid[:, j, 0], np.arange(6))
            assert len(set(grid[:, j, 1])) == 1
            threads.append(int(grid[0, j, 1]))
            assert rnn[j, 0, 0] == grid[0, j, 1]  # the thread's first RNN state (t = 0)
        np.testing.assert_array_equal(actions[:, 0], 100 * obs[:, 0] + obs[:, 1])
    assert sorted(threads) == [0, 1, 2, 3]


def test_chunked_minibatches_are_consecutive_steps_of_one_thread_with_their_first_rnn_state():
    buf, adv = actor(T=8, n=3)
    chunks = []
    for obs, rnn, _actions, _masks, _active, _logp, adv_b, _ in buf.recurrent_generator_actor(adv, 3, 4):
        n = obs.shape[0] // 4
        assert n == 2 and rnn.shape == (2, 1, 8)
        grid = obs.reshape(4, n, 3)
        for j in range(n):
            t0, e = int(grid[0, j, 0]), int(grid[0, j, 1])
            assert t0 % 4 == 0
            np.testing.assert_array_equal(grid[:, j, 0], t0 + np.arange(4))
            assert (grid[:, j, 1] == e).all() and rnn[j, 0, 0] == 100 * t0 + e
            chunks.append((t0, e))
        np.testing.assert_array_equal(adv_b[:, 0], 100 * obs[:, 0] + obs[:, 1])
    assert len(set(chunks)) == 6  # 3 threads x 2 chunks, each once
    with pytest.raises(ValueError, match="data_chunk_length: expected a divisor of episode_length 8"):
        next(buf.recurrent_generator_actor(adv, 2, 3))


def test_fp_critic_streams_are_thread_agent_pairs():
    args = critic_args(T=4, n=2)
    buf = OnPolicyCriticBufferFP(args, spaces.Box(-1, 1, (3,)), 3, seed=1)
    t, e, a = np.meshgrid(np.arange(5), np.arange(2), np.arange(3), indexing="ij")
    buf.share_obs[:] = np.stack([t, e, a], axis=-1)
    buf.returns[:] = (100 * t + 10 * e + a)[..., None]
    seen = set()
    for share, _rnn, _v, rets, _m in buf.feed_forward_generator_critic(4):
        assert share.shape == (6, 3)
        np.testing.assert_array_equal(rets[:, 0], 100 * share[:, 0] + 10 * share[:, 1] + share[:, 2])
        seen |= {tuple(x) for x in share.astype(int)}
    assert len(seen) == 4 * 2 * 3
    streams = []
    for share, rnn, *_ in buf.naive_recurrent_generator_critic(3):
        grid = share.reshape(4, 2, 3)
        for j in range(2):
            np.testing.assert_array_equal(grid[:, j, 0], np.arange(4))
            streams.append((int(grid[0, j, 1]), int(grid[0, j, 2])))
        assert rnn.shape == (2, 1, 8)
    assert sorted(streams) == [(e, a) for e in range(2) for a in range(3)]


def test_insert_writes_harls_positions_checks_shapes_and_after_update_carries_the_last_step():
    buf, _ = actor(T=2, n=2)
    obs_before = buf.obs.copy()
    with pytest.raises(ValueError, match=r"actions: expected shape \(2, 1\), got \(2, 3\)"):
        buf.insert(np.ones((2, 3)), np.zeros((2, 1, 8)), np.zeros((2, 3)), np.zeros((2, 1)), np.ones((2, 1)))
    np.testing.assert_array_equal(buf.obs, obs_before)  # nothing written
    assert buf.step == 0
    for s in range(2):
        buf.insert(np.full((2, 3), 7 + s), np.zeros((2, 1, 8)), np.full((2, 1), s), np.zeros((2, 1)),
                   np.full((2, 1), 0.0), available_actions=np.zeros((2, 5)))
    assert buf.step == 0
    np.testing.assert_array_equal(buf.obs[1:, 0, 0], [7, 8])
    np.testing.assert_array_equal(buf.actions[:, 0, 0], [0, 1])
    buf.after_update()
    np.testing.assert_array_equal(buf.obs[0], buf.obs[-1])
    assert (buf.masks[0] == 0).all() and (buf.available_actions[0] == 0).all()
    box, _ = actor(act=spaces.Box(-1, 1, (2,)))
    assert box.available_actions is None and box.actions.shape == (8, 4, 2)
    with pytest.raises(ValueError, match="not Discrete"):
        box.insert(np.ones((4, 3)), np.zeros((4, 1, 8)), np.zeros((4, 2)), np.zeros((4, 2)), np.ones((4, 1)),
                   available_actions=np.ones((4, 2)))
