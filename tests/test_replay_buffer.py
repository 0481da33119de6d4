"""The ReplayBuffer facade against a plain list of the transitions added."""

from __future__ import annotations

import numpy as np
import pytest
from buffer_reference import G, nstep_reference
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow import ReplayBuffer
from rlflow.replay.items import LANE, LENGTH, START, VALID
from rlflow.specs import SpecError

OBS = spaces.Box(-10, 10, (3,), np.float32)
ACT = spaces.Discrete(4)


def all_transitions(buf):
    buf.flush()
    it = buf.table.items()
    meta = np.zeros((it["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = it["lane"], it["start"], it["length"], it["valid"]
    b, _ = buf.table.view.gather(buf.store, meta, {"return": it["field/return"], "discount": it["field/discount"]})
    return sorted((tuple(b.observation[i]), int(b.action[i]), round(float(b.reward[i]), 4),
                   round(float(b.discount[i]), 5), tuple(b.next_observation[i])) for i in range(it["key"].size))


# How a one-env caller may pass an action and a reward (the block filler copies the first three of each as they
# come; the others are converted first).
ACTION_FORMS = [int, np.int64, lambda a: np.array(a, np.int64), np.int32, np.uint8]
REWARD_FORMS = [float, np.float32, np.float64, lambda r: np.array(r, np.float32), int]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 4), st.lists(st.sampled_from(["mid", "mid", "mid", "term", "trunc", "jump", "equal", "equal64"]),
                                   max_size=30),
       st.booleans(), st.lists(st.integers(0, 4), min_size=2, max_size=2))
def test_matches_the_transitions_added(n, plan, close, forms):
    """Transitions added one at a time (going on from the last next_obs, as another array of it, or jumping
    to an unrelated observation) equal their plain list."""
    rng = np.random.default_rng(len(plan))
    buf = ReplayBuffer(OBS, ACT, capacity=256, n_step=n, discount=G)
    added = []
    obs = rng.integers(-9, 9, 3).astype(np.float32)
    for what in plan:
        if what == "jump":  # the loop restarts from an unrelated observation without an episode end
            obs = rng.integers(-9, 9, 3).astype(np.float32)
            what = "mid"
        elif what in ("equal", "equal64"):  # the previous next_obs again, as another array (float64 too)
            obs = obs.astype(np.float64 if what == "equal64" else np.float32)  # the episode goes on
            what = "mid"
        action, reward = int(rng.integers(0, 4)), float(np.float32(rng.standard_normal()))
        if forms[1] == 4:
            reward = float(int(reward * 4))
        nxt = rng.integers(-9, 9, 3).astype(np.float32)
        term, trunc = what == "term", what == "trunc"
        buf.add(obs, ACTION_FORMS[forms[0]](action), REWARD_FORMS[forms[1]](reward), nxt, term, trunc)
        added.append((tuple(obs), action, reward, tuple(nxt), term, trunc))
        obs = rng.integers(-9, 9, 3).astype(np.float32) if term or trunc else nxt
    if close:
        buf.end_episodes()
    assert all_transitions(buf) == nstep_reference(added, n, close)


def _plan_transitions(rng, plan):
    """Transitions of one env for a plan of "mid", "term", "trunc", "jump" (restart without an end), "equal"
    (the previous next_obs again, as another array): ``(obs, action, reward, next_obs, term, trunc)``."""
    out = []
    obs = rng.integers(-9, 9, 3).astype(np.float32)
    for what in plan:
        if what == "jump":
            obs = rng.integers(-9, 9, 3).astype(np.float32)
            what = "mid"
        elif what == "equal":
            obs = obs.copy()
            what = "mid"
        nxt = rng.integers(-9, 9, 3).astype(np.float32)
        out.append((obs, int(rng.integers(0, 4)), float(np.float32(rng.standard_normal())), nxt, what == "term",
                    what == "trunc"))
        obs = rng.integers(-9, 9, 3).astype(np.float32) if what in ("term", "trunc") else nxt
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.lists(st.sampled_from(["mid", "mid", "mid", "term", "trunc", "jump", "equal"]),
                                   min_size=1, max_size=60),
       st.lists(st.integers(1, 50), min_size=1, max_size=8), st.booleans(), st.sampled_from([1, 3]),
       st.integers(0, 2))
