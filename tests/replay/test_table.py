import dataclasses

import numpy as np
import pytest
from checkpointed_parts import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st
from id_rows import ITEM, SPEC, check_sample_data, write

from rlflow.replay import (
    Fifo,
    Lifo,
    MaxHeap,
    MinHeap,
    MinSize,
    Prioritized,
    Queue,
    RateLimitTimeout,
    SampleToInsertRatio,
    StepStore,
    Table,
    Uniform,
)
from rlflow.specs import Field, SpecError


def snapshot(table):
    items = table.items()
    return {**items, "size": table.size, "limiter": dict(table.rate_limiter.state_dict()),
            "sampler": {k: v for k, v in table.sampler.state_dict().items() if k != "rng"}}


def test_insert_and_sample_windows_with_fields():
    store = StepStore(SPEC, capacity=8, lanes=2)
    table = Table(store, item_spec=ITEM, sampler=Uniform(seed=0))
    for t in range(4):
        write(store, first=np.array([t == 2, False]))
    keys = table.insert([0, 1, 0], [0, 1, 1], [2, 3, 3], fields={"ret": [1.5, 2.5, 3.5]})
    assert table.size == 3 and len(set(keys.tolist())) == 3
    s = table.sample(64)
    check_sample_data(s)
    by_key = dict(zip(keys.tolist(), [1.5, 2.5, 3.5], strict=True))
    assert s.fields["ret"].tolist() == [by_key[k] for k in s.keys.tolist()]
    assert np.all(s.probabilities == 1 / 3) and np.all(s.weights == 1)
    # Lane 0's window [1, 4) crosses the episode start at row 2: rows 2, 3 are masked.
    w = s.mask[s.keys == keys[2]]
    assert w.shape[1] == 3 and w[0].tolist() == [True, False, False]


def test_overwrite_removes_items_from_every_table():
    store = StepStore(SPEC, capacity=4, lanes=2)
    limiter_a, limiter_b = MinSize(1), MinSize(1)
    a = Table(store, rate_limiter=limiter_a, name="a")
    b = Table(store, sampler=Prioritized(seed=1), rate_limiter=limiter_b, name="b")
    for _ in range(4):
        write(store)
    ka = a.insert([0, 0, 1], [0, 2, 1], [2, 2, 3])
    kb = b.insert([0, 1], [1, 0], [3, 4])
    write(store, lanes=[0])  # overwrites lane 0 row 0
    assert a.items()["key"].tolist() == ka[1:].tolist()
    assert b.items()["key"].tolist() == kb.tolist()
    write(store, lanes=[0, 1])  # lane 0 row 1, lane 1 row 0
    assert a.items()["key"].tolist() == ka[1:].tolist()
    assert b.items()["key"].tolist() == []
    assert limiter_a.deletes == 1 and limiter_b.deletes == 2
    write(store, lanes=[1])  # lane 1 row 1
    assert a.items()["key"].tolist() == [ka[1]]
    check_sample_data(a.sample(5))


def test_items_sharing_a_start_row_are_all_removed():
    store = StepStore(SPEC, capacity=3)
    table = Table(store, max_size=10)
    for _ in range(3):
        write(store)
    table.insert([0, 0, 0, 0], [0, 0, 0, 1], [1, 2, 3, 1])
    table.delete(table.items()["key"][1:2])
    assert table.size == 3
    write(store)
    assert table.items()["start"].tolist() == [1]


@settings(max_examples=80, deadline=None)
@given(
    script=st.lists(st.tuples(st.sampled_from(["write", "insert", "sample", "delete"]), st.integers(0, 2),
                              st.integers(1, 4), st.integers(0, 9)), max_size=50),
    capacity=st.integers(2, 6), max_size=st.integers(1, 12),
)
def test_table_matches_reference(script, capacity, max_size):
    lanes = 3
    store = StepStore(SPEC, capacity=capacity, lanes=lanes)
    table = Table(store, max_size=max_size, sampler=Uniform(seed=0), remover=Fifo())
    ref: list[tuple[int, int, int, int]] = []  # (key, lane, start, length) in insertion order
    for op, lane, n, x in script:
        if op == "write":
            write(store, lanes=[lane], first=np.array([x == 0]))
            old = store.count[lane] - capacity
            ref = [r for r in ref if not (r[1] == lane and r[2] < old)]
        elif op == "insert":
            count = int(store.count[lane])
            lo = max(0, count - capacity)
            if count - lo < 1:
                continue
            length = 1 + x % (count - lo)
            start = lo + (n % (count - lo - length + 1))
            key = int(table.insert([lane], [start], [length])[0])
            ref.append((key, lane, start, length))
            ref = ref[-max_size:]  # Fifo remover evicts the oldest
        elif op == "sample" and ref:
            s = table.sample(n)
            check_sample_data(s)
            live = {r[0]: r for r in ref}
            for k, ln, st_, ll in zip(s.keys.tolist(), s.lanes.tolist(), s.starts.tolist(), s.lengths.tolist(),
                                      strict=True):
                assert live[k][1:] == (ln, st_, ll)
        elif op == "delete" and ref:
            victim = ref[x % len(ref)][0]
            assert table.delete([victim, victim + 12345]) == 1
            ref = [r for r in ref if r[0] != victim]
        items = table.items()
        assert items["key"].tolist() == [r[0] for r in ref]
        assert items["start"].tolist() == [r[2] for r in ref]
    lim = table.rate_limiter
    assert lim.inserts - lim.deletes == table.size == len(ref)


