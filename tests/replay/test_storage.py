import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.replay import StepStore
from rlflow.replay.storage import _SMALL_ROW
from rlflow.specs import Field, SpecError

SPEC = {"obs": Field((2,), np.float32), "act": Field((), np.int64), "flag": (Field((), np.bool_),)}


def rows(values):
    v = np.asarray(values, np.float32)
    i = np.nan_to_num(v).astype(np.int64)
    return {"obs": np.stack([v, -v], -1), "act": i, "flag": (i % 2 == 1,)}


@pytest.fixture(params=["memory", "disk"])
def make_store(request, tmp_path):
    def make(capacity=5, lanes=2):
        if request.param == "disk":
            return StepStore(SPEC, capacity, lanes, backend="disk", directory=tmp_path / f"s{capacity}_{lanes}")
        return StepStore(SPEC, capacity, lanes)
    return make


def test_append_wraps_and_tracks_episodes(make_store):
    store = make_store(capacity=4, lanes=2)
    for t in range(6):
        store.append(rows([t, 10 + t]), first=np.array([t in (0, 3), t == 0]))
    assert store.count.tolist() == [6, 6]
    # Lane 0 holds rows 2..5 (episode 0: rows 0-2, episode 1: rows 3-5); position = row % 4.
    got = store.gather([0, 0, 0, 0, 1], [2, 3, 4, 5, 5])
    assert got["act"].tolist() == [2, 3, 4, 5, 15]
    assert got["obs"][:, 1].tolist() == [-2, -3, -4, -5, -15]
    assert store.episode_id[0, [2, 3, 0, 1]].tolist() == [0, 1, 1, 1]
    assert store.episode_step[0, [2, 3, 0, 1]].tolist() == [2, 0, 1, 2]
    assert store.episode_step[1, [2, 3, 0, 1]].tolist() == [2, 3, 4, 5]
    assert len(store) == 8
    with pytest.raises(IndexError, match="row 1 of lane 0 is not stored"):
        store.gather([0], [1])
    with pytest.raises(IndexError, match="row 6 of lane 1"):
        store.gather([1], [6])


def test_windows_stop_at_episode_boundary_unless_asked(make_store):
    store = make_store(capacity=8, lanes=1)
    store.extend(0, rows(range(6)), first=np.array([1, 0, 0, 1, 0, 0], bool))
    data, mask = store.gather_windows([0, 0], [1, 3], [4, 2], max_length=4)
    assert mask.tolist() == [[True, True, False, False], [True, True, False, False]]
    assert data["act"].tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    data, mask = store.gather_windows([0], [1], 4, cross_episodes=True)
    assert mask.tolist() == [[True] * 4] and data["act"].tolist() == [[1, 2, 3, 4]]
    with pytest.raises(IndexError, match=r"window \[4, 7\) of lane 0 is not stored: lane holds rows \[0, 6\)"):
        store.gather_windows([0], [4], [3])
    with pytest.raises(IndexError, match="lane 3 is not stored"):
        store.gather_windows([3], [0], [1])


def test_extend_wraps_and_continues_episode(make_store):
    store = make_store(capacity=5, lanes=2)
    store.extend(1, rows([0, 1, 2]), first=np.array([1, 0, 0], bool))
    store.extend(1, rows([3, 4, 5, 6]), first=np.array([0, 1, 0, 0], bool))
    assert store.count.tolist() == [0, 7]
    assert store.gather([1] * 5, range(2, 7))["act"].tolist() == [2, 3, 4, 5, 6]
    assert store.episode_id[1, np.arange(2, 7) % 5].tolist() == [0, 0, 1, 1, 1]
    assert store.episode_step[1, np.arange(2, 7) % 5].tolist() == [2, 3, 0, 1, 2]
    with pytest.raises(ValueError, match="exceed the lane capacity 5"):
        store.extend(0, rows(range(6)))


def test_overwrite_notifies_before_writing(make_store):
    store = make_store(capacity=3, lanes=2)
    seen = []

    class Listener:
        def on_overwrite_range(self, lane, lo, hi):
            # The rows are still intact when the listener runs.
            lanes, old_rows = np.full(hi - lo, lane), np.arange(lo, hi)
            seen.append((lanes.tolist(), old_rows.tolist(), store.gather(lanes, old_rows)["act"].tolist()))

    listener = Listener()
    store.subscribe(listener)
    for t in range(4):
        store.append(rows([t, 100 + t]), first=np.full(2, t == 0))
    store.append(rows([9]), lanes=[1])
    store.extend(0, rows([10, 11]))
    assert seen == [([0], [0], [0]), ([1], [0], [100]), ([1], [1], [101]), ([0, 0], [1, 2], [1, 2])]
    store.unsubscribe(listener)
    store.extend(1, rows([12, 13]))
    assert len(seen) == 4  # no more notifications


