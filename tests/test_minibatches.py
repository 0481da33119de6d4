"""rlflow.minibatches: coverage of every step once per epoch, chunks within lanes, determinism, take."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow import minibatches as mb


@settings(max_examples=80)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 6), st.booleans(), st.integers(0, 2**32 - 1))
def test_feedforward_covers_every_valid_step_once(T, E, k, use_mask, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random((T, E)) < 0.6 if use_mask else None
    valid = {(t, e) for t in range(T) for e in range(E) if mask is None or mask[t, e]}
    if k > len(valid):
        with pytest.raises(ValueError, match=f"num_minibatches: expected at most the {len(valid)} valid steps"):
            mb.feedforward(T, E, k, rng=seed, mask=mask)
        return
    batches = list(mb.feedforward(T, E, k, rng=seed, mask=mask))
    assert len(batches) == k
    sizes = [len(t) for t, _ in batches]
    assert max(sizes) - min(sizes) <= 1
    seen = Counter((int(t), int(e)) for ts, es in batches for t, e in zip(ts, es, strict=True))
    assert set(seen) == valid and set(seen.values()) == {1}


@settings(max_examples=40)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 10))
def test_feedforward_minibatch_size(T, E, size):
    batches = list(mb.feedforward(T, E, minibatch_size=size, rng=0))
    assert [len(t) for t, _ in batches[:-1]] == [size] * (len(batches) - 1)
    assert 1 <= len(batches[-1][0]) <= size
    flat = np.concatenate([t * E + e for t, e in batches])
    np.testing.assert_array_equal(np.sort(flat), np.arange(T * E))


def test_feedforward_is_deterministic_with_a_seed_and_shuffles():
    a = [np.stack(b) for b in mb.feedforward(16, 4, 4, rng=7)]
    b = [np.stack(b) for b in mb.feedforward(16, 4, 4, rng=np.random.default_rng(7))]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    rng = np.random.default_rng(7)
    first, second = (np.concatenate([t for t, _ in mb.feedforward(16, 4, 4, rng=rng)]) for _ in range(2))
    assert not np.array_equal(first, second)  # one generator: a new order every epoch
    assert not np.array_equal(first, np.repeat(np.arange(16), 4))


def test_feedforward_bad_arguments():
    with pytest.raises(ValueError, match="expected exactly one of num_minibatches and minibatch_size, got "
                                         "num_minibatches=None and minibatch_size=None"):
        mb.feedforward(4, 2)
    with pytest.raises(ValueError, match="expected exactly one of"):
        mb.feedforward(4, 2, 2, minibatch_size=4)
    with pytest.raises(ValueError, match="minibatch_size: expected an integer >= 1, got 0"):
        mb.feedforward(4, 2, minibatch_size=0)
    with pytest.raises(ValueError, match="T: expected an integer >= 1, got 0"):
        mb.feedforward(0, 2, 1)
    with pytest.raises(ValueError, match=r"mask: expected shape \(4, 2\), got \(2, 4\)"):
        mb.feedforward(4, 2, 1, mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="num_minibatches: expected at most the 8 valid steps, got 9"):
        mb.feedforward(4, 2, 9)


@settings(max_examples=80)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 14), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_recurrent_chunks_tile_each_lane(T, E, L, k, seed):
    per_lane = -(-T // L)
    if k > E * per_lane:
        with pytest.raises(ValueError, match=f"num_minibatches: expected at most the {E * per_lane} chunks"):
            mb.recurrent_chunks(T, E, L, k, rng=seed)
        return
    batches = list(mb.recurrent_chunks(T, E, L, k, rng=seed))
    assert len(batches) == k
    sizes = [len(c.mask) for c in batches]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == E * per_lane
    seen: Counter = Counter()
    for c in batches:
        (t, e), (t0, e0) = c.index, c.start
        M = len(t0)
        assert t.shape == e.shape == c.mask.shape == (M, L) and t.dtype == e.dtype == np.int64
        assert np.all(e == e0[:, None])                          # a chunk never leaves its lane
        np.testing.assert_array_equal(t[:, 0], t0)               # the start is the chunk's first step
        assert np.all(t0 % L == 0) and np.all(t0 < T)            # chunks start at 0, L, 2L, ...
        raw = t0[:, None] + np.arange(L)
        np.testing.assert_array_equal(c.mask, raw < T)           # only past the rollout's end is masked
        np.testing.assert_array_equal(t, np.minimum(raw, T - 1))  # padding repeats the last step
        seen.update(zip(t[c.mask].tolist(), e[c.mask].tolist(), strict=True))
    assert seen == Counter({(t, e): 1 for t in range(T) for e in range(E)})


def test_recurrent_chunks_deterministic_and_bad_arguments():
    a = list(mb.recurrent_chunks(10, 3, 4, 2, rng=1))
    b = list(mb.recurrent_chunks(10, 3, 4, 2, rng=1))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.index[0], y.index[0])
        np.testing.assert_array_equal(x.index[1], y.index[1])
    with pytest.raises(ValueError, match="chunk_length: expected an integer >= 1, got 0"):
        mb.recurrent_chunks(10, 3, 0, 2)
    with pytest.raises(ValueError,
                       match=r"num_minibatches: expected at most the 9 chunks \(3 lanes x ceil\(10 / 4\)\), got 10"):
        mb.recurrent_chunks(10, 3, 4, 10)
    with pytest.raises(ValueError, match="num_minibatches: expected an integer >= 1, got 0"):
        mb.recurrent_chunks(10, 3, 4, 0)
    with pytest.raises(ValueError, match=r"chunk_length: expected an integer >= 1, got 2\.5"):
        mb.recurrent_chunks(10, 3, 2.5, 1)


@pytest.mark.parametrize("as_torch", [False, True])
def test_chunks_replay_a_recurrent_rollout(as_torch):
    """Initial states from chunk starts plus resets at episode starts reproduce the rollout's states."""
    T, E, L = 11, 3, 4
    rng = np.random.default_rng(0)
    x = rng.normal(size=(T, E))
    first = rng.random((T, E)) < 0.2
    first[0] = first[-1] = True  # an episode starts at the last step, which pads the partial chunks
    states = np.zeros((T, E))  # the state given to the policy at each step, as an actor stores it
    h = np.full(E, 7.0)
    for t in range(T):
        h = np.where(first[t], 0.0, h)
        states[t] = h
        h = 0.5 * h + x[t]
    rollout = {"x": x, "rnn": states, "first": first}
    if as_torch:
        rollout = {k: torch.from_numpy(v) for k, v in rollout.items()}
    for chunks in mb.recurrent_chunks(T, E, L, 3, rng=0):
        batch = mb.take(rollout, chunks.index)
        reset = mb.chunk_resets(rollout["first"], chunks)
        h = mb.take(rollout["rnn"], chunks.start)
        replayed = []
        for j in range(L):
            h = torch.where(reset[:, j], 0.0, h) if as_torch else np.where(reset[:, j], 0.0, h)
            replayed.append(h)
            h = 0.5 * h + batch["x"][:, j]
        got = torch.stack(replayed, 1).numpy() if as_torch else np.stack(replayed, 1)
        want = np.asarray(batch["rnn"])
        np.testing.assert_allclose(got[chunks.mask], want[chunks.mask], rtol=1e-12)
        assert not np.asarray(reset)[~chunks.mask].any()