def test_max_size_evicts_with_remover():
    store = StepStore(SPEC, capacity=10)
    for _ in range(10):
        write(store)
    table = Table(store, max_size=3, remover=MaxHeap())
    table.insert(np.zeros(3, np.int64), [0, 1, 2], 1, priorities=[1.0, 5.0, 2.0])
    table.insert([0, 0], [3, 4], 1, priorities=[0.5, 9.0])
    assert table.items()["start"].tolist() == [0, 3, 4]  # evicted 5.0 then 2.0
    with pytest.raises(ValueError):
        Table(store, max_size=0)


def _full_store():
    store = StepStore(SPEC, capacity=10)
    for _ in range(10):
        write(store)
    return store


@pytest.mark.parametrize("remover,kept", [
    (Fifo(), [2, 3, 4]),  # the two oldest leave
    (Lifo(), [0, 3, 4]),  # the two newest leave (before the new items are in)
    (MinHeap(), [1, 3, 4]),  # the smallest priorities leave: 1.0 (start 0), then 2.0 (start 2)
    (MaxHeap(), [0, 3, 4]),
])
def test_every_ordered_selector_evicts_in_its_order(remover, kept):
    """max_size 3, three items, then two more: each ordered remover picks the two it puts first."""
    table = Table(_full_store(), max_size=3, remover=remover)
    table.insert(np.zeros(3, np.int64), [0, 1, 2], 1, priorities=[1.0, 5.0, 2.0])
    table.insert([0, 0], [3, 4], 1, priorities=[0.5, 9.0])
    assert sorted(table.items()["start"].tolist()) == kept


@pytest.mark.parametrize("make,priorities,evicted_first", [
    (lambda seed: Uniform(seed=seed), [1.0, 0.0, 0.0], set()),
    (lambda seed: Prioritized(1.0, seed=seed), [1.0, 0.0, 0.0], {0}),
    (lambda seed: Prioritized(1.0, seed=seed), [0.0, 0.0, 0.0], set()),
    (lambda seed: Prioritized(1.0, seed=seed), [3.0, 0.0, 2.0], {0, 2}),
])
def test_a_random_remover_evicts_distinct_items_zero_priorities_included(make, priorities, evicted_first):
    """Random removers evict distinct items; a Prioritized one those of positive priority first, then items
    of priority 0 (which it never samples) uniformly: an insert needing more evictions than there are
    items of positive priority goes through, also when every priority is 0."""
    store = _full_store()
    left = set()
    for seed in range(30):
        table = Table(store, max_size=3, remover=make(seed))
        table.insert(np.zeros(3, np.int64), [0, 1, 2], 1, priorities=priorities)
        table.insert([0, 0], [3, 4], 1, priorities=[1.0, 1.0])
        starts = sorted(table.items()["start"].tolist())
        assert len(starts) == 3 and starts[1:] == [3, 4] and table.rate_limiter.deletes == 2
        left.add(starts[0])
        store.unsubscribe(table)
    assert left == {0, 1, 2} - evicted_first  # every other item is sometimes the one left


def test_queue_semantics_fifo_max_times_one():
    store = StepStore(SPEC, capacity=10)
    for _ in range(10):
        write(store)
    table = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, rate_limiter=Queue(6))
    table.insert(np.zeros(5, np.int64), np.arange(5), 1)
    s = table.sample(3)
    assert s.starts.tolist() == [0, 1, 2] and s.times_sampled.tolist() == [1, 1, 1]
    assert table.items()["start"].tolist() == [3, 4]
    with pytest.raises(RateLimitTimeout, match="sample 3"):
        table.sample(3, timeout=0.01)
    with pytest.raises(ValueError, match="max_times_sampled=1"):
        Table(store, sampler=Fifo(), remover=Fifo(), rate_limiter=Queue(6))


