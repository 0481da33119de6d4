"""Every index the compiled core's item, draw and gather calls take from Python is checked where it enters: a
bad one raises (IndexError for an index out of range, ValueError for a malformed array) and changes nothing,
never a read or write outside an array. These calls are reached through the tables and the store (whose own
tests cover their semantics); here they are handed bad input directly."""

import numpy as np
import pytest

from rlflow import _core
from rlflow.replay import StepStore
from rlflow.replay.items import KEY, LANE, START, TIMES, Items, RowRecords
from rlflow.specs import Field


def _store(lanes=2, capacity=4, rows=3):
    store = StepStore({"x": Field((3,), np.float32)}, capacity=capacity, lanes=lanes)
    for lane in range(lanes):
        x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        store.extend(lane, {"x": x}, first=[True] + [False] * (rows - 1))
    return store


def _items(lanes=2, capacity=4, slots=6):
    items = Items(slots, lanes, capacity, {})
    lanes_arr, starts = np.array([0, 1, 0]), np.array([0, 1, 2])
    one = np.ones(3, np.int64)
    items.add(lanes_arr, starts, one, one, np.ones(3), {})
    return items


def _state(items):
    return [a.copy() for a in (items.meta, items.priority, items.row_slot, items.free)]


def _unchanged(items, before):
    return all(np.array_equal(a, b) for a, b in zip(_state(items), before, strict=True))


def test_item_slots_refuse_bad_slots_lanes_and_counts_changing_nothing():
    items = _items()
    before = _state(items)
    core = items.core
    with pytest.raises(IndexError, match="slot 6"):
        core.remove(items.num_free, np.array([0, 6]))
    free_slot = int(items.free[0])
    with pytest.raises(ValueError, match="holds no item"):
        core.remove(items.num_free, np.array([items.free[items.num_free - 1], free_slot]))
    live = np.flatnonzero(items.meta[:, KEY] >= 0)
    with pytest.raises(ValueError, match="given twice"):
        core.remove(items.num_free, np.array([live[0], live[1], live[0]]))
    with pytest.raises(IndexError, match="lane 2"):
        core.indexed(2, 0, 4)
    with pytest.raises(IndexError, match="expected 0 <= lo <= hi"):
        core.indexed(0, 3, 1)
    with pytest.raises(IndexError, match="lane -1"):
        core.place(items.num_free, items.next_seq, np.array([-1]), np.array([0]), np.ones(1, np.int64),
                   np.ones(1, np.int64), np.ones(1))
    with pytest.raises(IndexError, match="free slots"):
        core.place(0, items.next_seq, np.array([0]), np.array([0]), np.ones(1, np.int64), np.ones(1, np.int64),
                   np.ones(1))
    with pytest.raises(ValueError, match="expected 2 entries"):
        core.place(items.num_free, items.next_seq, np.array([0, 1]), np.array([0]), np.ones(2, np.int64),
                   np.ones(2, np.int64), np.ones(2))
    assert _unchanged(items, before)


def test_item_slots_read_strided_and_safely_cast_inputs_as_plain_ones():
    a, b = _items(), _items()
    keys = np.flatnonzero(a.meta[:, KEY] >= 0)  # keys of the first inserts are their slots
    got = a.core.set_priorities(np.repeat(a.meta[keys, KEY], 2)[::2], np.array([5, 6, 7], np.int32))
    want = b.core.set_priorities(b.meta[keys, KEY].copy(), np.array([5.0, 6.0, 7.0]))
    assert [x.tolist() for x in got] == [x.tolist() for x in want]
    with pytest.raises(TypeError):  # float keys: numpy refuses the unsafe cast
        a.core.set_priorities(np.array([0.5]), np.array([1.0]))


def test_row_slots_and_draws_refuse_bad_slots():
    store = _store()
    records = RowRecords(store.num_lanes, store.capacity, {})
    before = records.meta.copy()
    n = 2
    slots, rows, probs = np.empty(n, np.int64), np.empty((n, records.meta.shape[1]), np.int64), np.empty(n)
    with pytest.raises(IndexError, match="slot 8"):
        records.core.draw_live(np.full(n, 0.5), np.array([0, 8]), 0, slots, rows, probs)
    with pytest.raises(IndexError, match="lane 5"):
        records.core.evict(5, 0, 2)
    with pytest.raises(ValueError, match="rows: expected 16 entries"):
        records.core.draw_stored(store.rings(), np.full(4, 0.5), 0, 1, 0, slots, rows[:, :3].copy(), probs)
    other = _store(lanes=3)
    with pytest.raises(ValueError, match="not the table's store's"):
        records.core.place(other.rings(), False, 0, np.array([0]), np.array([0]), np.array([1]))
    bad, fault, _, _ = records.core.place(store.rings(), False, 0, np.array([0, 7]), np.array([0, 0]),
                                          np.array([1, 1]))
    assert (bad, fault) == (1, _core.PlaceFault.WINDOW)
    assert np.array_equal(records.meta, before)
    with pytest.raises(IndexError, match="slot -1"):
        _core.draw_rows(records.meta, np.array([0, -1]))
    assert np.array_equal(records.meta, before)  # the first draw was not counted either
    assert records.meta[0, TIMES] == 0


