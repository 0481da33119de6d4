import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlflow.replay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Uniform
from rlflow.replay.sum_tree import BRANCH, SumTree

CAP = 13  # not a power of two on purpose

# An op is (kind, slot, priority): kind 0 = insert (if absent), 1 = update (if present), 2 = delete (if present).
ops = st.lists(st.tuples(st.integers(0, 2), st.integers(0, CAP - 1),
                         st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.25, 7.0, 1e-3])), max_size=60)


def apply(sel, ops, batch=False):
    """Apply ops to a selector and to a dict reference {slot: (priority, seq)}."""
    ref: dict[int, tuple[float, int]] = {}
    seq = 0
    for kind, slot, p in ops:
        s = np.array([slot])
        if kind == 0 and slot not in ref:
            sel.insert(s, np.array([p]), np.array([seq]))
            ref[slot] = (p, seq)
            seq += 1
        elif kind == 1 and slot in ref:
            sel.update(s, np.array([p]))
            ref[slot] = (p, ref[slot][1])
        elif kind == 2 and slot in ref:
            sel.delete(s)
            del ref[slot]
    return ref


@settings(max_examples=150, deadline=None)
@given(ops=ops, alpha=st.sampled_from([0.0, 0.6, 1.0]), beta=st.sampled_from([0.0, 0.4, 1.0]))
def test_prioritized_against_brute_force(ops, alpha, beta):
    sel = Prioritized(alpha, beta, seed=0)
    sel.bind(CAP)
    ref = apply(sel, ops)
    mass = {s: p**alpha if p > 0 else 0.0 for s, (p, _) in ref.items()}
    total = sum(mass.values())
    assert sel.size == len(ref)
    assert sel.total == pytest.approx(total, rel=1e-12, abs=1e-300)
    if total <= 0:
        if ref:
            with pytest.raises(ValueError, match="priority 0"):
                sel.sample(1)
        return
    # The midpoint of each positive item's mass interval (in slot order) must find that item.
    prefix, targets, expect = 0.0, [], []
    for s in range(CAP):
        m = mass.get(s, 0.0)
        if m > 0:
            targets.append(prefix + m / 2)
            expect.append(s)
        prefix += m
    assert sel.tree.find(np.array(targets)).tolist() == expect
    slots, probs, weights = sel.sample_with_weights(64)
    assert all(mass[s] > 0 for s in slots.tolist())
    np.testing.assert_allclose(probs, [mass[s] / total for s in slots.tolist()], rtol=1e-12)
    n = len(ref)
    p_all = np.array([m / total for m in mass.values() if m > 0])
    max_w = ((n * p_all) ** -beta).max()
    np.testing.assert_allclose(weights, (n * probs) ** -beta / max_w, rtol=1e-6)


@settings(max_examples=150, deadline=None)
@given(ops=ops, cls=st.sampled_from([Fifo, Lifo, MinHeap, MaxHeap]), n=st.integers(1, CAP + 2))
def test_ordered_against_sort(ops, cls, n):
    sel = cls()
    sel.bind(CAP)
    ref = apply(sel, ops)
    key = {
        Fifo: lambda s: ref[s][1],
        Lifo: lambda s: -ref[s][1],
        MinHeap: lambda s: (ref[s][0], ref[s][1]),
        MaxHeap: lambda s: (-ref[s][0], ref[s][1]),
    }[cls]
    expect = sorted(ref, key=key)[:n]
    assert sel.sample(n)[0].tolist() == expect
    assert sel.sample(n)[0].tolist() == expect  # sampling leaves the order untouched
    k = min(n, len(ref))
    assert sel.choose_for_removal(k, lambda: np.array(sorted(ref))).tolist() == expect[:k]
    assert sel.size == len(ref)


@settings(max_examples=100, deadline=None)
@given(ops=ops)
def test_uniform_holds_exactly_the_live_items(ops):
    sel = Uniform(seed=1)
    sel.bind(CAP)
    ref = apply(sel, ops)
    assert sel.size == len(ref)
    assert sorted(sel._items[: sel.size].tolist()) == sorted(ref)
    if ref:
        slots, probs = sel.sample(50)
        assert set(slots.tolist()) <= set(ref)
        assert np.all(probs == 1 / len(ref))
        removal = sel.choose_for_removal(len(ref), lambda: np.array(sorted(ref)))
        assert sorted(removal.tolist()) == sorted(ref)