def test_deterministic_sampler_repeats_its_first_item():
    store = StepStore(SPEC, capacity=10)
    for _ in range(4):
        write(store)
    table = Table(store, sampler=Lifo(), max_times_sampled=None)
    table.insert([0, 0, 0], [0, 1, 2], 1)
    s = table.sample(4)
    assert s.starts.tolist() == [2, 2, 2, 2] and s.times_sampled.tolist() == [1, 2, 3, 4]
    limited = Table(store, sampler=Lifo(), max_times_sampled=2)
    limited.insert([0, 0, 0], [0, 1, 2], 1)
    s = limited.sample(5)
    assert s.starts.tolist() == [2, 2, 1, 1, 0] and s.times_sampled.tolist() == [1, 2, 1, 2, 1]
    assert limited.items()["start"].tolist() == [0]
    assert not limited.can_sample(2) and limited.can_sample(1)


def test_random_sampler_with_max_times_sampled_never_oversamples():
    store = StepStore(SPEC, capacity=50)
    for _ in range(50):
        write(store)
    table = Table(store, sampler=Uniform(seed=3), max_times_sampled=3)
    keys = table.insert(np.zeros(20, np.int64), np.arange(20), 1)
    seen: dict[int, list[int]] = {}
    while table.can_sample(7):
        s = table.sample(7)
        check_sample_data(s)
        for k, t in zip(s.keys.tolist(), s.times_sampled.tolist(), strict=True):
            seen.setdefault(k, []).append(t)
    assert all(v == list(range(1, len(v) + 1)) and len(v) <= 3 for v in seen.values())
    left = table.items()
    assert sum(map(len, seen.values())) == 56 and table.size == len(left["key"])
    assert (3 - left["times_sampled"]).sum() == 3 * 20 - 56  # retired items used their whole budget
    assert set(seen) <= set(keys.tolist())


def test_update_priorities_stale_duplicates_and_bad_values():
    store = StepStore(SPEC, capacity=6)
    for _ in range(6):
        write(store)
    table = Table(store, sampler=Prioritized(alpha=1.0, seed=0))
    keys = table.insert(np.zeros(4, np.int64), [0, 1, 2, 3], 1, priorities=[1.0, 1.0, 1.0, 1.0])
    table.delete(keys[:1])
    n = table.update_priorities([keys[0], keys[1], keys[2], keys[2], 999_999], [7.0, 2.0, 5.0, 3.0, 1.0])
    assert n == 3  # keys[1], and keys[2] twice; keys[0] was deleted, 999_999 never existed
    assert table.items()["priority"].tolist() == [2.0, 3.0, 1.0]
    before = snapshot(table)
    for bad, msg in [([-1.0, 1.0], ">= 0, got -1.0"), ([np.nan, 1.0], "got nan"), ([1.0, np.inf], "got inf"),
                     ([1.0], r"shape \(2,\)")]:
        with pytest.raises(ValueError, match=msg):
            table.update_priorities(keys[1:3], bad)
        assert_same(snapshot(table), before)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"lanes": [0], "starts": [5], "lengths": [2]}, r"window \[5, 7\) of lane 0 is not stored"),
        ({"lanes": [0], "starts": [0], "lengths": [2]}, r"window \[0, 2\) of lane 0 is not stored"),
        ({"lanes": [1], "starts": [2], "lengths": [1]}, r"lanes: expected values in \[0, 1\)"),
        ({"lanes": [0], "starts": [2], "lengths": [0]}, "lengths"),
        ({"lanes": [0, 0], "starts": [2], "lengths": [1]}, "lanes: expected 1 values"),
        ({"lanes": [0], "starts": [2.0], "lengths": [1]}, "starts: expected a 1-d integer"),
        ({"lanes": [0], "starts": [2], "lengths": [1], "priorities": [-2.0]}, "priorities"),
        ({"lanes": [0], "starts": [2], "lengths": [1], "fields": {"ret": [np.nan]}}, "finite"),
        ({"lanes": [0], "starts": [2], "lengths": [1], "fields": {"rett": [1.0]}}, "missing"),
        ({"lanes": [0], "starts": [2], "lengths": [1], "fields": None}, "needs item fields"),
    ],
)
def test_bad_insert_changes_nothing(kwargs, error):
    store = StepStore(SPEC, capacity=4)
    for _ in range(6):
        write(store)
    table = Table(store, item_spec=ITEM)
    table.insert([0], [3], [2], fields={"ret": [1.0]})
    before = snapshot(table)
    kwargs.setdefault("fields", {"ret": [0.0] * len(kwargs["starts"])})
    with pytest.raises((ValueError, SpecError), match=error):
        table.insert(**kwargs)
    assert_same(snapshot(table), before)