@pytest.mark.parametrize("bad", [-0.25, 1.0, np.nan])
def test_draws_refuse_uniforms_outside_zero_one(bad):
    """A uniform outside [0, 1) (NaN too) would pick outside the rows, slots or set it draws from."""
    store = _store()
    records = RowRecords(store.num_lanes, store.capacity, {})
    n = 2
    slots, rows, probs = np.empty(n, np.int64), np.empty((n, records.meta.shape[1]), np.int64), np.empty(n)
    u = np.array([0.5, bad])
    with pytest.raises(ValueError, match=r"uniforms: expected values in \[0, 1\)"):
        records.core.draw_live(u, np.array([0, 1]), 0, slots, rows, probs)
    with pytest.raises(ValueError, match=r"uniforms: expected values in \[0, 1\)"):
        records.core.draw_stored(store.rings(), u, 0, 1, 0, slots, rows, probs)
    items, where, live = np.zeros(4, np.int64), np.full(4, -1, np.int64), np.zeros(4, bool)
    _core.dense_insert(items, where, live, 0, np.array([1, 2]))
    with pytest.raises(ValueError, match=r"uniforms: expected values in \[0, 1\)"):
        _core.uniform_pick(np.array([0.5, 0.5, 0.5, bad]), items, where, live, 2)


def test_frame_stacks_refuse_more_frames_than_a_lane_holds():
    """A frame count whose output size would overflow (or that no lane can hold) is refused before any copy."""
    store = _store()
    column = np.zeros((8, 12), np.uint8)
    for frames in (2**62, store.capacity + 1, 0):
        with pytest.raises(ValueError, match="1 <= frames <= capacity"):
            _core.take_stacks(store.rings(), column, np.array([[0, 1], [2, 3]]), frames, False, np.empty(0, np.uint8))


def test_value_checks_take_unaligned_arrays():
    """Spec validation of an array that is C-contiguous but not aligned (a view into a byte buffer) checks it
    as any other."""
    from rlflow import specs

    raw = np.zeros(8 * 4 + 1, np.uint8)
    unaligned = raw[1:].view(np.float64)  # 4 float64 values starting one byte into the buffer
    assert not unaligned.flags.aligned
    assert _core.values_pass(unaligned, _core.ValueCheck.FINITE)
    unaligned[2] = np.inf
    assert not _core.values_pass(unaligned, _core.ValueCheck.FINITE)
    field = Field((4,), np.float64)
    with pytest.raises(specs.SpecError, match="finite"):
        specs.validate({"x": field}, {"x": unaligned[None]}, (1,))


def test_gathers_refuse_rows_outside_the_column():
    store = _store()
    column = np.zeros((8, 12), np.uint8)
    out = np.empty(2 * 12, np.uint8)
    with pytest.raises(IndexError, match="row index 8"):
        _core.take_rows(column, np.array([0, 8]), out)
    with pytest.raises(IndexError, match="row index -1"):
        _core.prefetch_rows([column], np.array([-1]))
    with pytest.raises(IndexError, match="row index 9"):
        _core.take_stacks(store.rings(), column, np.array([[0, 9]]), 2, False, np.empty(2 * 2 * 12, np.uint8))
    with pytest.raises(ValueError, match="expected 24 entries"):
        _core.take_rows(column, np.array([0, 1]), np.empty(23, np.uint8))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        _core.window_index(np.zeros((1, 8), np.int64), 0)
    with pytest.raises(ValueError, match="at least 6 columns"):
        _core.window_ends(np.zeros((1, 5), np.int64), 4)


def test_window_checks_name_each_kind_of_bad_window():
    store = _store(lanes=2, capacity=4, rows=3)  # each lane holds rows 0, 1, 2 of one episode
    lanes = np.array([0, 2, -1, 0, 0, 1, 0])
    starts = np.array([0, 0, 0, -1, 2, 0, 0])
    lengths = np.array([3, 1, 1, 1, 2, 5, 0])
    bad, valid = store.rings().check_windows(lanes, starts, lengths, False)
    assert bad == 1 and valid.tolist() == [3, 0, 0, 0, 0, 0, 0]


def test_dense_set_refuses_slots_outside_it_and_counts_outside_its_capacity():
    items, where, live = np.zeros(4, np.int64), np.full(4, -1, np.int64), np.zeros(4, bool)
    assert _core.dense_insert(items, where, live, 0, np.array([3, 1, 3])) == 2
    with pytest.raises(IndexError, match="slot 4"):
        _core.dense_insert(items, where, live, 2, np.array([0, 4]))
    with pytest.raises(IndexError, match="count 5"):
        _core.dense_delete(items, where, live, 5, np.array([0]))
    with pytest.raises(ValueError, match="holds no slot"):
        _core.uniform_pick(np.full(2, 0.5), items, where, live, 0)
    assert items[:2].tolist() == [3, 1] and where.tolist() == [-1, 1, -1, 0] and live.tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("values, check, low, high, passes", [
    (np.array([1.0, 2.0], np.float32), _core.ValueCheck.FINITE, 0, 0, True),
    (np.array([1.0, np.inf], np.float64), _core.ValueCheck.FINITE, 0, 0, False),
    (np.array([[0, 3], [2, 1]], np.int8), _core.ValueCheck.BOUNDS, 0, 3, True),
    (np.array([0, 4], np.uint16), _core.ValueCheck.BOUNDS, 0, 3, False),
    (np.array([-1], np.int64), _core.ValueCheck.BOUNDS, 0, 3, False),
])
def test_value_checks_of_whole_arrays(values, check, low, high, passes):
    assert _core.values_pass(values, check, low, high) is passes


def test_value_checks_refuse_what_they_cannot_read():
    with pytest.raises(ValueError, match="native float32/float64"):
        _core.values_pass(np.zeros(2, np.float16), _core.ValueCheck.FINITE)
    with pytest.raises(ValueError, match="native"):
        _core.values_pass(np.zeros(2, ">f4"), _core.ValueCheck.FINITE)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.values_pass(np.zeros(4, np.float32)[::2], _core.ValueCheck.FINITE)


def test_records_keep_the_core_layout():
    """The record columns Python names are the core's, in the order checkpoints store them (``meta[:, :6]``)."""
    assert (KEY, LANE, START, TIMES) == (0, 1, 2, 5)
