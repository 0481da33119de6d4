"""Many threads on one StepStore and two Tables: writers per lane, samplers on both tables.

Writers own one lane each; the lanes wrap around many times, so overwrites evict items all the time.
Table ``prio`` (Prioritized sampler, MinSize limiter, smaller than the store) also evicts with its Fifo
remover; table ``ratio`` (Uniform sampler, SampleToInsertRatio limiter, max_times_sampled=3) blocks
writers until samplers catch up and samplers until writers insert. Every thread runs a fixed number of
operations (samplers: until the writers are done and the limiter admits no more samples), and every
check is made on what the threads recorded, so the assertions do not depend on the interleaving.
"""

import threading
import time

import numpy as np

from rlflow.replay import (
    Fifo,
    MinSize,
    Prioritized,
    RateLimitTimeout,
    SampleToInsertRatio,
    StepStore,
    Table,
    Uniform,
)
from rlflow.specs import Field

SPEC = {"id": Field((), np.int64), "obs": Field((2,), np.float32)}
BIG = 10**6  # ids lane * BIG + row stay exact in float32 for the rows written here
CAPACITY = 16
WRITERS = 4
SAMPLERS = 3
ROWS_PER_WRITER = 400
ALPHA = 0.6
WAIT = 8.0  # generous (operations take microseconds): a call blocked this long is a stall, an error
WAKE = 3.0  # how long a woken thread may take to return (it needs microseconds)
POLL = 0.2  # samplers' wait between re-checks of "writers done" (never an error)


def row_data(lane, row):
    ids = np.array([lane * BIG + row], np.int64)
    return {"id": ids, "obs": np.stack([ids, -ids], -1).astype(np.float32)}


def sample_violations(sample, table_name):
    """Rows of a sample that are not the rows its item names (torn, stale, from another lane)."""
    out = []
    ids, obs = sample.data["id"], sample.data["obs"]
    offsets = np.arange(ids.shape[1])[None, :]
    expect = sample.lanes[:, None] * BIG + sample.starts[:, None] + offsets
    mask = sample.mask
    if not np.all(np.where(mask, ids == expect, ids == 0)):
        out.append(f"{table_name}: ids {ids.tolist()} for lanes {sample.lanes.tolist()} starts "
                   f"{sample.starts.tolist()} mask {mask.tolist()}")
    if not (np.array_equal(obs[..., 0], ids.astype(np.float32)) and np.array_equal(obs[..., 1], -obs[..., 0])):
        out.append(f"{table_name}: obs {obs.tolist()} torn from ids {ids.tolist()}")
    if not (mask[:, 0].all() and np.all(mask[:, 1:] <= mask[:, :-1])):
        out.append(f"{table_name}: mask {mask.tolist()} is not a non-empty prefix")
    if not np.all(mask.sum(1) <= sample.lengths):
        out.append(f"{table_name}: mask longer than the window")
    if not (np.all(sample.times_sampled >= 1) and np.all(sample.probabilities > 0)):
        out.append(f"{table_name}: times {sample.times_sampled.tolist()} probs {sample.probabilities.tolist()}")
    return out