@pytest.mark.parametrize(
    ("data", "kwargs", "error"),
    [
        (rows([1.0, np.nan]), {}, "finite"),
        ({"obs": np.zeros((2, 2)), "act": np.zeros(2, np.int64)}, {}, "missing"),
        (rows([1, 2]), {"lanes": [0, 0]}, r"lanes: expected distinct integers in \[0, 2\) .*, got \[0, 0\]"),
        (rows([1, 2]), {"lanes": [0, 2]}, r"lanes: expected distinct integers in \[0, 2\) .*, got \[0, 2\]"),
        (rows([1, 2]), {"first": [1, 0]}, "bool array"),
        (rows([1, 2, 3]), {}, r"expected shape \(2, 2\)"),
        ({**rows([1, 2]), "act": np.array([0.5, 1.0])}, {}, r"field 'act': expected dtype int64, got float64"),
        ({**rows([1, 2]), "extra": np.zeros(2)}, {}, r"unexpected \['extra'\]"),
    ],
)
def test_bad_append_writes_nothing(make_store, data, kwargs, error):
    store = make_store(capacity=3, lanes=2)
    store.append(rows([5, 6]), first=np.ones(2, bool))
    before = {k: v.copy() for k, v in store.state_dict().items()}
    with pytest.raises((SpecError, ValueError), match=error):
        store.append(data, **kwargs)
    for k, v in store.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


@pytest.mark.parametrize(("write", "lanes"), [
    (lambda s: s.append(rows([1, 2])), [0, 1]),  # no first= at all
    (lambda s: s.append(rows([1, 2]), first=np.array([True, False])), [1]),
    (lambda s: s.append(rows([1]), lanes=[1]), [1]),
    (lambda s: s.append(rows([1]), lanes=[1], first=np.array([False])), [1]),
    (lambda s: s.extend(0, rows([1, 2]), first=np.array([False, True])), [0]),
    (lambda s: s.extend(1, rows([1, 2])), [1]),
])
def test_a_lanes_first_row_must_start_an_episode(make_store, write, lanes):
    store = make_store(capacity=3, lanes=2)
    before = {k: v.copy() for k, v in store.state_dict().items()}
    with pytest.raises(ValueError, match=rf"first: lanes {re.escape(str(lanes))} hold no rows yet.*pass first=True"):
        write(store)
    for k, v in store.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    store.append(rows([1, 2]), first=np.ones(2, bool))  # marked: written, and later rows need no mark
    store.append(rows([3]), lanes=[1])
    store.extend(0, rows([4, 5]))
    assert store.count.tolist() == [3, 2] and store.episode_id[:, :2].tolist() == [[0, 0], [0, 0]]


def test_disk_backend_needs_empty_directory(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="empty directory"):
        StepStore(SPEC, 4, backend="disk", directory=tmp_path)
    with pytest.raises(ValueError, match="backend must be"):
        StepStore(SPEC, 4, backend="cloud")


@pytest.mark.parametrize("spec", [Field((2,), np.float32), (Field((), np.int64),)])
def test_a_spec_that_is_not_a_dict_is_refused_naming_what_to_give(spec):
    with pytest.raises(SpecError, match=r"spec: expected a dict of named specs .*got (Field|tuple)"):
        StepStore(spec, 4)


# A write is (lane or None for all lanes, number of rows, first-flags).
writes = st.lists(
    st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.integers(1, 4), st.lists(st.booleans(), min_size=4,
                                                                                   max_size=4)),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(writes=writes, capacity=st.integers(2, 6), lo=st.integers(0, 30), length=st.integers(1, 6))