class Pair(NamedTuple):
    a: np.ndarray
    b: torch.Tensor


def test_take_gathers_nested_numpy_and_torch():
    T, E, A = 6, 2, 3
    tree = {"obs": np.arange(T * E * A * 2.0).reshape(T, E, A, 2), "pair": Pair(np.arange(T * E).reshape(T, E),
            torch.arange(T * E).reshape(T, E)), "list": [torch.ones(T, E, 5)]}
    (t, e) = next(mb.feedforward(T, E, 2, rng=0))
    got = mb.take(tree, (t, e))
    assert got["obs"].shape == (6, A, 2) and isinstance(got["pair"], Pair)
    np.testing.assert_array_equal(got["obs"], tree["obs"][t, e])
    np.testing.assert_array_equal(got["pair"].a, t * E + e)
    np.testing.assert_array_equal(got["pair"].b.numpy(), t * E + e)
    assert got["list"][0].shape == (6, 5)
    chunks = next(mb.recurrent_chunks(T, E, 4, 1, rng=0))
    assert mb.take(tree, chunks.index)["obs"].shape == (4, 4, A, 2)
    with pytest.raises(TypeError, match=r"take: expected numpy arrays or torch tensors .*, got str"):
        mb.take({"a": "text"}, (t, e))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**16))