def test_extend_matches_the_transitions_added(n, plan, chunks, close, envs, adds_first):
    """extend of consecutive transitions in chunks of any size (after a few single adds, across ring
    wrap-arounds, and in calls longer than one add_steps call takes) leaves exactly the transitions that
    add of each one leaves, for one env and for several (``[T, E, ...]``); without wrap-around, those of
    the plain list."""
    rng = np.random.default_rng(len(plan) + 7 * sum(chunks))
    per_env = [_plan_transitions(rng, plan) for _ in range(envs)]
    bufs = [ReplayBuffer(OBS, ACT, capacity=40 * envs, n_step=n, discount=G, num_envs=envs) for _ in range(2)]
    t = len(plan)

    def add(buf, i):
        row = [tr[i] for tr in per_env]
        buf.add(*(row[0] if envs == 1 else (np.array([r[j] for r in row]) for j in range(6))))

    for i in range(t):
        add(bufs[1], i)
    i = 0
    while i < min(adds_first, t):  # single adds before: extend goes on from them
        add(bufs[0], i)
        i += 1
    c = 0
    while i < t:
        z = min(t, i + chunks[c % len(chunks)])
        c += 1
        cols = [np.array([[tr[s][j] for tr in per_env] for s in range(i, z)]) for j in range(6)]
        bufs[0].extend(*(col[:, 0] for col in cols) if envs == 1 else cols)
        i = z
    if close:
        for buf in bufs:
            buf.end_episodes()
    got, want = all_transitions(bufs[0]), all_transitions(bufs[1])
    assert got == want
    if max(int(c) for c in bufs[1].store.count) <= bufs[1].store.capacity:  # nothing overwritten yet
        assert got == sorted(x for tr in per_env for x in nstep_reference(
            [(tuple(o), a, r, tuple(nx), te, tu) for o, a, r, nx, te, tu in tr], n, close))


@pytest.mark.parametrize("envs", [1, 3])
def test_one_extend_longer_than_the_ring_matches_the_adds(envs):
    """One extend of 120 transitions into rings of 40 rows per env: written in several add_steps calls
    (each at most capacity - n - 2 steps), over wrap-arounds, ending where adds of each end."""
    rng = np.random.default_rng(3)
    plan = list(rng.choice(["mid"] * 8 + ["term", "trunc", "jump", "equal"], 120))
    plan[34], plan[70] = "term", "jump"  # episodes that start right at a call's first step (calls of 35 steps)
    per_env = [_plan_transitions(rng, plan) for _ in range(envs)]
    bufs = [ReplayBuffer(OBS, ACT, capacity=40 * envs, n_step=3, discount=G, num_envs=envs) for _ in range(2)]
    for i in range(len(plan)):
        row = [tr[i] for tr in per_env]
        bufs[1].add(*(row[0] if envs == 1 else (np.array([r[j] for r in row]) for j in range(6))))
    cols = [np.array([[tr[s][j] for tr in per_env] for s in range(len(plan))]) for j in range(6)]
    bufs[0].extend(*(col[:, 0] for col in cols) if envs == 1 else cols)
    assert all_transitions(bufs[0]) == all_transitions(bufs[1])
    assert len(bufs[0]) >= 25 * envs  # the ring is full of transitions


