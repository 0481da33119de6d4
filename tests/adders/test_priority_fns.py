"""Adders' ``priority_fns``: each table's function sees the batch of every call's new items and sets their priorities.

Every test drives a random episode stream (tests/adder_reference.py) and checks, item by item, that each
table's priorities are what its function gives for that item, recomputed from the stored rows, and that
each function is called once per call that makes items, with exactly those items.
"""

from __future__ import annotations

import numpy as np
import pytest
from adder_reference import SPEC, Stream, alive, nstep_items, sequence_items
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow import adders, specs
from rlflow.replay import Fifo, Prioritized, StepStore, Table, Transition
from rlflow.replay.items import LANE, LENGTH, START, VALID
from rlflow.types import ONE_LANE_NO, ONE_LANE_YES, TimeStep, step_spec

G = 0.9


class Recorder:
    """Wraps a priority function: keeps every batch it was given and the priorities it returned."""

    def __init__(self, fn):
        self.fn = fn
        self.calls: list[tuple[object, np.ndarray]] = []
        self.bad = None  # when set: a function of the batch size returning bad priorities

    def __call__(self, batch):
        m = (batch.reward if isinstance(batch, Transition) else batch["reward"]).shape[0]
        out = self.fn(batch) if self.bad is None else self.bad(m)
        self.calls.append((batch, np.asarray(out)))
        return out


# Two different functions of a Transition batch: one of the n-step return, one of the observations and action.
def return_priority(batch):
    return np.abs(batch.reward.astype(np.float64)) + 1.0


def observation_priority(batch):
    return (0.5 + np.mod(batch.observation[:, 1], 7) + 0.25 * np.mod(batch.next_observation[:, 1], 5)
            + 0.125 * batch.action)


def sequence_priority(batch):
    """exp(max reward over the rows with an action) + rows in the item, both over valid rows only. The batch
    carries no mask (padding is zero): a row is valid unless an earlier row of the window is ``last``."""
    last = batch["last"]
    valid = (np.cumsum(last, axis=1) - last) == 0
    acted = valid & ~last
    best = np.where(acted, batch["reward"].astype(np.float64), -np.inf).max(axis=1)
    return np.where(acted.any(axis=1), np.exp(np.where(acted.any(axis=1), best, 0.0)), 0.0) + valid.sum(axis=1)


def prioritized_table(store, name, **kwargs):
    return Table(store, sampler=Prioritized(alpha=1.0, beta=0.0, seed=7), remover=Fifo(),
                 max_size=10 * store.capacity * store.num_lanes, name=name, **kwargs)