def test_sample_to_insert_ratio_blocks_and_times_out():
    store = StepStore(SPEC, capacity=100)
    for _ in range(100):
        write(store)
    table = Table(store, rate_limiter=SampleToInsertRatio(2.0, 3, 4.0))
    assert not table.can_sample(1)
    table.insert(np.zeros(3, np.int64), [0, 1, 2], 1)
    assert table.can_sample(1)
    with pytest.raises(RateLimitTimeout, match="insert"):
        table.insert(np.zeros(10, np.int64), np.arange(3, 13), 1, timeout=0.01)
    inserted = table.size  # those admitted before the timeout stay
    assert 3 < inserted < 13
    with pytest.raises(RateLimitTimeout, match="sample 100"):
        table.sample(100, timeout=0.01)


def test_sample_to_torch():
    torch = pytest.importorskip("torch")
    store = StepStore(SPEC, capacity=4)
    for _ in range(4):
        write(store)
    table = Table(store, item_spec=ITEM)
    table.insert([0], [1], [2], fields={"ret": [2.0]})
    s = table.sample(3).to_torch()
    assert isinstance(s.data["obs"], torch.Tensor) and s.data["obs"].shape == (3, 2, 2)
    assert s.mask.dtype == torch.bool and s.fields["ret"].tolist() == [2.0] * 3
    assert s.keys.dtype == torch.int64


def _sampled():
    store = StepStore(SPEC, capacity=4)
    for _ in range(4):
        write(store)
    table = Table(store, item_spec=ITEM)
    table.insert([0, 0], [1, 0], [2, 2], fields={"ret": [2.0, 3.0]})
    return table.sample(5)


def _tensors(sample):
    return [sample.keys, sample.probabilities, sample.weights, sample.mask, sample.data["obs"], sample.fields["ret"]]


def test_to_torch_moves_every_array_to_the_device():
    """``device=``: every array of the sample arrives there with its values (the ``meta`` device stands in
    for an accelerator: the same ``Tensor.to`` path, shapes and dtypes kept, no data)."""
    torch = pytest.importorskip("torch")
    sample = _sampled()
    on_cpu = sample.to_torch("cpu")
    for got, want in zip(_tensors(on_cpu), _tensors(sample), strict=True):
        assert got.device.type == "cpu"
        np.testing.assert_array_equal(got.numpy(), want)
    for got, want in zip(_tensors(sample.to_torch(torch.device("meta"))), _tensors(sample), strict=True):
        assert got.device.type == "meta" and tuple(got.shape) == want.shape
        assert got.dtype == torch.from_numpy(np.ascontiguousarray(want)).dtype