def test_extend_bad_input_changes_nothing():
    """A bad value anywhere in an extend (the last step's next_obs, a flag) raises and changes nothing."""
    buf = ReplayBuffer(OBS, ACT, capacity=64, n_step=2)
    obs = np.zeros((5, 3), np.float32)
    nxt = np.arange(15, dtype=np.float32).reshape(5, 3) % 9
    buf.extend(obs, np.ones(5, np.int64), np.ones(5), nxt, np.zeros(5, bool), np.zeros(5, bool))
    before = {k: v.copy() for k, v in buf.store.state_dict().items()}, buf.table.items()
    bad_next = nxt.copy()
    bad_next[4, 0] = np.nan
    cases = [(dict(next_obs=bad_next), "finite"), (dict(action=np.array([1, 1, 1, 9, 1])), "action"),
             (dict(terminated=np.zeros(4, bool)), "terminated and truncated: expected the same number of steps"),
             (dict(reward=np.ones(4)), "reward"),
             (dict(truncated=np.array(["no"] * 5)), "truncated"), (dict(obs=np.zeros((5, 4), np.float32)), "shape")]
    for bad, match in cases:
        args = dict(obs=nxt, action=np.ones(5, np.int64), reward=np.ones(5), next_obs=nxt + 1,
                    terminated=np.array([0, 0, 1, 0, 0], bool), truncated=np.zeros(5, bool))
        args.update(bad)
        with pytest.raises((SpecError, ValueError), match=match):
            buf.extend(**args)
        for k, v in buf.store.state_dict().items():
            np.testing.assert_array_equal(v, before[0][k], err_msg=k)
        for k, v in buf.table.items().items():
            np.testing.assert_array_equal(v, before[1][k], err_msg=k)


def test_batched_envs_store_each_observation_once():
    buf = ReplayBuffer(OBS, ACT, capacity=1000, num_envs=4, n_step=1)
    obs = np.zeros((4, 3), np.float32)
    for t in range(10):
        nxt = np.full((4, 3), t + 1, np.float32)
        buf.add(obs, np.zeros(4, np.int64), np.ones(4, np.float32), nxt, np.zeros(4, bool), np.zeros(4, bool))
        obs = nxt
    assert len(buf) == 40
    assert len(buf.store) == 44  # 11 observations per env, each stored once
    batch = buf.sample(8).data
    np.testing.assert_array_equal(batch.next_observation, batch.observation + 1)


def test_one_envs_transitions_are_staged_in_blocks_of_256():
    """One env's adds wait in the adder's block (the store holds only the reset row) until the 256th writes
    them all; ``len`` writes what is staged first."""
    buf = ReplayBuffer(OBS, ACT, capacity=1000)
    obs = np.zeros(3, np.float32)
    for t in range(300):
        nxt = np.full(3, t % 7, np.float32) + (t + 1) * 1e-3
        buf.add(obs, 1, 1.0, nxt, False, False)
        obs = nxt
        if t == 254:
            assert buf.adder.staged_steps == 255 and int(buf.store.count[0]) == 1
    assert buf.adder.staged_steps == 300 - 256 and int(buf.store.count[0]) == 257
    assert len(buf) == 300 and buf.adder.staged_steps == 0


def test_a_buffer_on_disk_holds_what_one_in_memory_holds(tmp_path):
    """``disk=`` keeps the rows as memmaps in that directory; the transitions and samples are the same."""
    bufs = [ReplayBuffer(OBS, ACT, capacity=50, n_step=2, seed=3),
            ReplayBuffer(OBS, ACT, capacity=50, n_step=2, seed=3, disk=tmp_path / "rows")]
    rng = np.random.default_rng(0)
    obs = np.zeros(3, np.float32)
    for _ in range(80):
        nxt = rng.uniform(-5, 5, 3).astype(np.float32)
        done = bool(rng.random() < 0.1)
        for buf in bufs:
            buf.add(obs, 2, 0.5, nxt, done, False)
        obs = np.zeros(3, np.float32) if done else nxt
    assert bufs[1].store.backend == "disk" and any((tmp_path / "rows").iterdir())
    assert all_transitions(bufs[0]) == all_transitions(bufs[1])
    a, b = (buf.sample(16).data for buf in bufs)
    np.testing.assert_array_equal(a.observation, b.observation)
    np.testing.assert_array_equal(a.next_observation, b.next_observation)


