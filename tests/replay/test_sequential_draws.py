"""The probabilities and importance weights a sample reports are those of its sequential draws.

With ``max_times_sampled`` an item that reaches its limit leaves the table at that draw, so each later
draw of the batch is made over the items left: ``P = m / (mass left)`` (prioritized, ``m = p^alpha``) or
``1 / (items left)`` (uniform), and the weight ``(m_min / m)^beta`` with ``m_min`` the smallest positive
mass left. Checked by hand on three items, against a slow reference that replays each batch's draws one
by one (hypothesis), and for the law of the draws themselves (chi-square).
"""

import numpy as np
import pytest
from checkpointed_parts import assert_same
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from rlflow.replay import Fifo, Prioritized, RateLimitTimeout, RowTable, StepStore, Table, Uniform
from rlflow.specs import Field


def three_items(sampler, limit=1):
    """Items at rows 0, 1, 2 with priorities 1, 2, 3."""
    store = StepStore({"x": Field((), np.float32)}, capacity=16)
    store.extend(0, {"x": np.arange(4, dtype=np.float32)}, first=np.arange(4) == 0)
    table = Table(store, sampler=sampler, max_times_sampled=limit)
    table.insert([0, 0, 0], [0, 1, 2], 1, priorities=[1.0, 2.0, 3.0])
    return table


# masses 1, 2, 3 (alpha = 1, total 6); after the first draw's item leaves, the second is over the other two
HAND = {  # (first, second): (probabilities, weights with beta = 1)
    (0, 1): ([1 / 6, 2 / 5], [1.0, 1.0]),      # left {1, 2}: m_min 2
    (0, 2): ([1 / 6, 3 / 5], [1.0, 2 / 3]),
    (1, 0): ([2 / 6, 1 / 4], [1 / 2, 1.0]),    # left {0, 2}: m_min 1
    (1, 2): ([2 / 6, 3 / 4], [1 / 2, 1 / 3]),
    (2, 0): ([3 / 6, 1 / 3], [1 / 3, 1.0]),    # left {0, 1}: m_min 1
    (2, 1): ([3 / 6, 2 / 3], [1 / 3, 1 / 2]),
}


@pytest.mark.parametrize("stratified", [True, False])
def test_three_items_by_hand(stratified):
    seen = set()
    for seed in range(200):
        s = three_items(Prioritized(alpha=1.0, beta=1.0, stratified=stratified, seed=seed)).sample(2)
        outcome = tuple(int(x) for x in s.starts)
        probabilities, weights = HAND[outcome]
        np.testing.assert_allclose(s.probabilities, probabilities, rtol=1e-12, err_msg=str(outcome))
        np.testing.assert_allclose(s.weights, weights, rtol=1e-6, err_msg=str(outcome))
        seen.add(outcome)
    # stratified: the first draw falls in [0, 3) of the mass (item 0 or 1), the second in [3, 6) of what is left
    assert seen == ({(1, 2), (0, 2)} if stratified else set(HAND))


@pytest.mark.parametrize("make", [
    pytest.param(lambda seed: three_items(Uniform(seed=seed)), id="Table"),
    pytest.param(lambda seed: _row_table_three_items(seed), id="RowTable"),
])
def test_three_items_uniform_by_hand(make):
    for seed in range(50):
        s = make(seed).sample(2)
        np.testing.assert_array_equal(s.probabilities, [1 / 3, 1 / 2])
        np.testing.assert_array_equal(s.weights, [1.0, 1.0])


def _row_table_three_items(seed):
    store = StepStore({"x": Field((), np.float32)}, capacity=16)
    store.extend(0, {"x": np.arange(4, dtype=np.float32)}, first=np.arange(4) == 0)
    table = RowTable(store, max_times_sampled=1, seed=seed)
    table.insert([0, 0, 0], [0, 1, 2], 1)
    return table