def new_items(table, m):
    """The last ``m`` items inserted (table.items() is in insertion order) and their metadata rows."""
    items = {k: v[-m:] for k, v in table.items().items()}
    meta = np.zeros((m, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = (
        items["lane"], items["start"], items["length"], items["valid"])
    return items, meta


def checked_call(call, tables, recorders, check_batch):
    """Run ``call``; each table's function must be called once if the call inserted items into it (with a batch
    of exactly those items, as a sample would shape them, whose returned priorities the items got), else
    not at all. Returns the items inserted per table."""
    inserts = [t.rate_limiter.inserts for t in tables]
    seen = {name: len(r.calls) for name, r in recorders.items()}
    call()
    made = []
    for table, before in zip(tables, inserts, strict=True):
        m = table.rate_limiter.inserts - before
        made.append(m)
        rec = recorders.get(table.name)
        if rec is None:
            continue
        calls = rec.calls[seen[table.name]:]
        if not m:
            assert calls == []
            continue
        assert len(calls) == 1, f"table {table.name}: {len(calls)} calls for one call that inserted {m} items"
        batch, prios = calls[0]
        items, meta = new_items(table, m)
        assert prios.shape == (m,)
        np.testing.assert_array_equal(items["priority"], prios.astype(np.float64))
        check_batch(table, batch, items, meta)
    return made


def check_transition_batch(table, batch, items, meta):
    assert isinstance(batch, Transition)
    want, _ = table.view.gather(table.store, meta, {"return": items["field/return"],
                                                   "discount": items["field/discount"]})
    for part in ("observation", "action", "reward", "discount", "next_observation"):
        np.testing.assert_array_equal(getattr(batch, part), getattr(want, part), err_msg=part)
    np.testing.assert_array_equal(batch.extras["v"], want.extras["v"])


def check_sequence_batch(table, batch, items, meta):
    want, mask = table.view.gather(table.store, meta, {})
    assert isinstance(batch, dict) and batch.keys() == want.keys()
    length = table.view.length
    assert batch["reward"].shape == (items["length"].size, length)
    np.testing.assert_array_equal(mask, np.arange(length) < items["length"][:, None])
    for key in ("observation", "action", "reward", "terminated", "truncated", "first", "last"):
        np.testing.assert_array_equal(batch[key], want[key], err_msg=key)
        assert not batch[key][~mask].any(), f"{key}: padding is not zero"
    np.testing.assert_array_equal(batch["extras"]["v"], want["extras"]["v"])


def item_rows(store, lane, start, length):
    return store.gather(np.full(length, lane), start + np.arange(length))


def assert_nstep_priorities(store, table_a, table_b, stream, n):
    """Every live item of both tables has the priority of its table's function, recomputed from the stored
    rows; both tables hold exactly the reference's live items."""
    want = {(e, s) for e, lane in enumerate(stream.lanes) for s in nstep_items(lane, n, G)
            if alive(lane, s, store.capacity)}
    for table in (table_a, table_b):
        items = table.items()
        assert {(int(e), int(s)) for e, s in zip(items["lane"], items["start"], strict=True)} == want
    assert want
    items = table_a.items()
    for e, s, length, ret, prio in zip(items["lane"], items["start"], items["length"], items["field/return"],
                                       items["priority"], strict=True):
        rows = item_rows(store, e, s, length)
        ref = sum(G ** j * np.float64(rows["reward"][j]) for j in range(length - 1))
        np.testing.assert_allclose(ret, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(prio, abs(ref) + 1.0, rtol=1e-5, atol=1e-5)
        assert prio == abs(np.float64(ret)) + 1.0
    items = table_b.items()
    for e, s, length, prio in zip(items["lane"], items["start"], items["length"], items["priority"], strict=True):
        rows = item_rows(store, e, s, length)
        obs, nxt = rows["observation"][0].astype(np.float64), rows["observation"][-1].astype(np.float64)
        assert prio == 0.5 + obs[1] % 7 + 0.25 * (nxt[1] % 5) + 0.125 * rows["action"][0]


def nstep_setup(lanes, capacity, n, stage_steps=64):
    store = StepStore(SPEC, capacity=capacity, lanes=lanes)
    table_a, table_b = prioritized_table(store, "a"), prioritized_table(store, "b")
    recorders = {"a": Recorder(return_priority), "b": Recorder(observation_priority)}
    adder = adders.NStepTransition(store, [table_a, table_b], n=n, discount=G, priority_fns=recorders,
                                   stage_steps=stage_steps)
    return store, (table_a, table_b), recorders, adder


def run_nstep(cfg, staged):
    """The stream of ``cfg`` through add (or stage, then a last flush), every call checked."""
    n, s = cfg["n"], cfg["stage_steps"]
    store, tables, recorders, adder = nstep_setup(cfg["lanes"], cfg["capacity"], n, s)
    assert adder.stage_steps == s
    stream = Stream(cfg["lanes"], np.random.default_rng(cfg["seed"]), cfg["same_step"])
    ts = stream.reset()
    assert checked_call(lambda: adder.add_first(ts), tables, recorders, check_transition_batch) == [0, 0]
    write = adder.stage if staged else adder.add
    adds_with_items = 0
    for i in range(cfg["steps"]):
        step = stream.step(stream.random_events(cfg["p_end"]))
        made = checked_call(lambda step=step: write(*step), tables, recorders, check_transition_batch)
        assert made[0] == made[1]
        adds_with_items += made[0] > 0
        if staged and made[0]:  # a staged step writes only when it fills the block
            assert (i + 1) % s == 0
    if staged:  # the last, partial block
        checked_call(adder.flush, tables, recorders, check_transition_batch)
        assert adder.staged_steps == 0
    return store, tables, recorders, stream, adds_with_items


nstep_streams = st.fixed_dictionaries({
    "lanes": st.integers(2, 3), "n": st.integers(2, 3), "steps": st.integers(15, 40),
    "p_end": st.sampled_from([0.1, 0.3, 0.5]), "same_step": st.booleans(), "seed": st.integers(0, 2**16),
    "stage_steps": st.integers(2, 6), "slack": st.integers(0, 8)})


def with_capacity(cfg):
    """A store that wraps around during the stream, yet fits ``stage_steps`` (at most (capacity - n - 2) // 2)."""
    return {**cfg, "capacity": cfg["n"] + 2 + 2 * cfg["stage_steps"] + cfg["slack"]}


@settings(max_examples=12, deadline=None)
@given(nstep_streams)
def test_nstep_tables_get_the_priorities_of_their_own_functions(cfg):
    """Two tables on one store, different functions: each item has its table's function's priority (checked
    against the stored rows, across ring wrap-arounds), and each function is called once per add that
    completes items, with a Transition batch of exactly those items."""
    cfg = with_capacity(cfg)
    store, (table_a, table_b), recorders, stream, adds_with_items = run_nstep(cfg, staged=False)
    assert_nstep_priorities(store, table_a, table_b, stream, cfg["n"])
    for rec, table in zip(recorders.values(), (table_a, table_b), strict=True):
        assert len(rec.calls) == adds_with_items > 0
        assert sum(b.reward.shape[0] for b, _ in rec.calls) == table.rate_limiter.inserts
    # the two functions did differ on these items (the test tells the tables apart)
    assert not np.array_equal(table_a.items()["priority"], table_b.items()["priority"])


@settings(max_examples=12, deadline=None)
@given(nstep_streams)
def test_staged_writes_call_each_function_once_per_flush_with_the_priorities_of_adds(cfg):
    """stage() + flush(): one call per table per block written (its items all at once), and the items and
    priorities that add() of the same stream gives."""
    cfg = with_capacity(cfg)
    store, tables, recorders, stream, _ = run_nstep(cfg, staged=True)
    assert_nstep_priorities(store, *tables, stream, cfg["n"])
    blocks = -(-cfg["steps"] // cfg["stage_steps"])
    for rec, table in zip(recorders.values(), tables, strict=True):
        assert 0 < len(rec.calls) <= blocks
        assert sum(b.reward.shape[0] for b, _ in rec.calls) == table.rate_limiter.inserts
    _, added, _, _, _ = run_nstep(cfg, staged=False)
    for got, want in zip(tables, added, strict=True):
        g, w = got.items(), want.items()
        key = {(int(e), int(s)): i for i, (e, s) in enumerate(zip(w["lane"], w["start"], strict=True))}
        order = [key[(int(e), int(s))] for e, s in zip(g["lane"], g["start"], strict=True)]
        assert len(order) == len(key)
        for name in ("length", "priority", "field/return", "field/discount"):
            np.testing.assert_array_equal(g[name], w[name][order], err_msg=name)
        assert got.rate_limiter.inserts == want.rate_limiter.inserts


@settings(max_examples=12, deadline=None)
@given(st.integers(2, 3), st.integers(10, 40), st.sampled_from([0.1, 0.3, 0.5]), st.booleans(),
       st.integers(0, 2**16), st.integers(1, 2), st.sampled_from(["zero_pad", "write"]), st.integers(0, 8))
def test_sequence_priorities_use_only_valid_steps(lanes, steps, p_end, same_step, seed, period, behavior, slack):
    """Sequence (L = 3): the function sees [M, L, ...] columns (zero padding, no mask), once per add that
    completes sequences; each item's priority is recomputed from its stored rows (its length is its mask)."""
    length = 3
    store = StepStore(SPEC, capacity=length + 2 + slack, lanes=lanes)
    table, plain = prioritized_table(store, "seq"), prioritized_table(store, "plain")
    recorders = {"seq": Recorder(sequence_priority)}
    adder = adders.Sequence(store, [table, plain], length=length, period=period, end_behavior=behavior,
                            priority_fns=recorders)
    stream = Stream(lanes, np.random.default_rng(seed), same_step)
    ts = stream.reset()
    checked_call(lambda: adder.add_first(ts), [table, plain], recorders, check_sequence_batch)
    adds_with_items = 0
    for _ in range(steps):
        step = stream.step(stream.random_events(p_end))
        made = checked_call(lambda step=step: adder.add(*step), [table, plain], recorders, check_sequence_batch)
        assert made[0] == made[1]
        adds_with_items += made[0] > 0
    assert len(recorders["seq"].calls) == adds_with_items
    items = table.items()
    want = {(e, s): n for e, lane in enumerate(stream.lanes)
            for s, n in sequence_items(lane, length, period, behavior).items() if alive(lane, s, store.capacity)}
    assert {(int(e), int(s)): int(n) for e, s, n in zip(items["lane"], items["start"], items["length"],
                                                        strict=True)} == want
    for e, s, n, prio in zip(items["lane"], items["start"], items["length"], items["priority"], strict=True):
        rows = item_rows(store, e, s, n)
        acted = ~rows["last"]  # only the item's last row can be an episode's final row
        assert not rows["last"][:-1].any()
        ref = float(n) + (np.exp(rows["reward"][acted].astype(np.float64).max()) if acted.any() else 0.0)
        assert prio == ref
    np.testing.assert_array_equal(plain.items()["priority"], 1.0)  # a table without a function: priority 1
    assert plain.size == table.size


def test_sequence_priority_of_a_hand_made_episode():
    """L = 3, P = 2, ZERO_PAD, all rewards negative. Lane 0: rewards -2, -1, -3, then termination (rows 0 1 2,
    final row 3): sequences 0 1 2 and the tail 2 3 (one padding row, reward 0, not a step). Lane 1 goes on:
    sequence 0 1 2 once row 3 is open."""
    store = StepStore(SPEC, capacity=16, lanes=2)
    table = prioritized_table(store, "seq")
    adder = adders.Sequence(store, [table], length=3, period=2, end_behavior="zero_pad",
                            priority_fns={"seq": sequence_priority})
    obs = np.zeros((2, 2), np.float32)
    z, o, end = np.zeros(2, bool), np.ones(2, bool), np.array([True, False])
    adder.add_first(TimeStep(obs, np.zeros(2, np.float32), z, z, o, z))
    act, v = np.zeros(2, np.int64), {"v": np.zeros(2, np.float32)}
    adder.add(act, TimeStep(obs + 1, np.float32([-2, -1]), z, z, z, z), v)
    adder.add(act, TimeStep(obs + 2, np.float32([-1, -1]), z, z, z, z), v)
    adder.add(act, TimeStep(obs + 3, np.float32([-3, -1]), end, z, end, end, obs + 4), v)
    items = table.items()
    got = {(int(e), int(s)): (int(n), p) for e, s, n, p in zip(items["lane"], items["start"], items["length"],
                                                               items["priority"], strict=True)}
    assert got == {(0, 0): (3, 3.0 + np.exp(-1.0)), (0, 2): (2, 2.0 + np.exp(-3.0)), (1, 0): (3, 3.0 + np.exp(-1.0))}


def test_one_table_one_lane_compiled_paths_still_call_the_function():
    """A store and table that the one-call compiled paths (add, add_steps, staged one-lane blocks) would take
    were it not for the priority function: every path calls it and stores its priorities."""
    spec = step_spec(specs.Field((2,), np.float32), specs.Field((), np.int64, low=0, high=5))
    store = StepStore(spec, capacity=64, lanes=1)
    table = prioritized_table(store, "t")
    rec = Recorder(lambda b: 1.0 + np.abs(b.reward.astype(np.float64)) + b.observation[:, 1])
    adder = adders.NStepTransition(store, [table], n=2, discount=G, priority_fns={"t": rec}, stage_steps=4)
    rng = np.random.default_rng(3)
    serial = iter(range(1, 10_000))

    def obs():
        return np.float32([[0, next(serial)]])

    no, yes = ONE_LANE_NO, ONE_LANE_YES
    adder.add_first(TimeStep(obs(), np.zeros(1, np.float32), no, no, yes, no))
    for step in range(30):
        act, rew = np.array([step % 6]), np.round(rng.standard_normal(1), 2).astype(np.float32)
        end = step % 7 == 6
        ts = TimeStep(obs(), rew, yes if end else no, no, yes if end else no, yes if end else no,
                      obs() if end else None)
        (adder.stage if step >= 15 else adder.add)(act, ts)
    adder.flush()
    adder.add_steps(0, np.arange(5) % 6, np.float32([1, -2, 3, -4, 5]), np.float32([[0, 900 + i] for i in range(5)]),
                    truncated=True)
    assert table.size > 0 and rec.calls
    assert sum(b.reward.shape[0] for b, _ in rec.calls) == table.rate_limiter.inserts == table.size
    items = table.items()
    for e, s, length, ret, prio in zip(items["lane"], items["start"], items["length"], items["field/return"],
                                       items["priority"], strict=True):
        rows = item_rows(store, e, s, length)
        assert prio == 1.0 + abs(np.float64(ret)) + rows["observation"][0, 1]
        ref = sum(G ** j * np.float64(rows["reward"][j]) for j in range(length - 1))
        np.testing.assert_allclose(ret, ref, rtol=1e-5, atol=1e-5)


BAD = {
    "negative": (lambda m: -np.arange(1.0, m + 1), "expected finite values >= 0"),
    "nan": (lambda m: np.full(m, np.nan), "expected finite values >= 0"),
    "inf": (lambda m: np.full(m, np.inf), "expected finite values >= 0"),
    "too long": (lambda m: np.ones(m + 1), "expected shape"),
    "too short": (lambda m: np.ones(m - 1), "expected shape"),
    "2-d": (lambda m: np.ones((m, 1)), "expected shape"),
}


def _bad_call_setup(lanes=2, n=2):
    store = StepStore(SPEC, capacity=64, lanes=lanes)
    table = prioritized_table(store, "a")
    rec = Recorder(return_priority)
    adder = adders.NStepTransition(store, [table], n=n, discount=G, priority_fns={"a": rec}, stage_steps=8)
    stream = Stream(lanes, np.random.default_rng(11), True)
    adder.add_first(stream.reset())
    for _ in range(4):
        adder.add(*stream.step(["mid"] * lanes))
    assert table.size == 2 * (4 - n + 1)
    return store, table, rec, adder, stream


def _assert_same_items(got, want):
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_priorities_raise_and_the_table_gets_none_of_the_call(bad):
    """add(): the function's output is checked as Table.insert checks priorities; the table keeps nothing of
    the call. The step's rows were written before its items were made, so the store keeps them (the
    call's items are lost); the adder goes on with the next step."""
    store, table, rec, adder, stream = _bad_call_setup()
    before, count = table.items(), store.count.copy()
    rec.bad, match = BAD[bad]
    with pytest.raises(ValueError, match=f"priorities: {match}"):
        adder.add(*stream.step(["mid", "term"]))  # completes 1 window on lane 0 and 2 on lane 1
    assert rec.calls[-1][0].reward.shape == (3,)  # the function saw the call's three items
    _assert_same_items(table.items(), before)
    np.testing.assert_array_equal(store.count, count + np.array([1, 2]))  # kept: lane 1 its final and first rows
    rec.bad = None
    adder.add(*stream.step(["mid", "mid"]))
    assert table.size == before["key"].size + 1  # lane 0's next window (lane 1 restarted: none yet)
    items = table.items()
    np.testing.assert_array_equal(items["priority"], np.abs(items["field/return"].astype(np.float64)) + 1.0)


@pytest.mark.parametrize("bad", ["negative", "nan", "too short"])
def test_bad_priorities_at_a_flush_raise_and_the_table_gets_none_of_the_block(bad):
    """stage() + flush(): the block's one call fails, the flush raises, the table holds nothing of the block;
    the block's rows are written (nothing stays staged)."""
    store, table, rec, adder, stream = _bad_call_setup()
    before, count = table.items(), store.count.copy()
    for _ in range(3):
        adder.stage(*stream.step(["mid", "mid"]))
    assert table.size == before["key"].size  # held, not written
    rec.bad, match = BAD[bad]
    with pytest.raises(ValueError, match=f"priorities: {match}"):
        adder.flush()
    assert len(rec.calls[-1][0].reward) == 6  # one call for the whole block: 3 steps x 2 lanes
    _assert_same_items(table.items(), before)
    np.testing.assert_array_equal(store.count, count + 3)
    assert adder.staged_steps == 0
    rec.bad = None
    adder.flush()  # nothing left to write
    _assert_same_items(table.items(), before)


@pytest.mark.parametrize("bad", ["negative", "nan", "too long"])
def test_bad_sequence_priorities_raise_and_the_table_gets_none_of_the_call(bad):
    store = StepStore(SPEC, capacity=32, lanes=2)
    table = prioritized_table(store, "seq")
    rec = Recorder(sequence_priority)
    adder = adders.Sequence(store, [table], length=3, period=1, priority_fns={"seq": rec})
    stream = Stream(2, np.random.default_rng(5), True)
    adder.add_first(stream.reset())
    for _ in range(3):
        adder.add(*stream.step(["mid", "mid"]))
    before, count = table.items(), store.count.copy()
    assert before["key"].size == 2
    rec.bad, match = BAD[bad]
    with pytest.raises(ValueError, match=f"priorities: {match}"):
        adder.add(*stream.step(["mid", "mid"]))
    _assert_same_items(table.items(), before)
    np.testing.assert_array_equal(store.count, count + 1)


def test_a_bad_priority_function_of_one_table_keeps_the_items_from_every_table():
    """Two tables, the second's function returns negative priorities: the error names that table, and
    neither table takes the call's items (every table of an adder holds the same items)."""
    store = StepStore(SPEC, capacity=64, lanes=2)
    a, b = prioritized_table(store, "a"), prioritized_table(store, "b")
    rec = Recorder(observation_priority)
    adder = adders.NStepTransition(store, [a, b], n=1, discount=G, priority_fns={"a": return_priority, "b": rec})
    stream = Stream(2, np.random.default_rng(3), True)
    adder.add_first(stream.reset())
    adder.add(*stream.step(["mid", "mid"]))
    before = (a.items(), b.items())
    rec.bad = BAD["negative"][0]
    with pytest.raises(ValueError, match="the priority function of table 'b': priorities: expected finite values"):
        adder.add(*stream.step(["mid", "mid"]))
    _assert_same_items(a.items(), before[0])
    _assert_same_items(b.items(), before[1])
    rec.bad = None
    adder.add(*stream.step(["mid", "mid"]))
    assert a.size == b.size == 4 and a.items()["start"].tolist() == b.items()["start"].tolist()
