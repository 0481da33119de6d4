"""rlflow.compat.flexibuff: parity with the real flexibuff (0.1) where it is right, and its bugs fixed."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from rlflow.compat.flexibuff import FlexiBatch, FlexibleBuffer

flexibuff = pytest.importorskip("flexibuff")

KW = dict(num_steps=50, obs_size=3, action_mask=True, discrete_action_cardinalities=[2, 3],
          continuous_action_dimension=2, n_agents=2, state_size=4, global_reward=True, global_auxiliary_reward=True,
          individual_reward=True, individual_auxiliary_reward=True, log_prob_discrete=True, log_prob_continuous=1,
          memory_weights=True)
ARRAYS = ["obs", "obs_", "state", "state_", "global_rewards", "global_auxiliary_rewards", "individual_rewards",
          "individual_auxiliary_rewards", "discrete_actions", "continuous_actions", "discrete_log_probs",
          "continuous_log_probs", "terminated", "memory_weights"]


def step(rng, a=2, terminated=False):
    return dict(
        obs=rng.normal(size=(a, 3)), obs_=rng.normal(size=(a, 3)), terminated=terminated,
        discrete_actions=np.stack([rng.integers(0, 2, a), rng.integers(0, 3, a)], 1),
        continuous_actions=rng.normal(size=(a, 2)), global_reward=float(rng.normal()),
        global_auxiliary_reward=float(rng.normal()), individual_rewards=rng.normal(size=a),
        individual_auxiliary_rewards=rng.normal(size=a),
        action_mask=[rng.integers(0, 2, (a, 2)), rng.integers(0, 2, (a, 3))],
        action_mask_=[rng.integers(0, 2, (a, 2)), rng.integers(0, 2, (a, 3))],
        state=rng.normal(size=4), state_=rng.normal(size=4), discrete_log_probs=rng.normal(size=(a, 2)),
        continuous_log_probs=rng.normal(size=(a, 1)), memory_weight=float(rng.uniform(0.1, 1)))


def fill(buffers, steps, seed=0, p_end=0.2):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        s = step(rng, terminated=bool(rng.random() < p_end))
        for fb in buffers:
            fb.save_transition(**s)


# ---------------------------------------------------------------------------------------------- parity
def test_the_same_steps_give_the_same_arrays_and_batches():
    ours, theirs = FlexibleBuffer(**KW), flexibuff.FlexibleBuffer(**KW)
    fill([ours, theirs], 40)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name), err_msg=name)
    for h in range(2):
        np.testing.assert_array_equal(ours.action_mask[h], theirs.action_mask[h])
        np.testing.assert_array_equal(ours.action_mask_[h], theirs.action_mask_[h])
    assert (ours.idx, ours.steps_recorded) == (theirs.idx, theirs.steps_recorded)
    idx = np.array([3, 0, 39, 7])
    a, b = ours.sample_transitions(idx=idx), theirs.sample_transitions(idx=idx)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.action_mask[1], b.action_mask[1])
    assert a.obs.shape == (2, 4, 3) and a.state.shape == (4, 4)  # flexibuff's layout: agents first


def test_the_arrays_are_written_into_never_replaced():
    fb = FlexibleBuffer(**KW)
    fill([fb], 10)
    fb.obs[1, 4] = [7.0, 8.0, 9.0]  # flexibuff's arrays are the storage: a write is what is sampled
    fb.action_mask_[1][0, 4] = [0.0, 0.0, 0.0]
    fb.terminated[4] = 1.0
    batch = fb.sample_transitions(idx=[4])
    np.testing.assert_array_equal(batch.obs[1, 0], [7.0, 8.0, 9.0])
    np.testing.assert_array_equal(batch.action_mask_[1][0, 0], [0.0, 0.0, 0.0])
    assert batch.terminated[0] == 1.0
    before = fb.obs.copy()
    with pytest.raises(AttributeError, match=r"fb.obs\[\.\.\.\] = values"):
        fb.obs = np.zeros_like(before)
    with pytest.raises(AttributeError, match="cannot be replaced"):
        fb.action_mask = None
    np.testing.assert_array_equal(fb.obs, before)
    assert FlexibleBuffer(num_steps=4, obs_size=2).state is None  # not stored: None, as in flexibuff


def test_episodes_are_flexibuffs_before_wrap_around():
    ours, theirs = FlexibleBuffer(**KW), flexibuff.FlexibleBuffer(**KW)
    fill([ours, theirs], 45, seed=1)
    assert ours.episode_inds == theirs.episode_inds and ours.episode_lens == theirs.episode_lens
    got = ours.sample_episodes(max_batch_size=10_000)
    assert sorted(int(e.global_rewards.size) for e in got) == sorted(theirs.episode_lens)
    for e in got:  # each episode: consecutive steps, the last one terminated, no other
        assert e.terminated[-1] == 1 and not e.terminated[:-1].any()


@pytest.mark.parametrize("k", [1, 3])
def test_return_helpers_match_flexibuff_without_truncation(k):
    gen = torch.Generator().manual_seed(k)
    r, v = torch.randn(12, generator=gen), torch.randn(12, generator=gen)
    term = torch.tensor([0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0], dtype=torch.float32)
    torch.testing.assert_close(FlexibleBuffer.G(r, term, 0.7, 0.9), flexibuff.FlexibleBuffer.G(r, term, 0.7, 0.9))
    for ours, theirs in zip(FlexibleBuffer.GAE(r, v, term, 0.7, 0.9, 0.8),
                            flexibuff.FlexibleBuffer.GAE(r, v, term, 0.7, 0.9, 0.8), strict=True):
        torch.testing.assert_close(ours, theirs)
    for ours, theirs in zip(FlexibleBuffer.K_Step_TD(r, v, term, 0.7, 0.9, k),
                            flexibuff.FlexibleBuffer.K_Step_TD(r, v, term, 0.7, 0.9, k), strict=True):
        torch.testing.assert_close(ours, theirs)


# ---------------------------------------------------------------------------------------------- flexibuff's bugs
def test_wrap_around_keeps_only_whole_stored_episodes():
    fb = FlexibleBuffer(**{**KW, "num_steps": 16}, seed=0)
    theirs = flexibuff.FlexibleBuffer(**{**KW, "num_steps": 16})
    rng, ends = np.random.default_rng(0), np.random.default_rng(5)
    written = []  # the global reward of every step, in order
    crashed = False
    for _ in range(90):
        s = step(rng, terminated=bool(ends.random() < 0.25))
        written.append(s["global_reward"])
        fb.save_transition(**s)
        try:
            theirs.save_transition(**s)
        except IndexError:  # flexibuff 0.1: "pop from empty list" once episodes wrap around
            crashed = True
    assert crashed
    episodes = fb.sample_episodes(max_batch_size=10_000)
    assert episodes and sum(e.global_rewards.size for e in episodes) <= 16
    text = np.float32(written)
    for e in episodes:  # each is a run of consecutive written steps among the last 16
        r = e.global_rewards
        starts = [i for i in range(90 - 16, 90 - r.size + 1) if np.array_equal(text[i:i + r.size], r)]
        assert len(starts) == 1


def test_thousands_of_episodes_through_a_small_ring_keep_exactly_the_whole_stored_ones(tmp_path):
    """Episodes of 1-3 steps through a 40-step ring, 6,000 steps (the forgotten episodes' records are cut from
    the front of their list now and then): the stored episodes are always those whose every step is among
    the last 40, and sampling, saving and loading see exactly them."""
    fb = FlexibleBuffer(num_steps=40, obs_size=1, global_reward=True, seed=0, path=str(tmp_path) + "/", name="ring")
    rng = np.random.default_rng(0)
    ended = []  # (first step, length) of every ended episode
    start = 0
    for t in range(6_000):
        end = bool(rng.random() < 0.5) or t - start == 2
        fb.save_transition(obs=np.zeros((1, 1)), obs_=np.zeros((1, 1)), global_reward=float(t), terminated=end)
        if end:
            ended.append((start, t + 1 - start))
            start = t + 1
        if t % 997 == 0 or t == 5_999:
            stored = [(s, n) for s, n in ended if s >= t + 1 - 40]
            assert (fb.episode_lens or []) == [n for _, n in stored]
            assert fb.episode_inds == ([s % 40 for s, _ in stored] + [start % 40] if stored else None)
    episodes = fb.sample_episodes(max_batch_size=10_000)
    got = sorted(tuple(e.global_rewards.tolist()) for e in episodes)
    assert got == sorted(tuple(float(x) for x in range(s, s + n)) for s, n in stored)
    FlexibleBuffer.save(fb)
    back = FlexibleBuffer.load(str(tmp_path) + "/", "ring")
    assert back.episode_lens == fb.episode_lens and back.episode_inds == fb.episode_inds


def test_unnormalised_memory_weights_sample_in_proportion_without_replacement():
    fb = FlexibleBuffer(num_steps=8, obs_size=1, global_reward=True, memory_weights=True, seed=0)
    weights = [1.0, 2.0, 3.0, 4.0, 0.0]
    for i, w in enumerate(weights):
        fb.save_transition(obs=[[i]], obs_=[[i]], global_reward=i, memory_weight=w)
    with pytest.raises(ValueError):  # flexibuff: "probabilities do not sum to 1"
        theirs = flexibuff.FlexibleBuffer(num_steps=8, obs_size=1, global_reward=True, memory_weights=True)
        for i, w in enumerate(weights):
            theirs.save_transition(obs=[[i]], obs_=[[i]], global_reward=i, memory_weight=w, terminated=False)
        theirs.sample_transitions(2, weighted=True)
    counts: dict[tuple[int, int], int] = {}
    draws = 20_000
    for _ in range(draws):
        pair = tuple(int(x) for x in fb.sample_transitions(2, weighted=True).global_rewards)
        counts[pair] = counts.get(pair, 0) + 1
    p = np.array(weights[:4]) / 10.0
    for (i, j), c in counts.items():  # successive sampling: P(i, j) = p_i p_j / (1 - p_i)
        expected = p[i] * p[j] / (1 - p[i])
        assert abs(c / draws - expected) < 4 * np.sqrt(expected * (1 - expected) / draws) + 1e-3, (i, j)
    assert all(4 not in pair for pair in counts)  # weight 0: never drawn
    assert len(fb.sample_transitions(4, weighted=True).global_rewards) == 4
    with pytest.raises(ValueError, match="above 0"):
        fb.sample_transitions(5, weighted=True)


def test_uniform_sampling_is_distinct_and_covers_what_is_stored():
    fb = FlexibleBuffer(num_steps=1000, obs_size=1, global_reward=True, seed=0)
    for i in range(10):
        fb.save_transition(obs=[[i]], obs_=[[i]], global_reward=i)
    b = fb.sample_transitions(256)  # fewer stored than the batch: every one, once
    assert sorted(b.global_rewards.tolist()) == list(range(10))
    for i in range(10, 1000):
        fb.save_transition(obs=[[i]], obs_=[[i]], global_reward=i)
    seen = np.zeros(1000, int)
    for _ in range(400):
        r = fb.sample_transitions(64).global_rewards.astype(int)
        assert np.unique(r).size == 64
        seen[r] += 1
    assert seen.min() > 0 and abs(seen.mean() - 25.6) < 1e-9  # 400 * 64 / 1000


def test_missing_or_misshapen_values_raise_and_write_nothing():
    fb = FlexibleBuffer(**KW)
    rng = np.random.default_rng(0)
    fill([fb], 3)
    before = {n: getattr(fb, n).copy() for n in ARRAYS}
    s = step(rng)
    for bad, match in [({"state": None}, "state"), ({"obs": np.zeros((3, 3))}, r"obs: expected shape \(2, 3\)"),
                       ({"action_mask": None}, "action_mask"), ({"global_reward": float("nan")}, "finite"),
                       ({"memory_weight": -1.0}, "memory_weight")]:
        with pytest.raises(ValueError, match=match):
            fb.save_transition(**{**s, **bad})
    for bad_action in ([[1.5, 0], [0, 0]], [[2, 0], [0, 0]], [[0, 3], [0, 0]], [[-1, 0], [0, 0]]):
        with pytest.raises(ValueError, match="cardinalit"):  # heads of 2 and 3 choices
            fb.save_transition(**{**s, "discrete_actions": np.array(bad_action)})
    with pytest.raises(ValueError, match="finite"):
        fb.save_transition(**{**s, "discrete_log_probs": np.full((2, 2), -np.inf)})
    plain = FlexibleBuffer(num_steps=4, obs_size=1)
    with pytest.raises(ValueError, match="not built to store"):
        plain.save_transition(obs=[[0]], obs_=[[0]], global_reward=1.0)
    for n in ARRAYS:
        np.testing.assert_array_equal(getattr(fb, n), before[n])
    assert fb.steps_recorded == 3


def test_save_load_and_pickle_round_trips(tmp_path):
    fb = FlexibleBuffer(**{**KW, "num_steps": 16}, path=str(tmp_path) + "/", name="buf", seed=3)
    fill([fb], 37, seed=2)
    path = FlexibleBuffer.save(fb)
    for copy in (FlexibleBuffer.load(str(tmp_path) + "/", "buf"), pickle.loads(pickle.dumps(fb))):
        for n in ARRAYS:
            np.testing.assert_array_equal(getattr(copy, n), getattr(fb, n), err_msg=n)
        assert (copy.idx, copy.steps_recorded, copy.episode_lens) == (fb.idx, fb.steps_recorded, fb.episode_lens)
        a = copy.sample_transitions(8, weighted=True)
        b = pickle.loads(pickle.dumps(fb)).sample_transitions(8, weighted=True)
        np.testing.assert_array_equal(a.obs, b.obs)  # the same RNG state: the same samples
    with open(path, "wb") as f:
        f.write(b"not a buffer")
    with pytest.raises(ValueError, match="not a readable saved buffer"):
        FlexibleBuffer.load(str(tmp_path) + "/", "buf")
    with pytest.raises(FileNotFoundError):
        FlexibleBuffer.load(str(tmp_path) + "/", "other")


def test_a_damaged_zip_header_or_a_killed_save_is_answered(tmp_path):
    import os
    import subprocess
    import sys

    from zip_layout import CENTRAL_FIELDS, zip_headers

    fb = FlexibleBuffer(**{**KW, "num_steps": 8}, path=str(tmp_path) + "/", name="buf", seed=3)
    fill([fb], 5, seed=2)
    path = FlexibleBuffer.save(fb)
    raw = open(path, "rb").read()
    for kind, start, _ in zip_headers(raw):
        if kind == "central":
            for field, bit in [("flags", 0), ("flags", 6), ("method", 0), ("method", 3)]:
                bad = bytearray(raw)
                bad[start + CENTRAL_FIELDS[field][0]] ^= 1 << bit  # encrypted, strong encryption, compressed
                with open(path, "wb") as f:
                    f.write(bytes(bad))
                with pytest.raises(ValueError, match="not a readable saved buffer"):
                    FlexibleBuffer.load(str(tmp_path) + "/", "buf")
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              check=True).stdout)
    for name in [f".buf.npz.tmp-{dead}", f".other.npz.tmp-{dead}", "tmpx.tmp"]:
        (tmp_path / name).write_bytes(b"half a buffer")
    FlexibleBuffer.save(fb)  # removes the killed save's file, and only that
    assert sorted(os.listdir(tmp_path)) == [f".other.npz.tmp-{dead}", "buf.npz", "tmpx.tmp"]
    assert FlexibleBuffer.load(str(tmp_path) + "/", "buf").steps_recorded == fb.steps_recorded


def test_truncation_ends_episodes_and_bootstraps_in_the_helpers():
    fb = FlexibleBuffer(num_steps=10, obs_size=1, global_reward=True, seed=0)
    for i in range(5):
        fb.save_transition(obs=[[i]], obs_=[[i + 1]], global_reward=1.0, truncated=i == 2)
    assert fb.episode_lens == [3]
    r = torch.ones(3)
    term = torch.zeros(3)
    trunc = torch.tensor([0.0, 1.0, 0.0])
    g = FlexibleBuffer.G(r, term, last_value=10.0, gamma=0.5, truncated=trunc, bootstrap_values=torch.tensor(
        [0.0, 4.0, 0.0]))
    # step 1 truncated: 1 + .5 * 4 = 3; step 0: 1 + .5 * 3 = 2.5; step 2 (a new episode): 1 + .5 * 10 = 6
    torch.testing.assert_close(g[:, 0], torch.tensor([2.5, 3.0, 6.0]))
    with pytest.raises(ValueError, match="bootstrap_values"):
        FlexibleBuffer.G(r, term, truncated=trunc)


def test_as_torch_and_sum_batch_rewards():
    fb = FlexibleBuffer(**KW, seed=0)
    fill([fb], 10)
    b = fb.sample_transitions(4, as_torch=True, device="cpu")
    assert isinstance(b, FlexiBatch) and b.obs.dtype == torch.float32 and b.discrete_actions.dtype == torch.int64
    assert isinstance(b.action_mask[0], torch.Tensor)
    n = fb.sample_transitions(idx=[1, 2])
    np.testing.assert_allclose(FlexibleBuffer.sum_batch_rewards(n, 1), n.global_rewards + n.global_auxiliary_rewards
                               + n.individual_rewards[1] + n.individual_auxiliary_rewards[1])


def test_sample_episodes_draws_distinct_episodes_uniformly():
    fb = FlexibleBuffer(num_steps=64, obs_size=1, global_reward=True, seed=0)
    for e in range(10):  # ten episodes of 2 steps, episode e's rewards are e
        for t in range(2):
            fb.save_transition(obs=[[e]], obs_=[[e]], global_reward=e, terminated=t == 1)
    counts = np.zeros(10)
    for _ in range(2000):
        got = [int(b.global_rewards[0]) for b in fb.sample_episodes(max_batch_size=100, n_episodes=3)]
        assert len(got) == 3 and len(set(got)) == 3  # distinct
        counts[got] += 1
    np.testing.assert_allclose(counts / 2000, 0.3, atol=0.04)  # each episode in 3 of 10 draws
    cut = fb.sample_episodes(max_batch_size=5)  # 2 + 2 + the third cut to 1 step
    assert [b.global_rewards.size for b in cut] == [2, 2, 1]
    assert fb.sample_episodes(max_batch_size=0) == []
