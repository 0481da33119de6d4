"""RowTable: items kept in their start rows' slots, drawn uniformly (its adders' items are also checked
against the reference in test_adders.py)."""

import numpy as np
import pytest
from adder_reference import ACT as REF_ACT
from adder_reference import OBS as REF_OBS
from adder_reference import SPEC as REF_SPEC
from adder_reference import Stream, alive, nstep_items
from checkpointed_parts import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st
from id_rows import ITEM, SPEC, check_sample_data, write

from rlflow import adders, specs
from rlflow.replay import (
    CheckpointError,
    Fifo,
    MinSize,
    RateLimitTimeout,
    RowTable,
    SampleToInsertRatio,
    StepStore,
    Table,
    Uniform,
    load,
    save,
)
from rlflow.specs import SpecError
from rlflow.types import TimeStep, step_spec

OBS = specs.Field((2,), np.float32)
ACT = specs.Field((), np.int64, low=0, high=3)


def snapshot(table):
    lim = table.rate_limiter.state_dict()
    return {**table.items(), "size": table.size, "limiter": (lim["inserts"], lim["samples"], lim["deletes"]),
            "rng": str(table.role_states()["sampler"]["rng"])}


def by_row(items):
    """A table's items keyed by (lane, start), without keys and priorities (which differ by design)."""
    order = np.lexsort((items["start"], items["lane"]))
    return {k: v[order] for k, v in items.items() if k not in ("key", "priority")}


def drive(adder, events, lanes, rng_seed):
    """Feed ``events`` (per step, per lane: 'go', 'term' or 'trunc') through ``adder`` via add or stage."""
    rng = np.random.default_rng(rng_seed)
    z, one = np.zeros(lanes, bool), np.ones(lanes, bool)
    obs = rng.random((lanes, 2), np.float32)
    adder.add_first(TimeStep(obs, np.zeros(lanes, np.float32), z, z, one, z))
    for step, (ev, staged) in enumerate(events):
        ev = np.asarray(ev)
        term, trunc = ev == 1, ev == 2
        done = term | trunc
        nxt = (rng.random((lanes, 2)) + step).astype(np.float32)
        final = nxt + 0.5 if done.any() else None  # the next episode's first observation differs from the final one
        ts = TimeStep(nxt, rng.normal(size=lanes).astype(np.float32), term, trunc, done, done,
                      final_observation=final)
        (adder.stage if staged else adder.add)(rng.integers(0, 3, lanes), ts)
    adder.flush()


# ---------------------------------------------------------------------------------------------- against the reference
G = 0.9