def test_prioritized_updates_and_weights():
    buf = ReplayBuffer(OBS, ACT, capacity=100, prioritized=True, seed=0)
    obs = np.zeros(3, np.float32)
    for t in range(20):
        nxt = np.full(3, t + 1, np.float32)
        buf.add(obs, 1, 1.0, nxt, False, False)
        obs = nxt
    s = buf.sample(16)
    assert buf.update_priorities(s.keys, np.arange(16) + 1.0) == 16
    assert s.weights.shape == (16,)


@pytest.mark.parametrize("bad,match", [
    (dict(action=7), "<= 3"),
    (dict(obs=np.zeros(4, np.float32)), "shape"),
    (dict(next_obs=np.full(3, np.nan, np.float32)), "finite"),
    (dict(terminated="yes"), "terminated"),
])
def test_bad_input_changes_nothing(bad, match):
    buf = ReplayBuffer(OBS, ACT, capacity=64, n_step=2)
    obs = np.zeros(3, np.float32)
    for t in range(70):  # wrap the ring
        nxt = np.full(3, t % 9, np.float32)
        buf.add(obs, 1, 1.0, nxt, t % 13 == 0, False)
        obs = np.zeros(3, np.float32) if t % 13 == 0 else nxt
    before = {k: v.copy() for k, v in buf.store.state_dict().items()}, buf.table.items()
    args = dict(obs=np.ones(3, np.float32), action=1, reward=1.0, next_obs=np.ones(3, np.float32),
                terminated=False, truncated=False)
    args.update(bad)
    with pytest.raises((SpecError, ValueError), match=match):
        buf.add(**args)
    for k, v in buf.store.state_dict().items():
        np.testing.assert_array_equal(v, before[0][k])
    for k, v in buf.table.items().items():
        np.testing.assert_array_equal(v, before[1][k])


def test_dict_observations_extras_and_reused_arrays():
    """Nested observations and extras go through the one-env path; arrays reused by the caller are copied."""
    from rlflow import specs

    obs_space = spaces.Dict({"pos": spaces.Box(-5, 5, (2,), np.float32), "id": spaces.Discrete(3)})
    buf = ReplayBuffer(obs_space, ACT, capacity=64, extras={"logp": specs.Field((), np.float32)})
    pos = np.zeros(2, np.float32)  # one array the caller mutates in place, as some envs do
    obs = {"pos": pos.copy(), "id": 0}
    for t in range(5):
        pos[:] = t + 1
        nxt = {"pos": pos, "id": (t + 1) % 3}
        buf.add(obs, t % 4, 1.0, nxt, t == 4, False, extras={"logp": np.float32(-t)})
        obs = {"pos": pos.copy(), "id": (t + 1) % 3}
    batch = all_dict_transitions(buf)
    assert batch.next_observation["pos"][:, 0].tolist() == [1, 2, 3, 4, 5]
    assert batch.observation["id"].tolist() == [0, 1, 2, 0, 1]
    assert batch.extras["logp"].tolist() == [0, -1, -2, -3, -4]
    with pytest.raises(SpecError, match="extras"):
        buf.add(obs, 1, 1.0, obs, False, False, extras={"logp": 0.0, "typo": 1.0})
    with pytest.raises(SpecError, match="id"):
        buf.add(obs, 1, 1.0, {"pos": pos, "id": 5}, False, False, extras={"logp": 0.0})


