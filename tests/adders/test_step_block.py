"""StepBlock: the unit every write goes through: checked when filled, picklable, written whole or not at all."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow import adders, specs
from rlflow.adders import StepBlock
from rlflow.replay import Fifo, StepStore, Table, Uniform
from rlflow.specs import SpecError
from rlflow.types import TimeStep, step_spec

SPEC = step_spec(specs.Field((2,), np.float32), specs.Field((), np.int64, low=0, high=3))


def _parts(lanes: int = 2) -> tuple[StepStore, Table, adders.NStepTransition]:
    store = StepStore(SPEC, capacity=64, lanes=lanes)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    return store, table, adders.NStepTransition(store, [table], n=2, discount=0.5)


def _steps(rng: np.random.Generator, count: int, lanes: int = 2) -> list[tuple[np.ndarray, TimeStep]]:
    """A stream of steps after a reset: some lanes end (terminated or truncated) and restart in the same step."""
    out = []
    for _ in range(count):
        end = rng.random(lanes) < 0.2
        term = end & (rng.random(lanes) < 0.5)
        obs = rng.standard_normal((lanes, 2)).astype(np.float32)
        final = rng.standard_normal((lanes, 2)).astype(np.float32) if end.any() else None
        out.append((rng.integers(0, 4, lanes), TimeStep(obs, rng.standard_normal(lanes).astype(np.float32), term,
                                                        end & ~term, end, end, final)))
    return out


def _reset(lanes: int = 2) -> TimeStep:
    z = np.zeros(lanes, bool)
    return TimeStep(np.zeros((lanes, 2), np.float32), np.zeros(lanes, np.float32), z, z, ~z, z)


def _assert_same(a: tuple, b: tuple) -> None:
    (s1, t1), (s2, t2) = a, b
    for k, v in s1.state_dict().items():
        np.testing.assert_array_equal(v, s2.state_dict()[k], err_msg=k)
    i1, i2 = t1.items(), t2.items()
    for k in i1:
        np.testing.assert_array_equal(i1[k], i2[k], err_msg=k)


@pytest.mark.parametrize("size", [1, 3, 7, 20])
def test_a_block_written_through_pickle_writes_what_adds_write(size):
    """Steps put into blocks of ``size`` (pickled and unpickled, as a process would ship them) and written by
    the adder leave the store and the table exactly as one add a step."""
    rng = np.random.default_rng(size)
    stream = _steps(rng, 40)
    by_add, by_block = _parts(), _parts()
    by_add[2].add_first(_reset())
    for actions, ts in stream:
        by_add[2].add(actions, ts)
    store, table, adder = by_block
    adder.add_first(_reset())
    for a in range(0, len(stream), size):
        block = StepBlock(SPEC, lanes=[0, 1], steps=size)
        block.start(np.ones(2, bool))
        for actions, ts in stream[a:a + size]:
            block.put(actions, ts)
        shipped = pickle.loads(pickle.dumps(block))
        assert shipped.steps == block.steps and repr(shipped) == repr(block)
        adder.write(shipped)
    _assert_same(by_add[:2], (store, table))


def test_a_bad_step_raises_and_leaves_the_block_as_it_was():
    rng = np.random.default_rng(0)
    block = StepBlock(SPEC, lanes=[0, 1], steps=4)
    block.start(np.ones(2, bool))
    actions, ts = _steps(rng, 1)[0]
    block.put(actions, ts)
    before = pickle.dumps(block.state_dict())
    z, o = np.zeros(2, bool), np.ones(2, bool)
    obs = np.zeros((2, 2), np.float32)
    cases = [
        (np.array([0, 9]), TimeStep(obs, np.zeros(2, np.float32), z, z, z, z), SpecError, "<= 3"),
        (np.zeros(2, np.int64), TimeStep(obs + np.nan, np.zeros(2, np.float32), z, z, z, z), SpecError, "finite"),
        (np.zeros(2, np.int64), TimeStep(obs, np.zeros(2, np.float32), o, z, z, z), SpecError, "last =="),
        (np.zeros(2, np.int64), TimeStep(obs, np.zeros(2, np.float32), z, z, o, z), ValueError, "start a new"),
        (np.zeros(2, np.int64), TimeStep(obs, np.zeros(2, np.float32), o, z, z, o), SpecError, "final_observation"),
        (np.zeros(3, np.int64), TimeStep(obs, np.zeros(2, np.float32), z, z, z, z), SpecError, "shape"),
    ]
    for actions, ts, exc, match in cases:
        with pytest.raises(exc, match=match):
            block.put(actions, ts)
        assert pickle.dumps(block.state_dict()) == before
    block.put(np.zeros(2, np.int64), TimeStep(obs, np.zeros(2, np.float32), z, z, z, z))
    assert block.steps == 2


# One action column of each dtype the compiled put checks: its bounds (None: floats, checked finite), a value
# inside them and one outside. Each bad value on lane 1 raises naming the bound, and the block is unchanged.
VALUE_CASES = [
    (np.int8, -3, 5, 5, 6), (np.int16, -300, 300, -300, -301), (np.int32, 0, 70000, 70000, 70001),
    (np.int64, -(2**40), 2**40, 2**40, 2**40 + 1), (np.uint8, 2, 200, 2, 1), (np.uint16, 0, 60000, 60000, 60001),
    (np.uint32, 10, 4_000_000_000, 4_000_000_000, 4_000_000_001), (np.uint64, 0, 2**50, 0, 2**50 + 1),
    (np.int64, -(2**40), 2**40, -(2**40), -(2**40) - 1), (np.int64, -5, 5, -1, -(2**62)),
    (np.uint64, 0, 2**50, 2**50, 2**63 + 5), (np.int8, -128, -1, -128, 0),
    (np.float32, None, None, 1e38, np.inf), (np.float32, None, None, -3.4e38, -np.inf),
    (np.float64, None, None, -1e300, np.nan), (np.float64, None, None, 5e-324, np.inf),
]


@pytest.mark.parametrize(("dtype", "low", "high", "good", "bad"), VALUE_CASES)
def test_the_compiled_put_checks_each_dtype(dtype, low, high, good, bad):
    spec = step_spec(specs.Field((2,), np.float32), specs.Field((3,), dtype, low=low, high=high))
    block = StepBlock(spec, lanes=[0, 1], steps=2)
    block.start(np.ones(2, bool))
    z = np.zeros(2, bool)
    ts = TimeStep(np.zeros((2, 2), np.float32), np.zeros(2, np.float32), z, z, z, z)
    fine = np.full((2, 3), good, dtype)
    block.put(fine, ts)
    before = pickle.dumps(block.state_dict())
    wrong = fine.copy()
    wrong[1, 2] = bad
    with pytest.raises(SpecError, match="action"):
        block.put(wrong, ts)
    assert pickle.dumps(block.state_dict()) == before
    block.put(fine, ts)
    np.testing.assert_array_equal(block.act["action"][:2], [fine, fine])
    assert block.steps == 2


DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64,
          np.float16]


@st.composite
def _action_cases(draw, dtype):
    """An action field of ``dtype`` (integer bounds or none, some beyond float64's exact integers) and values
    for ``lanes`` lanes: edge values of the dtype and the bounds, and for floats NaN and the infinities."""
    dtype = np.dtype(dtype)
    lanes, size = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    low = high = None
    if dtype.kind == "f":
        info = np.finfo(dtype)
        pool = [0.0, -1.5, 3.25, float(info.max), -float(info.max), float(info.smallest_subnormal), -np.inf, np.inf,
                np.nan]
    else:
        info = np.iinfo(dtype)
        lo, hi = int(info.min), int(info.max)
        bound = st.one_of(st.none(), st.integers(max(lo, -300), min(hi, 300)), st.integers(lo, hi))
        low, high = draw(bound), draw(bound)
        if low is not None and high is not None and low > high:
            low, high = high, low
        edges = [int(info.min), int(info.max), 0, 1]
        for b in (low, high):
            if b is not None:
                edges += [b - 1, b, b + 1]
        pool = [v for v in edges if info.min <= v <= info.max]
    values = np.array(draw(st.lists(st.sampled_from(pool), min_size=lanes * size, max_size=lanes * size)), dtype)
    return specs.Field((size,), dtype, low=low, high=high), values.reshape(lanes, size)


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_put_accepts_exactly_what_validate_accepts(dtype, data):
    """The compiled put takes a step's action exactly when :func:`rlflow.specs.validate` (the slow reference)
    takes it, stores its bits, and leaves the block as it was when it refuses."""
    field, values = data.draw(_action_cases(dtype))
    lanes = values.shape[0]
    block = StepBlock(step_spec(specs.Field((2,), np.float32), field), lanes=list(range(lanes)), steps=2)
    block.start(np.ones(lanes, bool))
    z = np.zeros(lanes, bool)
    ts = TimeStep(np.zeros((lanes, 2), np.float32), np.zeros(lanes, np.float32), z, z, z, z)
    try:
        specs.validate({"action": field}, {"action": values}, (lanes,))
        expected = None
    except SpecError as exc:
        expected = exc
    before = pickle.dumps(block.state_dict())
    if expected is None:
        block.put(values, ts)
        assert block.act["action"][0].tobytes() == values.tobytes()
    else:
        with pytest.raises(SpecError, match="action"):
            block.put(values, ts)
        assert pickle.dumps(block.state_dict()) == before


def test_a_bad_observation_raises_only_where_a_lane_needs_it():
    """Observations are checked where some lane opens a row with them; a step ending every lane (no restart)
    ignores its observation and takes its final observations instead."""
    block = StepBlock(SPEC, lanes=[0, 1], steps=3)
    block.start(np.ones(2, bool))
    z, o = np.zeros(2, bool), np.ones(2, bool)
    nan = np.full((2, 2), np.nan, np.float32)
    with pytest.raises(SpecError, match="finite"):
        block.put(np.zeros(2, np.int64), TimeStep(nan, np.zeros(2, np.float32), z, z, z, z))
    assert block.steps == 0 and block.state_dict()["open"].all()
    block.put(np.zeros(2, np.int64), TimeStep(nan, np.zeros(2, np.float32), o, z, z, o, np.zeros((2, 2), np.float32)))
    assert block.steps == 1 and not block.state_dict()["open"].any()
    with pytest.raises(SpecError, match="finite"):
        block.put(np.zeros(2, np.int64), TimeStep(nan, np.zeros(2, np.float32), z, z, o, z))


def test_put_steps_fills_what_puts_fill():
    """``put_steps`` (one lane's T steps at once, restarts from first observations) holds what T puts hold."""
    rng = np.random.default_rng(3)
    t = 9
    acts = rng.integers(0, 4, t)
    rews = rng.standard_normal(t).astype(np.float32)
    nxt = rng.standard_normal((t, 2)).astype(np.float32)
    ends = np.zeros(t, bool)
    ends[[2, 5]] = True
    term = np.array([False, False, True, False, False, False, False, False, False])
    firsts = rng.standard_normal((2, 2)).astype(np.float32)
    whole = StepBlock(SPEC, lanes=[1], steps=t)
    whole.start(np.ones(1, bool))
    whole.put_steps(acts, rews, nxt, ends, term, firsts)
    one = StepBlock(SPEC, lanes=[1], steps=t)
    one.start(np.ones(1, bool))
    k = 0
    for i in range(t):
        restart = bool(ends[i])
        obs = firsts[k:k + 1] if restart else nxt[i:i + 1]
        k += restart
        flag = np.array
        one.put(acts[i:i + 1], TimeStep(obs, rews[i:i + 1], flag([bool(term[i])]), flag([bool(ends[i] & ~term[i])]),
                                        flag([restart]), flag([bool(ends[i])]), nxt[i:i + 1]))
    a, b = whole.state_dict(), one.state_dict()
    for key in ("act", "observation"):
        for name in a[key]:
            np.testing.assert_array_equal(a[key][name], b[key][name], err_msg=name)
    ended = np.flatnonzero(ends)
    np.testing.assert_array_equal(a["final"]["observation"][ended], b["final"]["observation"][ended])
    for key in ("first", "terminated", "truncated", "open"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_restart_needs_an_end_at_the_last_step_and_a_write_needs_the_adders_state():
    store, table, adder = _parts()
    block = StepBlock(SPEC, lanes=[0, 1], steps=3)
    block.start(np.ones(2, bool))
    with pytest.raises(ValueError, match="did not end at the block's last step"):
        block.restart(np.array([0]), np.zeros((1, 2), np.float32))
    block.put(np.zeros(2, np.int64), _steps(np.random.default_rng(1), 1)[0][1])
    count = store.count.copy()
    with pytest.raises(RuntimeError, match="does not follow from its lanes' state"):
        adder.write(block)  # the adder's lanes have no episode in progress: nothing is written
    np.testing.assert_array_equal(store.count, count)
    assert table.size == 0 and block.steps == 1


def test_a_shipped_block_is_checked_where_it_lands():
    """A block's state loaded into another block (a remote actor's block landing at the replay server) is
    checked as put checks it: a NaN or out-of-bounds value in a row the steps write is refused, naming the
    part, and the receiving block stays empty; a value the steps do not write (the observation of a lane that
    ended without restarting) is not read."""
    block = StepBlock(SPEC, lanes=[0, 1], steps=2)
    block.start(np.ones(2, bool))
    z = np.zeros(2, bool)
    obs = np.ones((2, 2), np.float32)
    block.put(np.array([1, 2]), TimeStep(obs, np.zeros(2, np.float32), z, z, z, z))
    block.put(np.array([3, 0]), TimeStep(obs, np.zeros(2, np.float32), np.array([True, False]), z,
                                         z, np.array([True, False]), obs))
    good = block.state_dict()
    receiver = StepBlock(SPEC, lanes=[0, 1], steps=2)
    cases = [("observation", ("observation", "observation", (0, 1, 0)), np.nan, "finite"),
             ("final", ("final", "observation", (1, 0, 1)), np.inf, "finite"),
             ("act", ("act", "action", (1, 1)), 4, "<= 3"),
             ("act", ("act", "reward", (0, 0)), np.nan, "finite")]
    for part, (key, name, at), value, message in cases:
        bad = pickle.loads(pickle.dumps(good))
        bad[key][name][at] = value
        with pytest.raises(ValueError, match=f"{part}.*{message}"):
            receiver.load_state_dict(bad)
        assert receiver.steps == 0
    unread = pickle.loads(pickle.dumps(good))
    unread["observation"]["observation"][1, 0] = np.nan  # lane 0 ended at step 1 and did not restart
    receiver.load_state_dict(unread)
    assert receiver.steps == 2


def test_a_cleared_block_goes_on_from_the_lanes_state():
    """clear() empties the block and keeps each lane's state after its last step: a lane that ended must start
    again, one still open goes on."""
    block = StepBlock(SPEC, lanes=[0, 1], steps=2)
    block.start(np.ones(2, bool))
    z, obs, r = np.zeros(2, bool), np.ones((2, 2), np.float32), np.zeros(2, np.float32)
    ended = np.array([True, False])
    block.put(np.array([1, 2]), TimeStep(obs, r, ended, z, z, ended, obs))
    shipped = block.state_dict()
    block.clear()
    assert block.steps == 0 and shipped["steps"] == 1
    with pytest.raises(ValueError, match="lane"):
        block.put(np.array([1, 2]), TimeStep(obs, r, z, z, z, z))  # lane 0 has no episode in progress
    block.put(np.array([0, 2]), TimeStep(obs, r, z, z, ended, z))  # lane 0 starts, lane 1 goes on
    assert block.steps == 1 and block.state_dict()["open"].all()


def test_the_block_filler_refuses_arrays_that_are_not_a_blocks():
    """The compiled block filler checks what it is handed: ValueError naming what it expected for arrays that are
    not a block's columns, flags or lane states, IndexError for a step or column outside the block."""
    from rlflow import _core

    flags, lanes = np.zeros((2, 3), bool), np.zeros(3, bool)

    def column(values):
        return _core.BlockColumn(values, exact=True, check=_core.ValueCheck.FINITE)

    def filler(**kw):
        parts = {"action": [column(np.zeros((2, 3, 4), np.float32))], "reward": [], "extras": [], "observation": [],
                 "final": [], "lanes": np.arange(3), "first": flags, "terminated": flags.copy(),
                 "truncated": flags.copy(), "is_open": lanes}
        return _core.StepBlockCore(**{**parts, **kw})

    with pytest.raises(ValueError, match="numpy array"):
        column([[1.0]])
    with pytest.raises(ValueError, match="C-contiguous"):
        column(np.zeros((2, 3, 4), np.float32)[:, :, ::2])
    with pytest.raises(ValueError, match="differs from the flags"):
        filler(reward=[column(np.zeros((3, 3), np.float32))])
    with pytest.raises(ValueError, match="is_open: expected 3 entries"):
        filler(is_open=np.zeros(2, bool))
    with pytest.raises(ValueError, match="first: expected 6 entries"):
        filler(first=flags.astype(np.int8))
    obs = [column(np.zeros((2, 3, 2), np.float32))]
    with pytest.raises(ValueError, match="one final column like each observation column"):
        filler(observation=obs, final=[column(np.zeros((2, 3, 2), np.float64))])
    core = filler(observation=obs, final=[column(np.zeros((2, 3, 2), np.float32))])
    with pytest.raises(IndexError, match="holds no stacks"):
        core.add_stack(1, np.zeros((3, 2), np.float32))
    with pytest.raises(IndexError, match="is not"):
        core.set_agents(0, np.zeros((3, 2), bool), [])
    leaves = (np.zeros((3, 4), np.float32),)
    for n in (-1, 3):
        with pytest.raises(IndexError, match=f"filled: {n} steps outside the block's 0..2"):
            core.filled = n
    core.filled = 2  # full: the next put has no row
    with pytest.raises(IndexError, match=r"steps 2\.\.3 outside the block's 2"):
        core.put(leaves, (), (), (), (), lanes, lanes, lanes, lanes)
    with pytest.raises(IndexError, match=r"steps 2\.\.4 outside the block's 2"):
        core.put_steps(2, (np.zeros((2, 3, 4), np.float32),), (), (), (), (), *[np.zeros((2, 3), bool)] * 4)
    core.filled = 0
    # A leaf of another dtype, shape or layout is not copied: the caller converts it.
    for leaf in (np.zeros((3, 4), np.float64), np.zeros((3, 5), np.float32), np.zeros((4, 3), np.float32).T, [0.0]):
        assert core.put((leaf,), (), (), (), (), lanes, lanes, lanes, lanes) is _core.Put.CONVERT
        assert core.fault_part is _core.Part.ACTION and core.fault_column == 0
    assert core.put(leaves, (), (), (), (), lanes, lanes, lanes, lanes.astype(np.int8)) is _core.Put.FLAGS
    assert core.put(leaves, (), (), (), (), lanes, lanes, lanes, lanes) is _core.Put.NO_EPISODE
    assert core.filled == 0  # nothing was put


STACKED = step_spec(specs.Field((2, 1), np.float32, stack=2), specs.Field((), np.int64, low=0, high=3))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lanes=st.integers(1, 2), t=st.integers(1, 12), stacked=st.booleans())
def test_put_steps_finds_the_fault_t_puts_find(seed, lanes, t, stacked):
    """The block filler's ``put_steps`` of T steps (flags, values and frame stacks checked over the whole range)
    reports the fault that putting the steps one at a time meets first: the same status at the same step, part,
    column and lane; on a fault the lanes' states are as before, else both blocks hold the same rows and flags."""
    rng = np.random.default_rng(seed)
    spec = STACKED if stacked else SPEC
    shape = (2, 1) if stacked else (2,)
    flags = rng.random((4, t, lanes)) < [[[0.15]], [[0.25]], [[0.15]], [[0.1]]]
    first, last, term, trunc = flags
    ok_flags = rng.random() < 0.85  # most streams keep last == terminated | truncated
    if ok_flags:  # and restart only where an episode ends
        last = term | trunc
        first = first & last
    acts = rng.integers(0, 4, (t, lanes))
    acts[rng.random((t, lanes)) < 0.1] = 7  # out of bounds
    frames = rng.standard_normal((t + 1, lanes)).astype(np.float32)
    obs = np.stack([frames[:-1], frames[1:]], -1)[..., None] if stacked else rng.standard_normal(
        (t, lanes, 2)).astype(np.float32)
    obs = np.ascontiguousarray(obs.reshape(t, lanes, *shape))
    obs[rng.random((t, lanes)) < 0.1] = np.nan
    fin = np.ascontiguousarray(obs + (rng.random((t, lanes, *shape)) < 0.05).astype(np.float32))
    rews = rng.standard_normal((t, lanes)).astype(np.float32)
    rews[rng.random((t, lanes)) < 0.05] = np.inf
    open0 = rng.random(lanes) < 0.8 if rng.random() < 0.2 else np.ones(lanes, bool)

    def block() -> StepBlock:
        b = StepBlock(spec, lanes=list(range(lanes)), steps=t)
        stacks = {name: np.repeat(frames[:1].reshape(lanes, 1, 1), 2, axis=1) for name in b.stacked}
        b.start(open0.copy(), None, stacks or None)
        return b

    bulk, one = block(), block()
    status = bulk.filler.put_steps(t, (acts,), (rews,), (), (obs,), (fin,), first, last, term, trunc)
    for i in range(t):
        ref = one.filler.put((acts[i],), (rews[i],), (), (obs[i],), (fin[i],), first[i], last[i], term[i], trunc[i])
        if ref.name != "OK":
            break
    assert status == ref
    assert bulk.steps == (t if status.name == "OK" else 0)  # the filler counts the steps it took, all or none
    if status.name != "OK":
        got = (bulk.filler.fault_step, bulk.filler.fault_part, bulk.filler.fault_column, bulk.filler.fault_lane)
        want = (one.filler.fault_step, one.filler.fault_part, one.filler.fault_column, one.filler.fault_lane)
        assert got == want
        np.testing.assert_array_equal(bulk.state_dict()["open"], open0)
        return
    for key in ("first", "terminated", "truncated", "open"):
        np.testing.assert_array_equal(bulk.state_dict()[key], one.state_dict()[key], err_msg=key)
    np.testing.assert_array_equal(bulk.act["action"], one.act["action"])
    ends = bulk.terminated | bulk.truncated
    opens = bulk.first | ~ends
    np.testing.assert_array_equal(bulk.observation["observation"][opens], one.observation["observation"][opens])
    np.testing.assert_array_equal(bulk.final["observation"][ends], one.final["observation"][ends])


@pytest.mark.parametrize("count", [1, 3])
def test_within_a_step_faults_are_found_in_part_then_lane_order(count):
    """Two bad values in one step: the action's (the part an action fills in comes first) is the fault, whether
    the step is put alone or among others; of two bad lanes, the first."""
    t = count
    block = StepBlock(SPEC, lanes=[0, 1], steps=t)
    block.start(np.ones(2, bool))
    acts = np.zeros((t, 2), np.int64)
    acts[t - 1, 1] = 7  # out of bounds
    obs = np.zeros((t, 2, 2), np.float32)
    obs[t - 1, :, 0] = np.nan
    z = np.zeros((t, 2), bool)
    rews = np.zeros((t, 2), np.float32)
    core = block.filler

    def put() -> object:
        if count == 1:
            return core.put((acts[0],), (rews[0],), (), (obs[0],), (obs[0],), z[0], z[0], z[0], z[0])
        return core.put_steps(t, (acts,), (rews,), (), (obs,), (obs.copy(),), z, z, z, z)

    status = put()
    assert (status.name, core.fault_step, core.fault_part.name, core.fault_lane) == ("VALUE", t - 1, "ACTION", 1)
    acts[t - 1, 1] = 0
    status = put()
    assert (status.name, core.fault_step, core.fault_part.name, core.fault_lane) == ("VALUE", t - 1, "OBSERVATION", 0)


def test_the_call_classifier_puts_into_a_block_with_room_and_extends_an_empty_one():
    """ReplayBuffer's compiled calls refuse a block with no row for the step (add) or one that holds steps
    already (extend), naming it, and change nothing: not the block's count, not the env's state."""
    from rlflow import _core
    state, calls = np.full(1, _core.CallState.IN_EPISODE.value, np.int8), np.zeros((5, 1), bool)
    classifier = _core.CallClassifier(last=[np.zeros((1, 2), np.float32)], state=state, was=state.copy(), calls=calls)
    block = StepBlock(SPEC, lanes=[0], steps=2)
    block.start(np.ones(1, bool))
    rows = tuple(calls[row.value] for row in (_core.CallRow.RESET, _core.CallRow.LAST, _core.CallRow.TERMINATED,
                                              _core.CallRow.TRUNCATED))
    z, obs = np.zeros(1, bool), np.zeros((1, 2), np.float32)
    block.steps = 2
    with pytest.raises(IndexError, match=r"add: the block is full \(2 steps\)"):
        classifier.add(block.filler, (obs,), (np.zeros(1, np.int64),), np.ones(1, np.float32), (), (obs,), z, z, rows)
    block.steps = 1
    with pytest.raises(ValueError, match="extend: the block must be empty"):
        classifier.extend(block.filler, 0, (obs,), (np.zeros(1, np.int64),), np.ones(1, np.float32), (), (obs,),
                          z, z)
    assert block.steps == 1 and state.tolist() == [_core.CallState.IN_EPISODE.value] and not calls.any()


def test_only_replay_buffer_add_may_leave_the_env_axis_out():
    """ReplayBuffer.add's compiled call (the call classifier with the block filler) puts one env's step whose
    observations come without the env axis, as it puts one with it, and the buffer stores them as given; an
    adder's add of one lane still refuses an observation without the lane axis, naming the shape."""
    store, _, adder = _parts(lanes=1)
    adder.add_first(_reset(1))
    z = np.zeros(1, bool)
    with pytest.raises(SpecError, match=r"expected shape \(1, 2\), got \(2,\)"):
        adder.add(np.zeros(1, np.int64), TimeStep(np.zeros(2, np.float32), np.zeros(1, np.float32), z, z, z, z))
    assert store.count.tolist() == [1] and adder.staged_steps == 0
    from rlflow import _core
    for lead in ((), (1,)):  # without the env axis, and with it
        obs, nxt = np.zeros((*lead, 2), np.float32), np.ones((*lead, 2), np.float32)
        state, calls = np.full(1, _core.CallState.IN_EPISODE.value, np.int8), np.zeros((5, 1), bool)
        classifier = _core.CallClassifier(last=[np.zeros((1, 2), np.float32)], state=state, was=state.copy(),
                                          calls=calls)
        block = StepBlock(SPEC, lanes=[0], steps=4)
        block.start(np.ones(1, bool))
        rows = tuple(calls[row.value] for row in (_core.CallRow.RESET, _core.CallRow.LAST, _core.CallRow.TERMINATED,
                                                  _core.CallRow.TRUNCATED))
        bits = classifier.add(block.filler, (obs,), (np.zeros(1, np.int64),), np.ones(1, np.float32), (), (nxt,), z,
                              z, rows)
        assert bits & _core.CALL_PUT and bits & _core.CALL_KEPT, lead
        assert block.steps == 1  # the filler counted the step it took
        np.testing.assert_array_equal(block.observation["observation"][0, 0], [1, 1])
    from rlflow import ReplayBuffer
    buffer = ReplayBuffer(specs.Field((2,), np.float32), specs.Field((), np.int64, low=0, high=3), capacity=16)
    obs = np.zeros(2, np.float32)
    for i in range(3):
        buffer.add(obs, 1, 1.0, obs + i + 1, False, False)
        obs = obs + i + 1
    batch = buffer.sample(16).data
    steps = batch.next_observation - batch.observation  # transition i moves both entries by i + 1
    np.testing.assert_array_equal(steps[:, 0], steps[:, 1])
    assert set(steps[:, 0].tolist()) <= {1.0, 2.0, 3.0} and len(buffer) == 3