@settings(max_examples=150, deadline=None)
@given(ops=ops, alpha=st.sampled_from([0.0, 0.6, 1.0]), k=st.integers(1, CAP))
def test_prioritized_removal_takes_positive_priorities_first_and_leaves_the_tree(ops, alpha, k):
    """A prioritized remover picks ``k`` distinct live items: every item of positive priority before any of
    priority 0 (which draws never reach), all of them when ``k`` is at least their number; the tree is
    left as it was."""
    sel = Prioritized(alpha, seed=3)
    sel.bind(CAP)
    ref = apply(sel, ops)
    k = min(k, len(ref))
    sums, mins = sel.tree.sums.copy(), sel.tree.mins.copy()
    chosen = sel.choose_for_removal(k, lambda: np.array(sorted(ref), np.int64)).tolist()
    positive = {s for s, (p, _) in ref.items() if p > 0}
    assert len(chosen) == len(set(chosen)) == k and set(chosen) <= set(ref)
    first = chosen[:min(k, len(positive))]
    assert set(first) <= positive and (k < len(positive) or set(first) == positive)
    np.testing.assert_array_equal(sel.tree.sums, sums)  # leaves and every sum and min, bit for bit
    np.testing.assert_array_equal(sel.tree.mins, mins)


def test_prioritized_removal_draws_without_replacement_in_proportion():
    """Two evictions from masses 1, 2, 7: the ordered pair (a, b) comes with probability
    m_a / 10 * m_b / (10 - m_a), as from one draw, a delete, and another draw (chi-square, fixed seed);
    then the priority-0 item, uniformly among the two."""
    sel = Prioritized(1.0, seed=0)
    sel.bind(5)
    sel.insert(np.arange(5), np.array([1.0, 2.0, 7.0, 0.0, 0.0]), np.arange(5))
    live = lambda: np.arange(5)  # noqa: E731
    pairs = [(a, b) for a in range(3) for b in range(3) if a != b]
    m = [1.0, 2.0, 7.0]
    expect = np.array([m[a] / 10 * m[b] / (10 - m[a]) for a, b in pairs])
    counts = dict.fromkeys(pairs, 0)
    for _ in range(6000):
        a, b = sel.choose_for_removal(2, live).tolist()
        counts[(a, b)] += 1
    got = np.array([counts[p] for p in pairs])
    chi2 = float(((got - expect * got.sum()) ** 2 / (expect * got.sum())).sum())
    assert chi2 < 5 + 5 * np.sqrt(10)  # 5 degrees of freedom: about its 1-in-10^4 quantile
    fourth = [sel.choose_for_removal(4, live).tolist() for _ in range(2000)]
    assert all(sorted(c[:3]) == [0, 1, 2] and c[3] in (3, 4) for c in fourth)
    assert abs(np.mean([c[3] == 3 for c in fourth]) - 0.5) < 0.05


@settings(max_examples=100, deadline=None)
@given(capacity=st.sampled_from([1, 2, 15, 16, 17, 255, 256, 257, 5000]), data=st.data())
def test_sum_tree_against_brute_force(capacity, data):
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    for _ in range(data.draw(st.integers(1, 5))):
        slots = np.array(data.draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=20)))
        values = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.25, 1.0, 3.0, 1e-6, 1e3]),
                                             min_size=len(slots), max_size=len(slots))))
        tree.update(slots, values)
        for s, v in zip(slots, values, strict=True):  # in order: a repeated slot keeps its last value
            ref[s] = v
    np.testing.assert_array_equal(tree.leaves, ref)
    assert tree.total == pytest.approx(ref.sum(), rel=1e-12)
    assert tree.min == (ref[ref > 0].min() if (ref > 0).any() else np.inf)
    if ref.sum() > 0:
        cum = np.cumsum(ref)
        pos = np.flatnonzero(ref > 0)
        mid = cum[pos] - ref[pos] / 2
        assert tree.find(mid).tolist() == pos.tolist()
        # Targets at or past the total (rounding) still land on a positive leaf, the last one.
        assert tree.find(np.array([ref.sum(), ref.sum() * 2])).tolist() == [pos[-1], pos[-1]]
        assert set(tree.find(np.linspace(0, ref.sum(), 50, endpoint=False)).tolist()) <= set(pos.tolist())