def test_store_matches_reference(writes, capacity, lo, length):
    lanes = 3
    store = StepStore(SPEC, capacity, lanes)
    ref: list[list[tuple[int, int, int]]] = [[] for _ in range(lanes)]  # (value, episode, step)
    value = 0

    def push(lane, first):
        nonlocal value
        r = ref[lane]
        if not r or first:
            ep, step = (r[-1][1] + 1 if r else 0), 0
        else:
            ep, step = r[-1][1], r[-1][2] + 1
        r.append((value, ep, step))
        value += 1

    for lane, n, first in writes:
        if lane is None:
            for _ in range(n):
                f = np.array(first[:lanes]) | (store.count == 0)  # a lane's first row starts an episode
                store.append(rows(range(value, value + lanes)), first=f)
                for ln in range(lanes):
                    push(ln, f[ln])
        else:
            n = min(n, capacity)
            f = np.array(first[:n])
            f[0] |= store.count[lane] == 0
            store.extend(lane, rows(range(value, value + n)), first=f)
            for i in range(n):
                push(lane, f[i])
    for lane in range(lanes):
        r = ref[lane]
        alive = range(max(0, len(r) - capacity), len(r))
        assert store.count[lane] == len(r)
        if not alive:
            continue
        got = store.gather([lane] * len(alive), list(alive))
        assert got["act"].tolist() == [r[i][0] for i in alive]
        pos = np.array(alive) % capacity
        assert store.episode_id[lane, pos].tolist() == [r[i][1] for i in alive]
        assert store.episode_step[lane, pos].tolist() == [r[i][2] for i in alive]
        start = alive[0] + lo % len(alive)
        n = min(length, alive[-1] + 1 - start)
        data, mask = store.gather_windows([lane], [start], [n], max_length=length)
        expect = [i < n and r[start + i][1] == r[start][1] for i in range(length)]
        assert mask[0].tolist() == expect
        assert data["act"][0].tolist() == [r[start + i][0] if expect[i] else 0 for i in range(length)]


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from([(), (1,), (3,), (17,), (2, 3), (130,), (4, 84)]),
       dtype=st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_, np.float16, np.complex64,
                              np.dtype(">f4"), np.dtype(">i8")]),
       index_shape=st.sampled_from([(0,), (1,), (7,), (2, 5), (3, 4, 2)]), seed=st.integers(0, 2**16))
def test_take_column_equals_numpy_take(shape, dtype, index_shape, seed):
    """The compiled gather (small rows, copied as bytes) and np.take (large rows, scalars) give numpy's answer, any
    index shape and any dtype (half floats, complex, big-endian)."""
    rng = np.random.default_rng(seed)
    store = StepStore({"x": Field(shape, dtype)}, capacity=6, lanes=3)
    store.columns["x"][:] = (rng.random(store.columns["x"].shape) * 200).astype(dtype)
    idx = rng.integers(0, 18, index_shape)
    ref = store.columns["x"].reshape(18, *shape)[idx]
    got = store.take_column("x", idx)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    row_bytes = np.dtype(dtype).itemsize * int(np.prod(shape))
    assert ("x" in store._small_rows) == (len(shape) > 0 and row_bytes <= _SMALL_ROW)


@settings(max_examples=80, deadline=None)
@given(shape=st.sampled_from([(), (1,), (3,), (2, 3), (0,), (4, 84)]),
       dtype=st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_, np.float16, np.complex64,
                              np.dtype(">f4"), np.dtype(">i8")]),
       capacity=st.integers(2, 9), length=st.integers(0, 9), batch=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_take_windows_equals_a_plain_gather(shape, dtype, capacity, length, batch, seed):
    """StepStore.take_windows (what padded sequences and episodes are gathered with): each row where the
    ring holds it (wrapping at most once), zeros and a False mask from the item's valid length on, for any
    dtype, row shape, start and length."""
    from rlflow.replay.items import LANE, LENGTH, START, VALID

    rng = np.random.default_rng(seed)
    length = min(length, capacity)
    store = StepStore({"x": Field(shape, dtype), "y": Field((), np.int64)}, capacity=capacity, lanes=3)
    store.columns["x"][:] = (rng.random(store.columns["x"].shape) * 200).astype(dtype)
    store.columns["y"][:] = rng.integers(-9, 9, store.columns["y"].shape)
    meta = np.zeros((batch, 6), np.int64)
    meta[:, LANE] = rng.integers(0, 3, batch)
    meta[:, START] = rng.integers(0, 4 * capacity, batch)
    meta[:, VALID] = rng.integers(0, length + 1, batch)
    meta[:, LENGTH] = length
    data, mask = store.take_windows(meta)
    if not batch:
        return
    for name in ("x", "y"):
        col = store.columns[name]
        assert data[name].shape == (batch, length, *col.shape[2:]) and data[name].dtype == col.dtype
        for b in range(batch):
            lane, start, valid = meta[b, LANE], meta[b, START], meta[b, VALID]
            for i in range(length):
                expect = col[lane, (start + i) % capacity] if i < valid else np.zeros_like(col[0, 0])
                np.testing.assert_array_equal(data[name][b, i], expect)
                assert mask[b, i] == (i < valid)