def test_deterministic_draws_are_certain():
    s = three_items(Fifo(), limit=2).sample(5)
    np.testing.assert_array_equal(s.starts, [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(s.probabilities, np.ones(5))


# ---------------------------------------------------------------------------------------------- reference
def reference(sample, before, limit, kind, alpha, beta):
    """Replay the batch's draws one by one over the table's items before it (key -> priority, times):
    each draw must name an item still in, and gets the probability and weight of a draw over those."""
    mass = {k: (p**alpha if p > 0 else 0.0) for k, (p, _) in before.items()}
    times = {k: t for k, (_, t) in before.items()}
    left = set(before)
    probabilities, weights = [], []
    for key in sample.keys.tolist():
        assert key in left, f"draw of item {key}, which left the table earlier in the batch"
        if kind == "prioritized":
            assert mass[key] > 0
            probabilities.append(mass[key] / sum(mass[k] for k in left))
            weights.append((min(mass[k] for k in left if mass[k] > 0) / mass[key]) ** beta)
        else:
            probabilities.append(1 / len(left))
            weights.append(1.0)
        times[key] += 1
        if limit is not None and times[key] >= limit:
            left.remove(key)
    return np.array(probabilities), np.array(weights)


@given(kind=st.sampled_from(["prioritized", "uniform", "rows"]), limit=st.sampled_from([None, 1, 2, 3]),
       priorities=st.lists(st.sampled_from([0.0, 0.25, 1.0, 1.5, 4.0]), min_size=1, max_size=12),
       zeroed=st.lists(st.integers(0, 11), max_size=4),
       alpha=st.sampled_from([0.0, 0.6, 1.0]), beta=st.sampled_from([0.0, 0.4, 1.0]),
       stratified=st.booleans(), batches=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       seed=st.integers(0, 2**16))
def test_reported_probabilities_and_weights_are_those_of_the_sequential_draws(
        kind, limit, priorities, zeroed, alpha, beta, stratified, batches, seed):
    """Every sample either is the sequential draws (checked against the reference), or raises with the
    table exactly as it was: RateLimitTimeout when the items held cannot supply the batch, ValueError
    when the items of positive priority cannot (a prioritized sampler never draws priority 0)."""
    n = len(priorities)
    store = StepStore({"x": Field((), np.float32)}, capacity=32)
    store.extend(0, {"x": np.arange(n + 1, dtype=np.float32)}, first=np.arange(n + 1) == 0)
    if kind == "rows":
        table = RowTable(store, max_times_sampled=limit, seed=seed)
    else:
        sampler = Prioritized(alpha, beta, stratified=stratified, seed=seed) if kind == "prioritized" else \
            Uniform(seed=seed)
        table = Table(store, sampler=sampler, max_times_sampled=limit)
    keys = table.insert(np.zeros(n, np.int64), np.arange(n), 1, priorities=priorities)
    table.update_priorities(keys[np.array(zeroed, np.int64) % n], 0.0)  # priority 0 by update too
    for batch in batches:
        items = table.items()
        held = items["priority"] if kind == "prioritized" else np.ones(items["key"].size)
        left = limit - items["times_sampled"] if limit is not None else np.full(held.size, batch)
        state = table.state_dict()
        if left.sum() < batch or not held.size:
            with pytest.raises(RateLimitTimeout):
                table.sample(batch, timeout=0)
            assert_same(table.state_dict(), state)
            continue
        if left[held > 0].sum() < batch:
            with pytest.raises(ValueError, match="priority 0"):
                table.sample(batch, timeout=0)
            assert_same(table.state_dict(), state)
            continue
        before = {int(k): (float(p), int(t)) for k, p, t in zip(items["key"], held, items["times_sampled"],
                                                                 strict=True)}
        s = table.sample(batch, timeout=0)
        probabilities, weights = reference(s, before, limit, "prioritized" if kind == "prioritized" else "uniform",
                                           alpha, beta)
        np.testing.assert_allclose(s.probabilities, probabilities, rtol=1e-9)
        np.testing.assert_allclose(s.weights, weights, rtol=1e-5)
        assert s.weights.dtype == np.float32 and s.probabilities.dtype == np.float64


def test_positive_priority_items_retired_mid_batch_fail_the_sample_up_front():
    """Priorities 1 and 0, max_times_sampled=1: the second draw would need the item of priority 0, which
    is never sampled: sample(2) raises before any draw and leaves the table as it was; sample(1) draws."""
    for sampler in (Prioritized(1.0, 1.0, seed=0), Prioritized(0.0, 1.0, stratified=False, seed=1)):
        store = StepStore({"x": Field((), np.float32)}, capacity=8)
        store.extend(0, {"x": np.arange(3, dtype=np.float32)}, first=np.arange(3) == 0)
        table = Table(store, sampler=sampler, max_times_sampled=1)
        table.insert([0, 0], [0, 1], 1, priorities=[1.0, 0.0])
        state = table.state_dict()
        with pytest.raises(ValueError, match="positive priority have 1 draw"):
            table.sample(2)
        assert_same(table.state_dict(), state)
        assert table.size == 2 and table.rate_limiter.state_dict()["deletes"] == 0
        s = table.sample(1)
        assert s.starts.tolist() == [0] and s.probabilities.tolist() == [1.0]
        assert table.items()["start"].tolist() == [1]
        with pytest.raises(ValueError, match="positive priority have 0 draw"):
            table.sample(1)


def test_the_sequential_draws_keep_their_law():
    """Draw pairs from masses 1, 2, 3 with max_times_sampled=1, unstratified: ordered pair (a, b) comes
    with probability m_a / 6 * m_b / (6 - m_a) (chi-square), and each reports that probability."""
    store = StepStore({"x": Field((), np.float32)}, capacity=8)
    store.extend(0, {"x": np.arange(4, dtype=np.float32)}, first=np.arange(4) == 0)
    table = Table(store, sampler=Prioritized(1.0, 1.0, stratified=False, seed=7), max_times_sampled=1)
    counts = dict.fromkeys(HAND, 0)
    for _ in range(3000):
        table.insert([0, 0, 0], [0, 1, 2], 1, priorities=[1.0, 2.0, 3.0])
        s = table.sample(2)
        pair = (int(s.starts[0]), int(s.starts[1]))
        counts[pair] += 1
        np.testing.assert_allclose(s.probabilities, HAND[pair][0], rtol=1e-12)
        table.delete(table.items()["key"])
    expected = np.array([HAND[p][0][0] * HAND[p][0][1] for p in counts]) * 3000
    assert abs(expected.sum() - 3000) < 1e-9
    assert stats.chisquare(np.array(list(counts.values())), expected).pvalue > 1e-3


def test_without_retirement_nothing_changes():
    """Draws that retire no item (no limit, or a limit no item reaches in the batch) report the table's
    P(i) = m_i / total and weights (m_min / m_i)^beta for every draw."""
    for limit in (None, 4):
        table = three_items(Prioritized(alpha=1.0, beta=1.0, stratified=False, seed=3), limit=limit)
        s = table.sample(3)
        masses = np.array([1.0, 2.0, 3.0])[s.starts]
        np.testing.assert_allclose(s.probabilities, masses / 6, rtol=1e-12)
        np.testing.assert_allclose(s.weights, 1.0 / masses, rtol=1e-6)


def test_the_sum_tree_is_left_as_it_was():
    from rlflow.replay.sum_tree import SumTree

    rng = np.random.default_rng(0)
    tree = SumTree(100)
    tree.update(np.arange(100), np.where(rng.random(100) < 0.2, 0.0, rng.random(100)), 0.7)
    sums, mins = tree.sums.copy(), tree.mins.copy()
    leaves = rng.choice(np.flatnonzero(tree.leaves > 0), 30, replace=False)
    probabilities, _ = tree.sequential(leaves, rng.random(30) < 0.5, beta=0.4)
    np.testing.assert_array_equal(tree.sums, sums)
    np.testing.assert_array_equal(tree.mins, mins)
    assert probabilities[0] == tree.leaves[leaves[0]] / tree.total