def test_sum_tree_has_no_drift():
    tree = SumTree(100_000)
    rng = np.random.default_rng(0)
    tree.update(np.arange(100_000), rng.random(100_000) * 1e6)
    for _ in range(300):
        tree.update(rng.integers(0, 100_000, 256), rng.random(256) * 10 ** rng.uniform(-6, 6))
    fresh = SumTree(100_000)
    fresh.set_leaves(tree.leaves.copy())
    np.testing.assert_array_equal(tree.sums, fresh.sums)  # bit-identical: parents always summed from children
    np.testing.assert_array_equal(tree.mins, fresh.mins)
    assert tree.total == pytest.approx(tree.leaves.sum(), rel=1e-12)


@pytest.mark.parametrize("bad", [[0, 3, 10], [2, -1], [10**12]])
def test_sum_tree_checks_every_slot_before_changing_a_leaf(bad):
    tree = SumTree(10)
    tree.update(np.arange(10), np.arange(1.0, 11.0))
    sums, mins = tree.sums.copy(), tree.mins.copy()
    outside = next(s for s in bad if not 0 <= s < 10)
    message = rf"slot {outside} \(entry {bad.index(outside)}\) is outside the tree's 10 leaves"
    with pytest.raises(IndexError, match=message):
        tree.update(np.array(bad), np.zeros(len(bad)))
    with pytest.raises(IndexError, match="outside the tree's 10 leaves"):
        tree.sequential(np.array(bad), np.ones(len(bad), bool), beta=0.4)
    np.testing.assert_array_equal(tree.sums, sums)  # nothing changed, not even the slots before the bad one
    np.testing.assert_array_equal(tree.mins, mins)
    with pytest.raises(ValueError, match="values must have 2 entries, got 1"):
        tree.update(np.array([1, 2]), np.array([1.0]))
    with pytest.raises(ValueError, match="values must have 10 entries, got 9"):
        tree.set_leaves(np.ones(9))
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        SumTree(0)
    assert not tree.leaves.flags.writeable  # changed only through update and set_leaves