def test_a_field_of_no_values_is_stored_and_gathered():
    store = StepStore({"x": Field((0,), np.float32), "y": Field((), np.int64)}, capacity=4, lanes=2)
    for v in range(5):
        store.append({"x": np.zeros((2, 0), np.float32), "y": np.array([v, 10 + v])}, first=np.full(2, v == 0))
    got = store.gather([0, 1], [4, 3])
    assert got["x"].shape == (2, 0) and got["y"].tolist() == [4, 13]
    data, mask = store.gather_windows([1], [2], [3])
    assert data["x"].shape == (1, 3, 0) and data["y"].tolist() == [[12, 13, 14]] and mask.all()


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_large_window_gathers_of_many_columns_equal_a_plain_gather(backend, tmp_path):
    """Gathers of at least _PREFETCH_ROWS rows first request every row of every column in one compiled
    call (a hint that must never change a result): windows across the ring's wrap, over columns of every
    kind (large and small rows, scalars, a field of no values), give the stored rows."""
    from rlflow.replay.items import LANE, LENGTH, START, VALID
    from rlflow.replay.storage import _PREFETCH_ROWS

    spec = {"obs": Field((3, 18), np.float32), "state": Field((54,), np.float32), "act": Field((3,), np.int64),
            "done": Field((), np.bool_), "none": Field((0,), np.uint8), "q": Field((2, 2), np.float64)}
    kw = {"backend": "disk", "directory": tmp_path / "s"} if backend == "disk" else {}
    store = StepStore(spec, capacity=40, lanes=3, **kw)
    rng = np.random.default_rng(7)
    for col in store.columns.values():
        col[:] = (rng.random(col.shape) * 100).astype(col.dtype)
    batch, length = 8, 30
    meta = np.zeros((batch, 6), np.int64)
    meta[:, LANE] = rng.integers(0, 3, batch)
    meta[:, START] = rng.integers(0, 160, batch)
    meta[0, START] = 25  # rows 25..54: across the wrap at 40
    meta[:, LENGTH] = meta[:, VALID] = length
    assert batch * length >= _PREFETCH_ROWS
    data, mask = store.take_windows(meta)
    assert mask.all()
    for name, col in store.columns.items():
        want = np.stack([col[meta[b, LANE], (meta[b, START] + np.arange(length)) % 40] for b in range(batch)])
        assert data[name].dtype == want.dtype
        np.testing.assert_array_equal(data[name], want, err_msg=name)


def test_the_ring_marks_check_what_they_are_handed():
    """The compiled ring cursors refuse a lane outside the store or flags of another length (IndexError /
    ValueError, nothing marked), and take read-only inputs: a store extended with a read-only ``first`` marks
    the episode it starts."""
    from rlflow import _core

    store = StepStore({"x": Field((), np.float32)}, capacity=4, lanes=2)
    rings = _core.StoreRings(written=store.count, episode_id=store.episode_id, episode_step=store.episode_step,
                             next_episode=np.zeros(2, np.int64), next_step=np.zeros(2, np.int64), reach=0)
    rows = np.zeros(2, np.int64)
    with pytest.raises(IndexError, match=r"lanes must be in \[0, 2\)"):
        rings.mark(np.array([0, 2]), np.zeros(0, bool), rows)
    with pytest.raises(ValueError, match="one flag per row"):
        rings.mark(np.array([0, 1]), np.zeros(3, bool), rows)
    with pytest.raises(IndexError, match="new rows >= 0"):
        rings.overwritten(np.array([1]), np.array([-1]), np.zeros((1, 3), np.int64))
    assert store.count.tolist() == [0, 0]
    first = np.broadcast_to(np.array([True, False, False]), (3,))  # read-only
    store.extend(1, {"x": np.arange(3, dtype=np.float32)}, first=first)
    assert store.count.tolist() == [0, 3] and store.episode_step[1, :3].tolist() == [0, 1, 2]


def test_strided_lanes_and_flags_write_whole_rows():
    """``append`` with lanes and ``first`` given as strided views writes and marks its rows as plain arrays do."""
    stores = [StepStore({"x": Field((), np.float32)}, capacity=4, lanes=4) for _ in range(2)]
    lanes, first = np.arange(4)[::2], np.ones((2, 2), bool)[:, 0]
    stores[0].append({"x": np.ones(2, np.float32)}, lanes=lanes, first=first)
    stores[1].append({"x": np.ones(2, np.float32)}, lanes=lanes.copy(), first=first.copy())
    for k, v in stores[1].state_dict().items():
        np.testing.assert_array_equal(stores[0].state_dict()[k], v, err_msg=k)
    assert stores[0].count.tolist() == [1, 0, 1, 0]
