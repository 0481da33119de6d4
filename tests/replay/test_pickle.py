"""Pickling a store, its tables and an adder: what a process (or a Ray actor) receives goes on exactly as
the original would, with the same rows, items, views and random draws."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
from adder_reference import ADDERS, SPEC, Stream

from rlflow import adders
from rlflow.replay import Fifo, Prioritized, RowTable, SampleToInsertRatio, StepStore, Table, Uniform

TABLES = {
    "uniform": lambda store: Table(store, sampler=Uniform(seed=1), remover=Fifo(), max_size=500,
                                   cross_episodes=True, name="uniform"),
    "prioritized": lambda store: Table(store, sampler=Prioritized(0.6, seed=2), remover=Fifo(), max_size=300,
                                       max_times_sampled=3, name="prioritized",
                                       rate_limiter=SampleToInsertRatio(2.0, 10, 1e9)),
    "rows": lambda store: RowTable(store, seed=3, name="rows"),
}


def arrays(obj, path, out, seen):
    """Every numpy array reachable from ``obj`` through rlflow objects, containers and NamedTuples, by path."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        out[path] = obj
        return
    if isinstance(obj, dict):
        kids = obj.items()
    elif isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        kids = obj._asdict().items()
    elif isinstance(obj, list | tuple):
        kids = enumerate(obj)
    elif type(obj).__module__.startswith("rlflow") and hasattr(obj, "__dict__"):
        kids = vars(obj).items()
    else:
        return
    for key, value in kids:
        arrays(value, f"{path}.{key}", out, seen)


def shared_pairs(root):
    """The pairs of distinct arrays (by path) that share memory: views the objects write through."""
    found = {}
    arrays(root, "root", found, set())
    return {(p, q) for (p, a), (q, b) in itertools.combinations(sorted(found.items()), 2)
            if a is not b and a.size and b.size and np.shares_memory(a, b)}


def build(make_adder, kinds):
    store = StepStore(SPEC, capacity=200, lanes=2)
    tables = [TABLES[k](store) for k in kinds]
    return make_adder(store, tables)


def drive(adder, stream, steps, staged):
    for _ in range(steps):
        actions, ts, extras = stream.step(stream.random_events(0.08))
        (adder.stage if staged else adder.add)(actions, ts, extras)


def tables_equal(a, b):
    for t1, t2 in zip(a.tables, b.tables, strict=True):
        i1, i2 = t1.items(), t2.items()
        assert i1.keys() == i2.keys()
        for k in i1:
            np.testing.assert_array_equal(i1[k], i2[k], err_msg=f"{t1.name}: {k}")
    for k, v in a.store.state_dict().items():
        np.testing.assert_array_equal(v, b.store.state_dict()[k], err_msg=k)


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("name", ["nstep-1", "nstep-3", "episode", "sequence-zero_pad", "sequence-continue"])
def test_an_adder_pickled_mid_stream_goes_on_as_the_original(name, staged):
    kinds = ["uniform", "prioritized", "rows"] if name.startswith("nstep") else ["uniform"]
    adder = build(ADDERS[name], kinds)
    stream = Stream(2, np.random.default_rng(5), True)
    adder.add_first(stream.reset())
    drive(adder, stream, 450, staged)  # past the ring's wrap: the tables have evicted
    copy = pickle.loads(pickle.dumps(adder))
    assert copy.store is copy.tables[0].store and copy.store is not adder.store
    assert shared_pairs(copy) == shared_pairs(adder)
    tables_equal(adder, copy) if not staged else None
    # The same stream goes on into both; the copy writes through its views into its own store.
    twin = Stream(2, np.random.default_rng(9), True)
    twin.__dict__.update(pickle.loads(pickle.dumps(stream.__dict__)))
    drive(adder, stream, 80, staged)
    drive(copy, twin, 80, staged)
    adder.flush()
    copy.flush()
    tables_equal(adder, copy)
    for t1, t2 in zip(adder.tables, copy.tables, strict=True):
        if t1.can_sample(8):
            s1, s2 = t1.sample(8), t2.sample(8)
            np.testing.assert_array_equal(s1.keys, s2.keys)
            np.testing.assert_array_equal(s1.probabilities, s2.probabilities)
    assert len(adder.store) == len(copy.store)


def test_a_pickled_multiagent_adder_keeps_its_views():
    from ma_envs import DyingAgents

    from rlflow.envs import ParallelEnvironment

    env = ParallelEnvironment([DyingAgents()])
    store = StepStore(env.spec, capacity=40, lanes=1)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    adder = adders.MultiAgentTransition(store, [table], n=2)
    adder.add_first(env.reset(seed=0))
    rng = np.random.default_rng(0)
    for _ in range(30):
        actions = rng.integers(0, 2, (1, env.num_agents))
        ts = env.step(actions)
        adder.add(actions, ts)
    copy = pickle.loads(pickle.dumps(adder))
    assert shared_pairs(copy) == shared_pairs(adder)
    tables_equal(adder, copy)


def test_the_copy_is_independent_of_the_original():
    adder = build(ADDERS["nstep-3"], ["uniform"])
    stream = Stream(2, np.random.default_rng(0), True)
    adder.add_first(stream.reset())
    drive(adder, stream, 20, False)
    copy = pickle.loads(pickle.dumps(adder))
    before = {k: v.copy() for k, v in copy.store.state_dict().items()}
    size = copy.tables[0].size
    drive(adder, stream, 20, False)
    assert adder.tables[0].size > size and copy.tables[0].size == size
    for k, v in copy.store.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_a_disk_store_refuses_to_be_pickled(tmp_path):
    store = StepStore(SPEC, capacity=10, lanes=1, backend="disk", directory=tmp_path / "rows")
    with pytest.raises(TypeError, match="backend='memory'"):
        pickle.dumps(store)