def test_every_step_env_agent_row_appears_once_per_epoch_in_each_generator(T, E, A, L, seed):
    """Agents as lanes (``[T, E * A]``): feed-forward, naive recurrent and chunked epochs each cover every
    (t, env, agent) row exactly once; chunks and naive minibatches never cross a lane."""
    lanes = E * A
    rows = np.arange(T * lanes).reshape(T, lanes)  # row id of (t, env * A + agent)
    k = min(3, lanes)
    epochs = {
        "feedforward": [mb.take(rows, idx) for idx in mb.feedforward(T, lanes, k, rng=seed)],
        "naive": [mb.take(rows, idx) for idx in mb.naive_recurrent(T, lanes, k, rng=seed)],
    }
    chunked = []
    for c in mb.recurrent_chunks(T, lanes, L, min(k, lanes * -(-T // L)), rng=seed):
        got = mb.take(rows, c.index)
        assert (c.index[1] == c.index[1][:, :1]).all()  # one lane per chunk
        chunked.append(got[c.mask])
    epochs["chunks"] = chunked
    for name, parts in epochs.items():
        seen = np.concatenate([p.ravel() for p in parts])
        assert np.sort(seen).tolist() == list(range(T * lanes)), name
    for idx in mb.naive_recurrent(T, lanes, k, rng=seed):  # whole lanes, time-major
        t, e = idx
        assert (t == np.arange(T)[:, None]).all() and (e == e[:1]).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 8), st.booleans(), st.integers(0, 2**16))
def test_take_equals_numpy_indexing_for_any_integer_index(T, E, M, negative, seed):
    """``take`` gives ``leaf[index]`` for every leaf: in-range indices, negative ones (counted from the end)
    and broadcast shapes alike; an index out of range raises numpy's IndexError."""
    rng = np.random.default_rng(seed)
    tree = {"rows": rng.normal(size=(T, E, 3)).astype(np.float32), "scalars": rng.integers(0, 9, (T, E)),
            "flags": rng.random((T, E)) < 0.5}
    low = (-T, -E) if negative else (0, 0)
    t, e = rng.integers(low[0], T, M), rng.integers(low[1], E, M)
    for index in ((t, e), (t.astype(np.int32), e.astype(np.uint16) if not negative else e),
                  (t[:, None], e[None, :])):
        got = mb.take(tree, index)
        for key, leaf in tree.items():
            np.testing.assert_array_equal(got[key], leaf[index])
            assert got[key].dtype == leaf.dtype
    with pytest.raises(IndexError):
        mb.take(tree, (np.array([0, T]), np.array([0, 0])))
    with pytest.raises(IndexError):
        mb.take(tree, (np.array([0]), np.array([-E - 1])))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 8), st.booleans(), st.integers(0, 2**16))