@settings(max_examples=60, deadline=None)
@given(
    lanes=st.integers(1, 3), slack=st.integers(1, 10), n=st.integers(1, 4), same_step=st.booleans(),
    extras=st.booleans(), seed=st.integers(0, 2**16),
    steps=st.lists(st.tuples(st.lists(st.sampled_from(["mid"] * 4 + ["term", "trunc"]), min_size=3, max_size=3),
                             st.booleans()), max_size=60),
)
def test_holds_the_reference_items_and_draws_their_rows(lanes, slack, n, same_step, extras, seed, steps):
    """N-step transitions through add and stage (with extras and without), episodes ending by termination
    and truncation, the rings wrapping: the table holds exactly the reference's live items (windows,
    returns, discounts), counts every item made as an insert and every one gone as a delete, and each draw
    is a live item, at probability ``1 / size``, showing its rows."""
    capacity = n + 1 + slack
    store = StepStore(REF_SPEC if extras else step_spec(REF_OBS, REF_ACT), capacity=capacity, lanes=lanes)
    table = RowTable(store, seed=seed)
    adder = adders.NStepTransition(store, [table], n=n, discount=G, stage_steps=5)
    stream = Stream(lanes, np.random.default_rng(seed), same_step)
    adder.add_first(stream.reset())
    for events, staged in steps:
        actions, ts, ex = stream.step(events[:lanes])
        (adder.stage if staged else adder.add)(actions, ts, ex if extras else None)
    adder.flush()
    made = {(e, s): item for e, lane in enumerate(stream.lanes) for s, item in nstep_items(lane, n, G).items()}
    want = {key: item for key, item in made.items() if alive(stream.lanes[key[0]], key[1], capacity)}
    items = table.items()
    got = {(int(e), int(s)): i for i, (e, s) in enumerate(zip(items["lane"], items["start"], strict=True))}
    assert set(got) == set(want)
    for key, i in got.items():
        length, ret, disc = want[key]
        assert items["length"][i] == length
        np.testing.assert_allclose(items["field/return"][i], ret, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(items["field/discount"][i], disc, rtol=1e-6)
    lim = table.rate_limiter
    assert (lim.inserts, lim.deletes, table.size) == (len(made), len(made) - len(want), len(want))
    if want:
        sample = table.sample(16)
        assert np.all(sample.probabilities == 1 / len(want)) and np.all(sample.weights == 1)
        for i, (e, s) in enumerate(zip(sample.lanes.tolist(), sample.starts.tolist(), strict=True)):
            length, ret, disc = want[(e, s)]
            rows = stream.lanes[e].rows
            assert sample.keys[i] == items["key"][got[(e, s)]]
            assert tuple(sample.data.observation[i]) == rows[s].obs
            assert tuple(sample.data.next_observation[i]) == rows[s + length - 1].obs
            assert sample.data.action[i] == rows[s].action
            np.testing.assert_allclose(sample.data.reward[i], ret, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(sample.data.discount[i], disc, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- draws
def fits(counts, expected):
    """Pearson's chi-square of ``counts`` against ``expected`` below its 1-in-10^4 quantile (normal approximation)."""
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = counts.size - 1
    return chi2 < dof + 5 * np.sqrt(2 * dof)


def filled(capacity=10, lanes=3, every=1, seed=0, **kw):
    """A store with full rings and an item of length 2 at every ``every``-th row of each lane."""
    store = StepStore(SPEC, capacity=capacity, lanes=lanes)
    table = RowTable(store, seed=seed, **kw)
    for _ in range(capacity + 3):
        write(store)
    for lane in range(lanes):
        starts = np.arange(3, capacity + 2, every)
        table.insert(np.full(starts.size, lane), starts, 2)
    return store, table


@pytest.mark.parametrize(("every", "capacity", "batch"), [
    (1, 12, None), (2, 12, None),  # most rows start an item; half: redraws
    (6, 12, None),  # fewer than a quarter, few items per draw: a list of the live slots
    (6, 60, 2),  # fewer than a quarter, many items per draw: redraws
])
def test_each_draw_is_uniform_over_the_live_items(every, capacity, batch):
    _, table = filled(every=every, lanes=3, capacity=capacity)
    table.delete(table.items()["key"][::3])
    live = table.items()
    n = live["key"].size
    draws = 60 * n
    parts = [table.sample(batch or draws) for _ in range(draws // (batch or draws))]
    for s in parts:
        check_sample_data(s)
        assert np.all(s.probabilities == 1 / n) and np.all(s.weights == 1)
    keys = np.concatenate([s.keys for s in parts])
    counts = np.array([(keys == k).sum() for k in live["key"]])
    assert counts.sum() == draws  # every draw is a live item
    assert fits(counts, np.full(n, draws / n))


def test_uneven_lanes_are_drawn_uniformly():
    store = StepStore(SPEC, capacity=20, lanes=3)
    table = RowTable(store, seed=3)
    for lane, rows in ((0, 20), (1, 3), (2, 9)):
        for _ in range(rows):
            write(store, lanes=[lane])
        table.insert(np.full(rows - 1, lane), np.arange(rows - 1), 2)
    s = table.sample(30 * table.size)
    counts = np.bincount(s.lanes, minlength=3)
    assert fits(counts, np.array([19, 2, 8]) / 29 * counts.sum())


def test_max_times_sampled_retires_at_the_draw_that_reaches_it():
    _, table = filled(capacity=4, lanes=1, max_times_sampled=2)
    assert table.size == 3
    s = table.sample(6)  # three items, two draws each: the batch must take every item exactly twice
    assert sorted(np.bincount(s.starts).tolist()) == [0, 0, 0, 2, 2, 2]
    assert table.size == 0 and table.rate_limiter.deletes == 3
    assert not table.can_sample(1)


def test_max_times_sampled_never_oversamples():
    _, table = filled(capacity=16, lanes=2, max_times_sampled=3, seed=5)
    seen: dict[int, int] = {}
    while table.can_sample(4):
        s = table.sample(4)
        for k, times in zip(s.keys.tolist(), s.times_sampled.tolist(), strict=True):
            seen[k] = seen.get(k, 0) + 1
            assert times == seen[k] <= 3
    assert sum(seen.values()) == table.rate_limiter.samples


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_inserts_change_nothing():
    _, table = filled(capacity=8, lanes=2, every=2)
    before = snapshot(table)
    cases = [
        ({"lanes": [0], "starts": [5], "lengths": [2]}, ValueError, "already starts an item"),
        ({"lanes": [0, 1, 0], "starts": [4, 4, 4], "lengths": [2, 2, 1]}, ValueError, "earlier item of this insert"),
        ({"lanes": [0], "starts": [0], "lengths": [2]}, ValueError, "not stored"),
        ({"lanes": [2], "starts": [6], "lengths": [1]}, ValueError, "lanes"),
        ({"lanes": [0], "starts": [6], "lengths": [1], "priorities": [-1.0]}, ValueError, "priorities"),
        ({"lanes": [0], "starts": [6], "lengths": [1], "fields": {"x": [1]}}, SpecError, "no item_spec"),
    ]
    for kwargs, error, words in cases:
        with pytest.raises(error, match=words):
            table.insert(**kwargs)
        assert_same(before, snapshot(table))


def _staged_adder(limiter=None, n=1):
    """Three lanes staged 8 steps a block into a RowTable."""
    store = StepStore(step_spec(OBS, ACT), capacity=40, lanes=3)
    table = RowTable(store, seed=0, **({} if limiter is None else {"rate_limiter": limiter}))
    return store, table, adders.NStepTransition(store, [table], n=n, discount=0.9, stage_steps=8)


@pytest.mark.parametrize("blocks", [1, 6])
def test_a_block_meeting_a_taken_start_row_places_none_of_its_items(blocks):
    """A block flush inserts its items in one call; an item whose start row holds one inserted by hand makes
    the table refuse the call: none of the block's items is placed (also none in the slots the block emptied
    by overwriting their rows), the rows stay written and their old items gone, the hand-made item stays."""
    store, table, adder = _staged_adder()  # 40 rows a lane, blocks of 8 steps
    drive(adder, [([0, 0, 0], True)] * (8 * blocks), 3, 5)  # items start at every row but the open one
    rows = 8 * blocks + 1
    assert table.size == 3 * (rows - 1) - 3 * max(0, rows - 40)
    # Lane 1's open row, where the next block's first item of lane 1 starts.
    table.insert([1], [rows - 1], [1], fields={"return": [0.0], "discount": [1.0]})
    rng = np.random.default_rng(0)
    z = np.zeros(3, bool)
    for step in range(8):
        ts = TimeStep(rng.random((3, 2), np.float32), np.ones(3, np.float32), z, z, z, z)
        if step < 7:
            adder.stage(np.zeros(3, np.int64), ts)
        else:
            with pytest.raises(ValueError, match=f"row {rows - 1} of lane 1 already starts an item"):
                adder.stage(np.zeros(3, np.int64), ts)
    assert store.count.tolist() == [rows + 8] * 3  # the block's rows are written
    items = by_row(table.items())
    oldest = max(0, rows + 8 - 40)  # items starting at overwritten rows are gone
    want = sorted([(lane, r) for lane in range(3) for r in range(oldest, rows - 1)] + [(1, rows - 1)])
    assert sorted(zip(items["lane"].tolist(), items["start"].tolist(), strict=True)) == want
    assert table.size == len(want) and table.rate_limiter.inserts - table.rate_limiter.deletes == len(want)


def test_a_block_the_rate_limiter_admits_is_placed_whole():
    """A limiter that admits the block's items (20) but not the most a block could make (n * lanes * steps =
    72): the flush's one insert is admitted whole, and the table ends as one fed step by step does."""
    made = []
    for staged in (True, False):
        _, table, adder = _staged_adder(SampleToInsertRatio(1.0, 1, (-100.0, 60.0)), n=3)
        assert not table.rate_limiter.can_insert(3 * 3 * 8) and table.rate_limiter.can_insert(3 * 8)
        drive(adder, [([0, 1, 0], staged)] * 8, 3, 9)
        made.append(table)
    assert_same(by_row(made[0].items()), by_row(made[1].items()))
    assert made[0].size == made[1].size == 2 * 6 + 8 and made[0].rate_limiter.inserts == made[1].rate_limiter.inserts


def test_a_block_the_rate_limiter_holds_back_goes_through_the_table_insert_as_samples_free_it():
    """A limiter that admits 5 inserts ahead of the samples: a flush of 24 items is admitted in parts as a
    sampler thread samples; the table then holds what a table without a limiter holds, and every insert
    was admitted."""
    import threading

    held = []
    for limiter in (SampleToInsertRatio(1.0, 1, (-100.0, 5.0)), None):
        store, table, adder = _staged_adder(limiter)
        stop = threading.Event()
        ahead = [0]  # the most inserts ahead of the samples the sampler saw

        def sample(table=table, stop=stop, store=store, ahead=ahead):
            while not stop.is_set():
                with store.lock:
                    ahead[0] = max(ahead[0], table.rate_limiter.inserts - table.rate_limiter.samples)
                try:
                    table.sample(1, timeout=0.05)
                except RateLimitTimeout:
                    pass

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            drive(adder, [([0, 0, 0], True)] * 8, 3, 4)
        finally:
            stop.set()
            sampler.join(10)
        lim = table.rate_limiter
        assert lim.inserts == table.size == 24 and lim.deletes == 0
        if limiter is not None:  # never more than 5 inserts ahead of the samples
            assert ahead[0] <= 5 and lim.inserts - lim.samples <= 5
        held.append(by_row({k: v for k, v in table.items().items() if k != "times_sampled"}))
    for items in held:  # an n-step item (n = 1: two rows) at each of the 8 steps' first rows of each lane
        assert items["lane"].tolist() == [lane for lane in range(3) for _ in range(8)]
        assert items["start"].tolist() == list(range(8)) * 3 and np.all(items["length"] == 2)
    assert_same(*held)


def test_a_subclass_of_row_table_gets_its_own_overwrite_and_insert_called():
    """A subclass of RowTable may change what an overwrite or an insert does: the store and adders call the
    table's methods for it (here: counting every dropped row)."""
    class Counting(RowTable):
        dropped = 0

        def on_overwrite_range(self, lane, lo, hi):
            Counting.dropped += hi - lo
            super().on_overwrite_range(lane, lo, hi)

    store = StepStore(step_spec(OBS, ACT), capacity=12, lanes=3)
    table = Counting(store, seed=0)
    adder = adders.NStepTransition(store, [table], n=1, discount=0.9, stage_steps=4)
    drive(adder, [([0, 0, 0], True)] * 20, 3, 1)
    assert Counting.dropped == 3 * (21 - 12) and table.size == 3 * 11


def test_an_insert_let_in_by_parts_refuses_shared_rows_before_any_part():
    """A limiter admitting two inserts ahead of the samples: a call sharing a start row is refused whole
    before any part goes in; a call without one places the parts admitted before its timeout (as a Table
    does) and raises."""
    store = StepStore(SPEC, capacity=8)
    table = RowTable(store, rate_limiter=SampleToInsertRatio(1.0, 1, (-2.0, 2.0)))
    for _ in range(8):
        write(store)
    before = snapshot(table)
    with pytest.raises(ValueError, match="earlier item of this insert"):
        table.insert([0] * 5, [0, 1, 2, 3, 2], 1, timeout=0.01)
    assert_same(before, snapshot(table))
    with pytest.raises(RateLimitTimeout):
        table.insert([0] * 5, [0, 1, 2, 3, 4], 1, timeout=0.01)
    assert table.size == table.rate_limiter.inserts == 2  # the parts the limiter let in stay
    assert table.items()["start"].tolist() == [0, 1]
    check_sample_data(table.sample(2))


def test_priorities_are_checked_and_change_nothing():
    _, table = filled(capacity=6, lanes=1, seed=2)
    keys = table.items()["key"]
    assert table.update_priorities([keys[0], keys[0], keys[1] + 999], [5.0, 6.0, 1.0]) == 2
    with pytest.raises(ValueError, match="priorities"):
        table.update_priorities(keys[:1], [np.nan])
    twin = filled(capacity=6, lanes=1, seed=2)[1]
    np.testing.assert_array_equal(table.sample(50).keys, twin.sample(50).keys)


def test_overwrites_empty_the_slots_and_count_deletes():
    store = StepStore(SPEC, capacity=4, lanes=2)
    table = RowTable(store, seed=0)
    for _ in range(4):
        write(store)
    table.insert([0, 0, 1], [0, 2, 1], [2, 2, 3])
    write(store, lanes=[0])
    assert table.items()["start"].tolist() == [2, 1] and table.rate_limiter.deletes == 1
    write(store, lanes=[0, 1])  # lane 0 row 1 (no item), lane 1 row 0 (none)
    assert table.size == 2
    write(store, lanes=[1])  # lane 1 row 1
    assert table.items()["lane"].tolist() == [0] and table.rate_limiter.deletes == 2
    store.extend(0, {"id": np.zeros(3, np.int64), "obs": np.zeros((3, 2), np.float32)})
    assert table.size == 0 and table.rate_limiter.deletes == 3


# ---------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip_continues_the_same_draws(tmp_path):
    store, table = filled(capacity=9, lanes=2, every=1, seed=4, item_spec=None, max_times_sampled=5)
    table.sample(7)
    save(tmp_path / "c", store, [table])
    saved = snapshot(table)
    expect = [table.sample(5).keys for _ in range(3)]
    store2 = StepStore(SPEC, capacity=9, lanes=2)
    table2 = RowTable(store2, seed=4, max_times_sampled=5)
    load(tmp_path / "c", store2, [table2])
    assert_same(snapshot(table2), saved)
    for want in expect:
        np.testing.assert_array_equal(table2.sample(5).keys, want)
    for s in (store, store2):  # evictions and inserts go on alike from the restored slots
        write(s)
    table.insert([1], [12], 1)
    table2.insert([1], [12], 1)
    assert_same(snapshot(table2), snapshot(table))


def test_a_checkpoint_of_another_table_kind_or_moved_items_is_refused(tmp_path):
    store = StepStore(SPEC, capacity=6)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    for _ in range(6):
        write(store)
    table.insert([0, 0], [1, 3], 2)
    save(tmp_path / "t", store, [table])
    row_store, row_table = filled(capacity=6, lanes=1)
    before = snapshot(row_table)
    with pytest.raises(CheckpointError, match="configuration"):
        load(tmp_path / "t", row_store, [row_table])
    assert_same(before, snapshot(row_table))
    save(tmp_path / "r", row_store, [row_table])
    with np.load(tmp_path / "r") as z:
        arrays = dict(z)
    arrays["table/0/slot"] = np.roll(arrays["table/0/slot"], 1)  # items in other rows' slots
    arrays["table/0/meta"][:, 0] = arrays["table/0/meta"][:, 0] // 6 * 6 + arrays["table/0/slot"]
    with open(tmp_path / "bad", "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(CheckpointError, match="impossible"):
        load(tmp_path / "bad", row_store, [row_table])
    assert_same(before, snapshot(row_table))


def test_min_size_gates_sampling():
    store = StepStore(SPEC, capacity=6)
    table = RowTable(store, rate_limiter=MinSize(3))
    for _ in range(6):
        write(store)
    table.insert([0, 0], [0, 1], 1)
    assert not table.can_sample(1)
    with pytest.raises(RateLimitTimeout):
        table.sample(1, timeout=0.01)
    table.insert([0], [2], 1)
    assert table.sample(4).keys.size == 4




def test_a_restored_emptier_store_is_drawn_from_as_a_fresh_one(tmp_path):
    """A table whose rings were full, restored to a checkpoint of fewer rows, draws as a fresh table
    restored from it (it counts the store's rows again)."""
    store, table = StepStore(SPEC, capacity=10, lanes=2), None
    table = RowTable(store, seed=9)
    for _ in range(3):
        write(store)
    table.insert([0, 0, 1, 1], [0, 1, 0, 1], 2)
    save(tmp_path / "early", store, [table])
    for _ in range(12):
        write(store)
    table.insert([0, 1], [13, 13], 2)
    table.sample(4)  # draws from full rings
    fresh_store = StepStore(SPEC, capacity=10, lanes=2)
    fresh = RowTable(fresh_store, seed=9)
    for s, t in ((store, table), (fresh_store, fresh)):
        load(tmp_path / "early", s, [t])
    np.testing.assert_array_equal(table.sample(32).keys, fresh.sample(32).keys)


def test_writers_and_samplers_in_threads():
    """Four writers (a lane each, wrapping many times, an item per new row) and three samplers: every sample
    shows the rows its items name, and the counters add up afterwards."""
    import threading

    store = StepStore(SPEC, capacity=16, lanes=4)
    table = RowTable(store, seed=3, max_times_sampled=4, rate_limiter=SampleToInsertRatio(1.0, 8, (-4.0, 12.0)))
    errors: list[str] = []
    drawn = [0]
    done = threading.Event()
    gate = threading.Barrier(7)

    def writer(lane):
        try:
            gate.wait()
            for r in range(300):
                write(store, lanes=[lane], first=np.array([r % 37 == 0]))
                if r % 37 != 0:  # an item of two rows, unless its second row starts an episode
                    table.insert([lane], [r - 1], [2], timeout=10)
        except Exception as e:
            errors.append(f"writer {lane}: {type(e).__name__}: {e}")

    def sampler():
        try:
            gate.wait()
            for _ in range(100_000):  # a bound, never reached: the loop ends when the writers are done
                if done.is_set() and not table.can_sample(1):
                    break
                batch = 1 if done.is_set() else 2  # drain the limiter exactly at the end
                try:  # another sampler may take what this one waits for: waits are short and retried
                    s = table.sample(batch, timeout=0.2)
                except RateLimitTimeout:
                    continue
                check_sample_data(s)
                with lock:
                    drawn[0] += batch
        except Exception as e:
            errors.append(f"sampler: {type(e).__name__}: {e}")

    lock = threading.Lock()
    writers = [threading.Thread(target=writer, args=(lane,)) for lane in range(4)]
    samplers = [threading.Thread(target=sampler) for _ in range(3)]
    for t in writers + samplers:
        t.start()
    for t in writers:
        t.join(60)
    done.set()
    for t in samplers:
        t.join(60)
    assert not errors, errors
    lim = table.rate_limiter
    items = table.items()
    assert lim.inserts == 4 * sum(1 for r in range(300) if r % 37) and lim.samples == drawn[0]
    assert lim.inserts - lim.deletes == table.size == items["key"].size
    assert np.all(items["times_sampled"] < 4)


def test_each_record_is_one_cache_line(tmp_path):
    """docs/tables.md: records start on a 64-byte boundary, in both kinds of table and after a restore."""
    for kind in (RowTable, Table):
        store = StepStore(SPEC, capacity=5000, lanes=3)  # records past malloc's small sizes
        table = kind(store)
        for _ in range(4):
            write(store)
        table.insert([0, 1], [1, 2], [2, 2])
        save(tmp_path / kind.__name__, store, [table])
        load(tmp_path / kind.__name__, store, [table])
        meta = table._items.meta
        assert meta.ctypes.data % 64 == 0 and meta.strides == (64, 8) and table.size == 2


def test_memory_per_row_is_what_the_docs_say():
    """docs/tables.md: a RowTable takes 64 bytes a store row; a Table 80 a slot plus 9 a row, then its selectors."""
    store = StepStore(SPEC, capacity=50, lanes=3)
    rows = RowTable(store)._items
    assert sum(a.nbytes for a in vars(rows).values() if isinstance(a, np.ndarray)) == 64 * 150
    items = Table(store)._items
    slots = items.meta.nbytes + items.priority.nbytes + items.free.nbytes
    index = items.row_slot.nbytes + items.has_overflow.nbytes
    assert (slots, index) == (80 * 150, 9 * 150)
    assert sum(a.nbytes for a in vars(items).values() if isinstance(a, np.ndarray)) == slots + index


def test_a_window_crossing_an_episode_start_is_masked_there():
    store = StepStore(SPEC, capacity=8, lanes=2)
    table = RowTable(store, seed=1, item_spec=ITEM)
    for t in range(4):
        write(store, first=np.array([t == 2, False]))
    keys = table.insert([0, 1], [1, 0], [3, 3], fields={"ret": [1.5, 2.5]})
    s = table.sample(64)
    check_sample_data(s)
    assert table.items()["valid"].tolist() == [1, 3]  # lane 0's window [1, 4) meets an episode start at row 2
    assert s.mask[s.keys == keys[0]][0].tolist() == [True, False, False]
    assert s.fields["ret"].tolist() == [{int(keys[0]): 1.5, int(keys[1]): 2.5}[k] for k in s.keys.tolist()]