def test_sum_tree_pickles_bit_for_bit_and_its_views_outlive_it():
    import pickle

    tree = SumTree(1000)
    rng = np.random.default_rng(1)
    tree.update(rng.integers(0, 1000, 3000), rng.random(3000), 0.6)
    copy = pickle.loads(pickle.dumps(tree))
    np.testing.assert_array_equal(copy.sums, tree.sums)
    np.testing.assert_array_equal(copy.mins, tree.mins)
    u = rng.random(64)
    for a, b in zip(copy.sample(u, stratified=True, beta=0.4), tree.sample(u, stratified=True, beta=0.4),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    leaves = tree.leaves
    expect = leaves.copy()
    del tree, copy
    np.testing.assert_array_equal(leaves, expect)  # a view keeps its tree alive


def test_duplicate_slots_in_one_update_last_wins():
    sel = Prioritized(alpha=1.0, seed=0)
    sel.bind(4)
    sel.insert(np.arange(4), np.ones(4), np.arange(4))
    sel.update(np.array([2, 1, 2, 2]), np.array([5.0, 3.0, 9.0, 4.0]))
    assert sel.priority_mass(np.arange(4)).tolist() == [1.0, 3.0, 4.0, 1.0]
    heap = MaxHeap()
    heap.bind(4)
    heap.insert(np.arange(4), np.ones(4), np.arange(4))
    heap.update(np.array([3, 3]), np.array([10.0, 0.5]))
    assert heap.sample(4)[0].tolist() == [0, 1, 2, 3]


def test_stratified_draws_one_per_slice():
    sel = Prioritized(alpha=1.0, seed=3)
    sel.bind(8)
    sel.insert(np.arange(4), np.array([1.0, 1.0, 2.0, 0.0]), np.arange(4))
    for _ in range(20):
        assert sel.sample(4)[0].tolist() == [0, 1, 2, 2]


def chi2_ok(counts, probs):
    """Every cell within 5 standard deviations of its binomial expectation."""
    n = counts.sum()
    exp = n * probs
    return np.all(np.abs(counts - exp) <= 5 * np.sqrt(exp * (1 - probs)) + 1)


@pytest.mark.parametrize("stratified", [True, False])
def test_prioritized_distribution(stratified):
    p = np.array([1.0, 2.0, 4.0, 8.0, 0.0, 0.5])
    alpha = 0.6
    sel = Prioritized(alpha, seed=12, stratified=stratified)
    sel.bind(6)
    sel.insert(np.arange(6), p, np.arange(6))
    counts = np.zeros(6)
    for _ in range(400):
        np.add.at(counts, sel.sample(50)[0], 1)
    probs = p**alpha / (p**alpha).sum()
    assert counts[4] == 0
    assert chi2_ok(counts, probs)


@pytest.mark.parametrize(("capacity", "live"), [(10, [0, 1, 3, 4, 5, 6]), (40, [3, 17, 38])])
def test_uniform_distribution(capacity, live):
    """Both regimes: rejection over slots (at least half live) and the packed live array (fewer)."""
    sel = Uniform(seed=5)
    sel.bind(capacity)
    sel.insert(np.array([*live, 39 % capacity]), np.ones(len(live) + 1), np.arange(len(live) + 1))
    sel.delete(np.array([39 % capacity]))
    slots, probs = sel.sample(60_000)
    counts = np.bincount(slots, minlength=capacity)
    assert counts.sum() == counts[live].sum() and np.all(probs == 1 / len(live))
    assert chi2_ok(counts[live], np.full(len(live), 1 / len(live)))


@pytest.mark.parametrize(("cls", "capacity"), [(Uniform, 20), (Uniform, 200), (Prioritized, 20), (Fifo, 20),
                                              (MaxHeap, 20)])
def test_state_round_trip_continues_identically(cls, capacity):
    a = cls(seed=7)
    a.bind(capacity)
    rng = np.random.default_rng(0)
    a.insert(np.arange(15), rng.random(15), np.arange(15))
    a.delete(np.array([3, 9]))
    a.sample(5)
    b = cls(seed=99)
    b.bind(capacity)
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        sa, pa = a.sample(8)
        sb, pb = b.sample(8)
        assert sa.tolist() == sb.tolist() and pa.tolist() == pb.tolist()


def test_bad_parameters_and_double_bind():
    with pytest.raises(ValueError, match="alpha"):
        Prioritized(alpha=-1)
    with pytest.raises(ValueError, match="beta"):
        Prioritized(beta=float("nan"))
    s = Uniform()
    s.bind(3)
    with pytest.raises(ValueError, match="already bound"):
        s.bind(3)


@pytest.mark.parametrize("capacity", [1, 9, 5000, 1_000_000])
def test_sum_tree_levels_share_cache_lines(capacity):
    """Each node's BRANCH children sit in one 64-byte line: aligned arrays, levels on multiples of BRANCH."""
    tree = SumTree(capacity)
    assert tree.sums.ctypes.data % 64 == 0 and tree.mins.ctypes.data % 64 == 0
    assert all(int(o) % BRANCH == 0 for o in tree.offsets)


@pytest.mark.parametrize("cls", [Fifo, Lifo])
def test_insertion_ring_compacts_dead_entries_between_live_ends(cls):
    """An oldest item that stays while others come and go keeps the ring's head live, and the newest keeps its
    tail live: the dead entries between them fill the ring (twice the capacity, 32 entries here) several
    times over and are compacted away, and the order stays insertion order."""
    sel = cls()
    sel.bind(CAP)
    churn = []
    for i in range(1, 81):  # insert one slot, then delete the one inserted before it: one dead entry a round
        churn += [(0, 3 + 4 * (i % 2), 1.0), (2, 3 + 4 * ((i - 1) % 2), 1.0)]
    ref = apply(sel, [(0, 0, 1.0), (0, 3, 1.0), *churn, (0, 5, 1.0), (0, 9, 1.0)])
    order = sorted(ref, key=lambda s: ref[s][1])
    assert order == [0, 3, 5, 9]
    assert sel.sample(CAP)[0].tolist() == (order if cls is Fifo else order[::-1])


@settings(max_examples=80, deadline=None)
@given(live=st.sets(st.integers(0, CAP - 1), min_size=1), ops=ops, n=st.integers(1, 40))
@example(live=set(range(CAP)), ops=[], n=5)  # every slot live: draws read the one-byte flags
@example(live={2, 5}, ops=[], n=5)  # fewer than half: the packed array
def test_uniform_draw_rows_is_sample_then_each_draws_row(live, ops, n):
    """The tables' one-call draw gives the draws, probabilities and weights of ``sample_with_weights`` (same
    seed, same random numbers), a copy of each draw's metadata row as of that draw, and counts each draw in
    the metadata's times column, in both regimes (at least half the slots live, and fewer)."""
    a, b = Uniform(seed=3), Uniform(seed=3)
    a.bind(CAP)
    b.bind(CAP)
    ops = [(0, slot, 1.0) for slot in sorted(live)] + ops  # start from a drawn set of live slots
    ref = apply(a, ops)
    apply(b, ops)
    if not ref:
        return
    meta = np.arange(CAP * 6, dtype=np.int64).reshape(CAP, 6) * 7
    expect_meta = meta.copy()
    slots, rows, probs, weights = a.draw_rows(n, meta)
    want_slots, want_probs, want_weights = b.sample_with_weights(n)
    want_rows = []
    for s in want_slots.tolist():  # the reference: count the draw in TIMES (column 5), then copy the row
        expect_meta[s, 5] += 1
        want_rows.append(expect_meta[s].tolist())
    assert slots.tolist() == want_slots.tolist() and set(slots.tolist()) <= set(ref)
    assert probs.dtype == want_probs.dtype and probs.tolist() == want_probs.tolist() == [1 / len(ref)] * n
    assert weights.dtype == np.float32 and weights.tolist() == want_weights.tolist() == [1.0] * n
    assert rows.tolist() == want_rows and np.array_equal(meta, expect_meta)
    # each row is the slot's row as of its draw: a slot drawn twice shows one more sample the second time
    for j, s in enumerate(slots.tolist()):
        assert rows[j, 5] == s * 42 + 35 + 1 + slots[:j].tolist().count(s)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.integers(0, CAP - 1), st.just(1.0)), min_size=100, max_size=400),
       cls=st.sampled_from([Fifo, Lifo]))