def test_writers_and_samplers_in_threads():
    store = StepStore(SPEC, capacity=CAPACITY, lanes=WRITERS)
    prio = Table(store, sampler=Prioritized(alpha=ALPHA, beta=0.4, seed=1), remover=Fifo(), max_size=40,
                 rate_limiter=MinSize(1), name="prio")
    limiter = SampleToInsertRatio(1.0, 8, (-2.0, 10.0))
    ratio = Table(store, sampler=Uniform(seed=2), remover=Fifo(), max_times_sampled=3, rate_limiter=limiter,
                  name="ratio")
    tables = {"prio": prio, "ratio": ratio}

    lock = threading.Lock()  # guards the shared records below (not the tables)
    inserted = {name: {} for name in tables}  # key -> (lane, start, length)
    sampled = {name: [] for name in tables}  # (key, lane, start, length) of every draw
    sample_calls = {name: 0 for name in tables}
    violations: list[str] = []
    errors: list[str] = []
    updates = {"calls": 0, "updated": 0, "stale_keys": 0}
    writers_left = [WRITERS]
    writers_done = threading.Event()
    start_gate = threading.Barrier(WRITERS + SAMPLERS)

    def writer(lane):
        rng = np.random.default_rng(100 + lane)
        mine = {name: {} for name in tables}
        try:
            start_gate.wait()
            for _ in range(ROWS_PER_WRITER):
                first = rng.random() < 0.1 or store.count[lane] == 0  # a lane's first row starts an episode
                store.append(row_data(lane, store.count[lane]), lanes=[lane], first=np.array([first]))
                count = int(store.count[lane])  # only this thread writes this lane
                lo = max(0, count - CAPACITY)
                for name, n in (("prio", int(rng.integers(1, 3))), ("ratio", 1)):
                    starts = rng.integers(lo, count, n)
                    lengths = np.minimum(rng.integers(1, 6, n), count - starts)
                    lanes = np.full(n, lane)
                    if name == "prio":
                        keys = prio.insert(lanes, starts, lengths, priorities=rng.uniform(0.05, 3.0, n),
                                           timeout=WAIT)
                    else:
                        t0 = time.monotonic()
                        keys = ratio.insert(lanes, starts, lengths, timeout=WAIT)
                        if time.monotonic() - t0 >= 0.9 * WAIT:
                            # Admitted only when its wait ran out: nothing woke it when inserts became
                            # possible again (a lost wakeup), though it did not time out.
                            errors.append(f"writer {lane}: ratio insert waited the whole {WAIT} s timeout")
                    assert keys.size == n
                    for k, s, ln in zip(keys.tolist(), starts.tolist(), lengths.tolist(), strict=True):
                        mine[name][k] = (lane, s, ln)
        except RateLimitTimeout as e:
            errors.append(f"writer {lane} stalled: {e}")
        except Exception as e:  # reported below, with the thread it came from
            errors.append(f"writer {lane}: {type(e).__name__}: {e}")
        finally:
            with lock:
                for name in tables:
                    inserted[name].update(mine[name])
                writers_left[0] -= 1
                if writers_left[0] == 0:
                    writers_done.set()

    def sampler(idx):
        rng = np.random.default_rng(200 + idx)
        old_keys = {name: np.zeros(0, np.int64) for name in tables}  # keys sampled a while ago
        my_draws = {name: [] for name in tables}
        my_calls = {name: 0 for name in tables}
        my_violations: list[str] = []
        my_updates = {"calls": 0, "updated": 0, "stale_keys": 0}
        try:
            start_gate.wait()
            for _ in range(200_000):  # a bound, never reached: the loop ends when the writers are done
                if writers_done.is_set():
                    if not ratio.can_sample(1):
                        break
                    bs = 1  # drain the limiter exactly
                else:
                    bs = int(rng.integers(1, 5))
                try:
                    s = prio.sample(bs, timeout=POLL)
                except RateLimitTimeout:
                    s = None  # the table is empty at the very start
                if s is not None:
                    my_calls["prio"] += 1
                    my_violations += sample_violations(s, "prio")
                    my_draws["prio"] += zip(s.keys.tolist(), s.lanes.tolist(), s.starts.tolist(),
                                            s.lengths.tolist(), strict=True)
                    # New priorities for what was sampled, plus keys sampled long ago (mostly gone by now).
                    keys = np.concatenate([s.keys, old_keys["prio"]])
                    n = prio.update_priorities(keys, rng.uniform(0.0, 3.0, keys.size))
                    my_updates["calls"] += 1
                    my_updates["updated"] += n
                    my_updates["stale_keys"] += int(keys.size - n)  # entries that named no live item
                    if rng.random() < 0.3:
                        old_keys["prio"] = s.keys.copy()
                    if rng.random() < 0.05:
                        prio.delete(s.keys[:1])
                try:
                    s = ratio.sample(bs, timeout=POLL)
                except RateLimitTimeout:
                    continue  # writers still busy or done: the loop condition decides
                my_calls["ratio"] += 1
                my_violations += sample_violations(s, "ratio")
                my_draws["ratio"] += zip(s.keys.tolist(), s.lanes.tolist(), s.starts.tolist(),
                                         s.lengths.tolist(), strict=True)
                ratio.update_priorities(np.concatenate([s.keys, old_keys["ratio"]]), rng.uniform(0.5, 2.0))
                if rng.random() < 0.3:
                    old_keys["ratio"] = s.keys.copy()
            else:
                errors.append(f"sampler {idx} never finished")
        except Exception as e:  # reported below, with the thread it came from
            errors.append(f"sampler {idx}: {type(e).__name__}: {e}")
        finally:
            with lock:
                for name in tables:
                    sampled[name] += my_draws[name]
                    sample_calls[name] += my_calls[name]
                violations.extend(my_violations)
                for k, v in my_updates.items():
                    updates[k] += v

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(WRITERS)]
    threads += [threading.Thread(target=sampler, args=(i,), daemon=True) for i in range(SAMPLERS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads still running: deadlock"
    assert errors == [], errors
    assert violations == [], violations[:5]

    # Every lane got all its rows and wrapped many times.
    assert store.count.tolist() == [ROWS_PER_WRITER] * WRITERS
    assert len(inserted["prio"]) > WRITERS * ROWS_PER_WRITER
    assert len(inserted["ratio"]) == WRITERS * ROWS_PER_WRITER
    assert sample_calls["prio"] > 0 and sample_calls["ratio"] > 0
    assert updates["calls"] > 0 and updates["stale_keys"] > 0  # some updates named keys already gone

    for name, table in tables.items():
        lim = table.rate_limiter
        assert lim.inserts == len(inserted[name]), name
        assert lim.samples == len(sampled[name]), name
        assert lim.inserts - lim.deletes == table.size, name
        assert lim.deletes > 0, name  # overwrites (and evictions, retirements) really removed items
        # Each draw named an item that was inserted, with the window it was inserted with.
        for key, lane, start, length in sampled[name]:
            assert inserted[name][key] == (lane, start, length), (name, key)
        items = table.items()
        keys = items["key"]
        assert keys.size == table.size and np.unique(keys).size == keys.size, name
        for k, lane, start, length in zip(keys.tolist(), items["lane"].tolist(), items["start"].tolist(),
                                          items["length"].tolist(), strict=True):
            assert inserted[name][k] == (lane, start, length), (name, k)
        # Every live item's whole window is still stored.
        assert store.alive(items["lane"], items["start"]).all(), name
        assert store.alive(items["lane"], items["start"] + items["length"] - 1).all(), name

    # The ratio limiter held: samples never ran ahead of inserts beyond min_diff, and once the writers
    # finished, the samplers drained it until not one more sample could pass.
    diff = limiter.inserts * limiter.samples_per_insert - limiter.samples
    assert diff >= limiter.min_diff
    assert not ratio.can_sample(1)
    # No item of the ratio table was sampled more than max_times_sampled times.
    counts = np.unique([d[0] for d in sampled["ratio"]], return_counts=True)[1]
    assert counts.max() <= 3
    assert ratio.items()["times_sampled"].max(initial=0) <= 2

    # The prioritized sampler's mass is exactly the live priorities ** alpha.
    items = prio.items()
    p = items["priority"]
    mass = np.where(p > 0, np.power(p, ALPHA), 0.0)
    assert prio.sampler.size == prio.size
    np.testing.assert_allclose(prio.sampler.total, mass.sum(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(prio.sampler.priority_mass(items["key"] % prio.max_size), mass, rtol=1e-15, atol=0)


def _blocked_call(fn):
    """Run ``fn`` in a thread; return (thread, done event, errors)."""
    done, errors = threading.Event(), []

    def run():
        try:
            fn()
        except Exception as e:  # reported by the caller
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done, errors


def _ratio_table(max_diff):
    store = StepStore(SPEC, capacity=32)
    for row in range(32):
        store.append(row_data(0, row), first=np.array([row == 0]))
    limiter = SampleToInsertRatio(1.0, 2, (0.0, max_diff))
    return store, Table(store, rate_limiter=limiter), limiter


def test_sample_wakes_a_blocked_insert():
    """An insert blocked by SampleToInsertRatio returns once a sample makes room (no other event)."""
    _, table, limiter = _ratio_table(4.0)
    table.insert(np.zeros(4, np.int64), np.arange(4), 1)
    assert not table.can_insert(1)
    thread, done, errors = _blocked_call(lambda: table.insert([0], [10], [1]))  # no timeout: waits for a wakeup
    # The insert cannot pass until a sample is made (this only makes sure the thread got to its wait).
    assert not done.wait(0.2)
    table.sample(2)
    assert table.can_insert(1)
    woke = done.wait(WAKE)
    if not woke:
        table.delete(table.items()["key"][:1])  # a removal does notify: let the thread finish
        done.wait(WAKE)
    thread.join(WAKE)
    assert woke, "a sample made room for the blocked insert, but it was not woken"
    assert errors == [] and limiter.inserts == 5 and table.size == 5


def test_insert_wakes_a_blocked_sample():
    """A sample blocked below min_size_to_sample returns once an insert reaches it."""
    _, table, limiter = _ratio_table(4.0)
    table.insert([0], [0], [1])
    assert not table.can_sample(1)
    got = []
    thread, done, errors = _blocked_call(lambda: got.append(table.sample(1)))
    assert not done.wait(0.2)
    table.insert([0], [1], [1])
    woke = done.wait(WAKE)
    thread.join(WAKE)
    assert woke and errors == [] and len(got) == 1 and limiter.samples == 1


def test_overwrite_wakes_a_blocked_insert():
    """Items removed by an overwrite free the limiter (size below min_size_to_sample): inserts resume."""
    store, table, limiter = _ratio_table(4.0)
    table.insert(np.zeros(4, np.int64), [0, 0, 1, 2], 1)  # three items start at rows 0 and 1
    assert not table.can_insert(1)
    thread, done, errors = _blocked_call(lambda: table.insert([0], [20], [1]))
    assert not done.wait(0.2)
    store.append(row_data(0, 32), lanes=[0])  # overwrites row 0: two items go, the table holds 2
    store.append(row_data(0, 33), lanes=[0])  # overwrites row 1: one more goes, below min size
    woke = done.wait(WAKE)
    thread.join(WAKE)
    assert woke and errors == [] and limiter.deletes == 3 and table.size == 2


def test_items_whose_rows_are_overwritten_while_an_insert_waits_are_skipped():
    """Rows overwritten during the wait: their items get key -1, the others are inserted."""
    store, table, limiter = _ratio_table(4.0)
    table.insert(np.zeros(4, np.int64), np.arange(10, 14), 1)
    assert not table.can_insert(1)
    got = []
    thread, done, errors = _blocked_call(lambda: got.append(table.insert([0, 0], [0, 20], [1, 1])))
    assert not done.wait(0.2)
    store.append(row_data(0, 32), lanes=[0])  # overwrites row 0, which the first waiting item names
    table.sample(2)  # makes room for two inserts
    assert done.wait(WAKE)
    thread.join(WAKE)
    assert errors == []
    keys = got[0]
    assert keys[0] == -1 and keys[1] >= 0
    assert table.items()["start"].tolist() == [10, 11, 12, 13, 20]
    assert limiter.inserts == 5


def test_the_sum_tree_releases_the_gil_while_it_works():
    """A second thread, woken just before a long sum-tree call, runs while the call works. Python is told not
    to take the GIL from a thread for 100 s (``sys.setswitchinterval``), so the second thread can only run
    during the call if the call gives the GIL up; one that kept it would let it run only at the ``join``
    after it. The order is read from what the threads recorded, never from a duration."""
    import sys

    from rlflow.replay.sum_tree import SumTree

    tree = SumTree(1 << 20)
    tree.update(np.arange(1 << 20), np.random.default_rng(0).random(1 << 20))
    uniforms = np.random.default_rng(1).random(1 << 21)
    interval = sys.getswitchinterval()
    orders = []
    try:
        sys.setswitchinterval(100.0)
        for _ in range(10):  # a busy machine may not run the woken thread within one call: try again
            log: list[str] = []
            go = threading.Event()
            thread = threading.Thread(target=lambda log=log, go=go: (go.wait(), log.append("other")))
            thread.start()
            go.set()
            log.append("call")
            tree.sample(uniforms, stratified=False, beta=0.4)
            log.append("returned")
            thread.join()
            orders.append(log)
            if log == ["call", "other", "returned"]:
                break
    finally:
        sys.setswitchinterval(interval)
    assert orders[-1] == ["call", "other", "returned"], orders