def all_dict_transitions(buf):
    buf.flush()
    it = buf.table.items()
    order = np.argsort(it["start"])
    meta = np.zeros((it["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = it["lane"], it["start"], it["length"], it["valid"]
    b, _ = buf.table.view.gather(buf.store, meta[order], {"return": it["field/return"][order],
                                                          "discount": it["field/discount"][order]})
    return b


@pytest.mark.parametrize("bad,match", [
    (dict(action=7), "<= 3"),
    (dict(action=-1), ">= 0"),
    (dict(action=2**70), "action"),
    (dict(action=np.array([1])), "shape"),
    (dict(reward=float("nan")), "finite"),
    (dict(reward=np.float32("inf")), "finite"),
    (dict(next_obs=np.array([0.0, np.inf, 0.0], np.float32)), "finite"),
    (dict(next_obs=np.zeros(3, np.float64) + 0.5, action=9), "<= 3"),
    (dict(terminated=2), "terminated"),
])
def test_bad_input_after_a_partly_filled_block_changes_nothing(bad, match):
    """A transition continuing from the last next_obs object, with bad values, raises the spec's error and stages
    nothing (the buffer then equals one that never saw the call)."""
    bufs = [ReplayBuffer(OBS, ACT, capacity=64, n_step=2) for _ in range(2)]
    last = []
    for buf in bufs:
        obs = np.zeros(3, np.float32)
        for t in range(75):  # wrap the ring, leave a partly filled block
            nxt = np.full(3, t % 9, np.float32)
            buf.add(obs, t % 4, 1.0, nxt, t % 13 == 0, False)
            obs = np.zeros(3, np.float32) if t % 13 == 0 else nxt
        last.append(obs)
    buf, ref = bufs
    rows = buf.adder.staged_steps
    assert rows > 0
    args = dict(obs=last[0], action=1, reward=1.0, next_obs=np.ones(3, np.float32), terminated=False,
                truncated=False)
    args.update(bad)
    with pytest.raises(SpecError, match=match):
        buf.add(**args)
    assert buf.adder.staged_steps == rows
    for b in bufs:  # and both go on alike
        b.add(last[bufs.index(b)], 2, 0.5, np.full(3, 3.0, np.float32), True, False)
        b.flush()
    for k, v in ref.store.state_dict().items():
        np.testing.assert_array_equal(buf.store.state_dict()[k], v, err_msg=k)
    for k, v in ref.table.items().items():
        np.testing.assert_array_equal(buf.table.items()[k], v, err_msg=k)


def test_float16_observations_are_converted_and_kept():
    """float16 observations (which the block filler leaves to the spec's checks) are stored, not refused."""
    from rlflow import specs

    buf = ReplayBuffer(specs.Field((3,), np.float16), ACT, capacity=100)
    obs = np.zeros(3, np.float16)
    for t in range(5):
        nxt = np.full(3, t + 1, np.float16)
        buf.add(obs, t % 4, 1.0, nxt, False, False)
        obs = nxt
    assert len(buf) == 5 and buf.sample(4).data.next_observation.dtype == np.float16


def test_a_pickled_buffer_goes_on_as_the_original():
    """A buffer pickled right after an episode end (its envs' states, last next_obs and staged steps inside) and
    the original, fed the same calls afterwards (a NEXT_STEP reset step first, which both must leave out), hold
    the same rows and transitions."""
    import pickle

    buf = ReplayBuffer(OBS, ACT, capacity=128, n_step=2, num_envs=2)
    rng = np.random.default_rng(3)
    obs = rng.integers(-9, 9, (2, 3)).astype(np.float32)
    for t in range(12):
        nxt = rng.integers(-9, 9, (2, 3)).astype(np.float32)
        end = np.array([t == 11, t % 5 == 4])
        buf.add(obs, np.array([t % 4, 1]), np.ones(2, np.float32), nxt, end, np.zeros(2, bool))
        obs = nxt
    twin = pickle.loads(pickle.dumps(buf))
    for b in (buf, twin):
        o = obs
        b.add(o, np.array([0, 2]), np.array([0.0, 0.5], np.float32), o + 1, np.zeros(2, bool), np.zeros(2, bool))
        for t in range(6):
            b.add(o + 1 + t, np.array([t % 4, 3]), np.full(2, t, np.float32), o + 2 + t, np.array([t == 5, False]),
                  np.zeros(2, bool))
    # 24 transitions, then 7 a env less env 0's reset step; env 1's newest waits for its second reward (n=2)
    assert all_transitions(buf) == all_transitions(twin) and len(buf) == len(twin) == 24 + 6 + 7 - 1
    for k, v in buf.store.state_dict().items():
        np.testing.assert_array_equal(twin.store.state_dict()[k], v, err_msg=k)


def test_the_old_import_path_names_the_new_one():
    with pytest.raises(ImportError, match="from rlflow import ReplayBuffer"):
        from rlflow.replay import ReplayBuffer  # noqa: F401


def test_the_call_classifier_refuses_arrays_it_cannot_keep():
    """The compiled call classifier checks the arrays it keeps (ValueError naming what it expected) and the flags
    of each call; an observation or reward it cannot compare as it is comes back to be converted, nothing
    changed."""
    from rlflow import _core

    state, was, calls = np.zeros(2, np.int8), np.zeros(2, np.int8), np.zeros((5, 2), bool)
    last = [np.zeros((2, 3), np.float32)]
    with pytest.raises(ValueError, match="state"):
        _core.CallClassifier(last=last, state=np.zeros(2, np.int64), was=was, calls=calls)
    with pytest.raises(ValueError, match="calls"):
        _core.CallClassifier(last=last, state=state, was=was, calls=np.zeros((4, 2), bool))
    with pytest.raises(ValueError, match="one row per env"):
        _core.CallClassifier(last=[np.zeros((3, 3), np.float32)], state=state, was=was, calls=calls)
    classifier = _core.CallClassifier(last=last, state=state, was=was, calls=calls)
    no = np.zeros(2, bool)
    with pytest.raises(ValueError, match="bool arrays of one flag per env"):
        classifier.classify((last[0],), no.astype(np.int8), no, np.zeros(2, np.float32))
    state[:] = 1
    for obs, reward in (((np.zeros((2, 3)),), np.zeros(2, np.float32)), ((np.zeros((2, 4), np.float32),), None),
                        ((last[0],), np.zeros((2, 2), np.float32)[:, 0])):
        assert classifier.classify(obs, no, no, reward) == _core.CALL_CONVERT
        assert state.tolist() == [1, 1] and not calls.any()
    assert classifier.classify((last[0],), no, no, np.zeros(2, np.float32)) == 0
    assert not calls[_core.CallRow.STARTS.value].any()  # both envs go on from their last next_obs
    assert not classifier.remember((np.zeros((2, 3), np.float64),))
    assert classifier.remember((np.ones((2, 3), np.float32),))
    np.testing.assert_array_equal(last[0], 1.0)


def test_strided_and_other_equal_dtype_inputs_are_taken_as_contiguous_ones():
    """Flags that are strided views and obs of an equal dtype spelled otherwise (int64 as ``longlong``) give the
    same transitions as plain arrays."""
    from rlflow import specs

    def run(flag_view, dtype_of_obs, field_dtype):
        buf = ReplayBuffer(specs.Field((2,), field_dtype), ACT, capacity=64, num_envs=2)
        obs = np.zeros((2, 2), field_dtype)
        for t in range(9):
            nxt = np.full((2, 2), t + 1, field_dtype)
            flags = np.zeros((2, 3), bool)
            flags[:, 0] = [t == 4, t == 7]
            term = flags[:, 0] if flag_view else flags[:, 0].copy()
            buf.add(obs.astype(dtype_of_obs), np.array([t % 4, 1]), np.ones(2, np.float32), nxt, term,
                    np.zeros((2, 2), bool)[:, 1])
            obs = nxt
        return all_transitions(buf), len(buf)

    plain = run(False, np.int64, np.int64)
    assert plain[1] == 18  # one transition a call and env (n_step=1: none waits)
    assert run(True, np.longlong, np.int64) == plain


def test_a_nonzero_complex_reward_after_an_episode_end_is_refused_not_dropped():
    """A call right after an episode end whose obs is that end's next_obs and whose reward is not zero (here a
    complex number, which the spec refuses) is not a reset step: it raises, naming the reward."""
    buf = ReplayBuffer(OBS, ACT, capacity=64)
    o = np.zeros(3, np.float32)
    buf.add(o, 1, 1.0, o + 1, True, False)
    with pytest.raises(SpecError, match="reward"):
        buf.add(o + 1, 1, np.complex64(1j), o + 2, False, False)
    buf.add(o + 1, 1, 0.0, o + 2, False, False)  # the reset step of a NEXT_STEP env: left out
    assert len(buf) == 1