def test_insertion_ring_keeps_insertion_order_through_long_churn(ops, cls):
    """Hundreds of inserts and deletes on 16 slots: the ring (32 entries) wraps and compacts many times, with
    its head anywhere (the live entries then straddle the ring's end), and still gives insertion order."""
    sel = cls()
    sel.bind(CAP)
    ref = apply(sel, ops)
    order = sorted(ref, key=lambda s: ref[s][1])
    assert sel.sample(CAP)[0].tolist() == (order if cls is Fifo else order[::-1])
    assert sel.size == len(ref)


@pytest.mark.parametrize("cls", [Fifo, Lifo, MinHeap, MaxHeap])
def test_ordered_selectors_check_every_slot_before_changing_anything(cls):
    sel = cls()
    sel.bind(CAP)
    sel.insert(np.array([1, 2, 3]), np.array([3.0, 1.0, 2.0]), np.array([0, 1, 2]))
    state = sel.state_dict()
    with pytest.raises(IndexError, match=rf"slot {CAP} \(entry 1\) is outside the selector's {CAP} slots"):
        sel.insert(np.array([4, CAP]), np.array([1.0, 1.0]), np.array([3, 4]))
    with pytest.raises(IndexError, match=r"slot -1 \(entry 0\)"):
        sel.delete(np.array([-1]))
    after = sel.state_dict()
    assert after.keys() == state.keys()
    for k, v in state.items():
        np.testing.assert_equal(after[k], v)  # arrays, the size and the generator's state
    assert sel.sample(CAP)[0].tolist() == {Fifo: [1, 2, 3], Lifo: [3, 2, 1], MinHeap: [2, 3, 1],
                                            MaxHeap: [1, 3, 2]}[cls]


def test_the_core_refuses_more_items_than_slots_and_a_bad_heap_leaf():
    from rlflow import _core

    ring = _core.InsertionRing(3)  # a ring of 8 entries
    ring.push(np.array([0, 1, 2]), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="pushing 6 items after the 3 held would hold more than the selector's 3"):
        ring.push(np.array([0, 1, 2, 0, 1, 2]), np.arange(3, 9))
    assert ring.first(5, False).tolist() == [0, 1, 2] and ring.seq_of.tolist() == [0, 1, 2]
    tree = _core.TournamentTree(3)
    tree.set(np.array([0, 2]), np.array([2.0, 1.0]), np.array([0, 1]))
    with pytest.raises(ValueError, match="leaf 1 must hold its slot or -1, got 2"):
        tree.load(np.array([0, 2, -1, -1]), np.zeros(3), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="leaf 3 must hold its slot or -1, got 3"):  # a padding leaf
        tree.load(np.array([0, -1, -1, 3]), np.zeros(3), np.zeros(3, np.int64))
    assert tree.top(5).tolist() == [2, 0] and tree.leaves.tolist() == [0, -1, 2, -1]