def test_to_torch_pins_then_copies_without_blocking(monkeypatch):
    """``pin_memory=True`` pins each array and then copies it with ``non_blocking=True`` (the pinning and
    the copy are recorded: this machine may have no CUDA device)."""
    torch = pytest.importorskip("torch")
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: calls.append("pin") or t.clone())
    real_to = torch.Tensor.to

    def to(t, *args, **kwargs):
        calls.append(("to", kwargs.get("non_blocking")))
        return real_to(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    sample = _sampled()
    out = sample.to_torch("cpu", pin_memory=True)

    def count(x):
        if isinstance(x, dict):
            return sum(count(v) for v in x.values())
        return 0 if x is None else 1

    n = sum(count(getattr(sample, f.name)) for f in dataclasses.fields(sample))
    assert n >= 10 and calls == ["pin", ("to", True)] * n
    np.testing.assert_array_equal(out.data["obs"].numpy(), sample.data["obs"])


def test_to_torch_on_cuda_with_pinned_memory():
    """Where a CUDA device is present: a pinned, non-blocking copy to it gives the sampled values."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sample = _sampled()
    out = sample.to_torch("cuda", pin_memory=True)
    torch.cuda.synchronize()
    for got, want in zip(_tensors(out), _tensors(sample), strict=True):
        assert got.device.type == "cuda"
        np.testing.assert_array_equal(got.cpu().numpy(), want)


def test_to_torch_pin_memory_without_cuda_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    store = StepStore(SPEC, capacity=4)
    for _ in range(4):
        write(store)
    table = Table(store)
    table.insert([0], [1], [2])
    with pytest.raises(RuntimeError, match="pin_memory=True needs a CUDA device"):
        table.sample(2).to_torch(pin_memory=True)


def test_ratio_window_narrower_than_a_batch_never_admits_it_single_threaded():
    """docs/rate_limiters.md: the window must leave room for a whole batch."""
    store = StepStore(SPEC, capacity=1000)
    for _ in range(1000):
        write(store)
    table = Table(store, rate_limiter=SampleToInsertRatio(1.0, 10, 50.0))  # window [-40, 60]: 100 wide
    row = 0
    while table.can_insert(1):
        table.insert([0], [row], 1)
        row += 1
    assert row == 60 and not table.can_sample(128)  # stuck: no insert admitted, no batch of 128 either
    assert table.can_sample(100)                      # a batch that fits the window goes through


NSTEP_ITEM = {"return": Field((), np.float32), "discount": Field((), np.float32)}




def test_a_table_configured_for_items_of_one_setting_names_the_setting_another_view_differs_in():
    from rlflow.replay.views import SequenceView, TransitionView

    store = StepStore({"x": Field((), np.float32)}, capacity=16, lanes=1)
    table = Table(store, rate_limiter=MinSize(1))
    assert table.check_items(TransitionView(3, 0.9), None) is False  # not configured yet: nothing to refuse
    table.configure_items(TransitionView(3, 0.9), None)
    assert table.check_items(TransitionView(3, 0.9), None) is True
    with pytest.raises(ValueError, match=r"holds transition items of n=3; this adder's have n=1"):
        table.configure_items(TransitionView(1, 0.9), None)
    with pytest.raises(ValueError, match=r"discount=0\.9; this adder's have discount=0\.5"):
        table.check_items(TransitionView(3, 0.5), None)
    with pytest.raises(ValueError, match=r"already holds transition items .* an adder of sequence items"):
        table.configure_items(SequenceView(4, 2, "zero_pad"), None)
    assert table.view == TransitionView(3, 0.9)  # every refusal left the table as it was


def test_to_torch_of_nested_arrays_shares_memory_on_the_cpu():
    """``rlflow.replay.sample.to_torch``: any nesting of arrays (what a learner builds from a sample) as tensors;
    on the CPU a contiguous array's tensor shares its memory, a strided one is copied, ``None`` stays."""
    torch = pytest.importorskip("torch")
    from rlflow.replay.sample import to_torch

    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    tree = {"a": base, "b": (base[:, ::2], None), "c": [np.int64([1, 2])]}
    out = to_torch(tree)
    assert isinstance(out["b"], tuple) and out["b"][1] is None and isinstance(out["c"], list)
    assert out["a"].data_ptr() == base.ctypes.data  # shared
    out["a"][0, 0] = 99.0
    assert base[0, 0] == 99.0
    assert out["b"][0][0, 0] == 0.0  # the strided array's tensor is a copy, made before the write
    np.testing.assert_array_equal(out["b"][0].numpy()[1:], base[1:, ::2])
    assert out["c"][0].dtype == torch.int64
    assert to_torch(base, torch.device("meta")).device.type == "meta"


def test_a_refused_insert_changes_nothing_however_it_would_go_in():
    """An insert with a window that is not stored is refused whole, naming the item, whether its items would
    go in parts the rate limiter admits or at once, evicting items to make room: the table is as before.
    The same insert with stored windows then goes in (the parts admitted before a timeout stay)."""
    store = StepStore(SPEC, capacity=8)
    for _ in range(8):
        write(store)
    parts = Table(store, rate_limiter=SampleToInsertRatio(1.0, 1, (-2.0, 2.0)))  # two inserts ahead of samples
    before = snapshot(parts)
    with pytest.raises(ValueError, match=r"item 3: window \[7, 9\) of lane 0 is not stored"):
        parts.insert([0] * 4, [2, 3, 4, 7], [1, 1, 1, 2], timeout=0.01)
    assert_same(before, snapshot(parts))
    with pytest.raises(RateLimitTimeout):
        parts.insert([0] * 4, [2, 3, 4, 6], [1, 1, 1, 2], timeout=0.01)
    assert parts.items()["start"].tolist() == [2, 3]  # the two admitted before the timeout
    check_sample_data(parts.sample(2))

    full = Table(store, max_size=3, remover=Fifo())
    full.insert([0, 0], [0, 1], 1)
    before = snapshot(full)
    with pytest.raises(ValueError, match=r"item 2: window \[7, 9\) of lane 0 is not stored"):
        full.insert([0] * 3, [2, 3, 7], [1, 1, 2])  # at once, two evictions needed
    assert_same(before, snapshot(full))
    full.insert([0] * 3, [2, 3, 6], [1, 1, 2])
    assert sorted(full.items()["start"].tolist()) == [2, 3, 6]
    check_sample_data(full.sample(3))