def test_take_with_one_index_equals_numpy_indexing(N, M, negative, seed):
    """One index (axis 0's rows): integer arrays of any shape and dtype, negative rows counted from the end, and
    boolean masks all give ``leaf[index]``; a row out of range raises numpy's IndexError."""
    rng = np.random.default_rng(seed)
    tree = {"rows": rng.normal(size=(N, 3)).astype(np.float32), "scalars": rng.integers(0, 9, N)}
    rows = rng.integers(-N if negative else 0, N, M)
    for index in (rows, rows.astype(np.int32), rows.reshape(1, M), (rows,), rng.random(N) < 0.5):
        got = mb.take(tree, index)
        for key, leaf in tree.items():
            np.testing.assert_array_equal(got[key], leaf[index])
    with pytest.raises(IndexError):
        mb.take(tree, np.array([N]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(1, 4), st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_feedforward_batches_are_the_feedforward_minibatches_taken(T, E, k, by_size, use_mask, seed):
    """``feedforward_batches`` gives, from the same generator state, exactly ``take(tree, idx)`` for each of
    ``feedforward``'s minibatches: numpy and torch leaves, nested, with a mask and with a minibatch size."""
    rng = np.random.default_rng(seed)
    mask = rng.random((T, E)) < 0.7 if use_mask else None
    valid = T * E if mask is None else int(mask.sum())
    if valid == 0:
        return
    sizes = {"minibatch_size": k} if by_size else {"num_minibatches": min(k, valid)}
    tree = {"obs": rng.normal(size=(T, E, 2, 3)).astype(np.float32),
            "pair": Pair(rng.integers(0, 9, (T, E)), torch.arange(T * E).reshape(T, E)), "none": None,
            "list": [rng.random((T, E)) < 0.5]}
    got = list(mb.feedforward_batches(tree, T, E, rng=np.random.default_rng(seed), mask=mask, **sizes))
    want = [mb.take(tree, idx) for idx in mb.feedforward(T, E, rng=np.random.default_rng(seed), mask=mask, **sizes)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g["obs"], w["obs"])
        np.testing.assert_array_equal(g["pair"].a, w["pair"].a)
        assert torch.equal(g["pair"].b, w["pair"].b) and isinstance(g["pair"], Pair)
        np.testing.assert_array_equal(g["list"][0], w["list"][0])
        assert g["none"] is None


def test_feedforward_batches_take_t_steps_of_longer_leaves_and_refuse_bad_arguments():
    tree = {"obs": np.arange(5 * 3.0).reshape(5, 3), "step": np.arange(4 * 3).reshape(4, 3)}  # obs: T + 1 rows
    batches = list(mb.feedforward_batches(tree, 4, 3, minibatch_size=5, rng=0))
    assert [b["obs"].shape for b in batches] == [(5,), (5,), (2,)]
    taken = np.concatenate([b["obs"] for b in batches])
    assert sorted(taken.tolist()) == list(range(12))  # never the last row's steps 12 .. 14
    np.testing.assert_array_equal(taken, np.concatenate([b["step"] for b in batches]))
    with pytest.raises(ValueError, match="expected exactly one of num_minibatches and minibatch_size"):
        mb.feedforward_batches(tree, 4, 3, rng=0)
    with pytest.raises(IndexError):  # a leaf shorter than T
        mb.feedforward_batches({"obs": np.zeros((3, 3))}, 4, 3, 2, rng=0)


def test_the_shuffle_kernel_draws_every_order_equally_often():
    """The compiled Fisher-Yates shuffle behind every epoch: each of the n! orders of n = 3 and n = 4 items
    comes up about equally often (a chi-square test on 24,000 seeded draws; an off-by-one in the swap range,
    Sattolo's cycles or a biased draw, gives some orders never or twice as often), and every position of a
    longer array is equally likely to receive each item."""
    from scipy.stats import chisquare

    rng = np.random.default_rng(0)
    for n in (3, 4):
        counts = Counter(tuple(mb._permutation(n, rng).tolist()) for _ in range(24_000))
        assert len(counts) == {3: 6, 4: 24}[n]
        assert chisquare(list(counts.values())).pvalue > 1e-3
    where = np.zeros((10, 10), np.int64)  # where[item, position]
    for _ in range(5_000):
        where[mb._permutation(10, rng), np.arange(10)] += 1
    assert chisquare(where.ravel()).pvalue > 1e-3
    assert mb._permutation(np.array([5, 7, 9]), 3).tolist() in ([5, 7, 9], [5, 9, 7], [7, 5, 9], [7, 9, 5],
                                                                  [9, 5, 7], [9, 7, 5])
    np.testing.assert_array_equal(mb._permutation(6, 11), mb._permutation(6, np.random.default_rng(11)))


def test_the_shuffle_checks_its_draws_and_never_shuffles_a_copy():
    """A draw outside [0, 1) would pick a position outside the array: refused before any value moves. The values
    are shuffled in place, so an array of another dtype (which would be converted, and the copy shuffled) is
    refused rather than left as it was."""
    from rlflow import _core

    values = np.arange(5, dtype=np.int64)
    for bad in (1.0, -0.25, np.nan):
        with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\), got .* at position 3"):
            _core.shuffle(values, np.array([0.5, 0.5, 0.5, bad, 0.5]))
        np.testing.assert_array_equal(values, np.arange(5))
    with pytest.raises(ValueError, match="uniforms must have 5 entries, got 4"):
        _core.shuffle(values, np.full(4, 0.5))
    with pytest.raises(TypeError):
        _core.shuffle(np.arange(5, dtype=np.int32), np.full(5, 0.5))
    _core.shuffle(values, np.array([0.0, 0.0, 0.0, 0.0, 0.0]))  # every j = 0: a rotation, computed by hand
    assert values.tolist() == [1, 2, 3, 4, 0]
