"""The ReplayBuffer facade against a plain list of the transitions added."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.replay import ReplayBuffer
from rlflow.replay._item_kernels import LANE, LENGTH, START, VALID
from rlflow.specs import SpecError

OBS = spaces.Box(-10, 10, (3,), np.float32)
ACT = spaces.Discrete(4)
G = 0.9


def all_transitions(buf):
    buf.flush()
    it = buf.table.items()
    meta = np.zeros((it["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = it["lane"], it["start"], it["length"], it["valid"]
    b, _ = buf.table.view.gather(buf.store, meta, {"return": it["field/return"], "discount": it["field/discount"]})
    return sorted((tuple(b.observation[i]), int(b.action[i]), round(float(b.reward[i]), 4),
                   round(float(b.discount[i]), 5), tuple(b.next_observation[i])) for i in range(it["key"].size))


def reference(transitions, n, closed):
    """n-step transitions from a list of (obs, action, reward, next_obs, terminated, truncated).

    An episode ends on terminated/truncated, or where the next transition's obs is not this next_obs
    (then it is truncated there). The last episode is open unless ``closed``.
    """
    episodes, cur = [], []
    for i, tr in enumerate(transitions):
        cur.append(tr)
        nxt = transitions[i + 1] if i + 1 < len(transitions) else None
        ended = tr[4] or tr[5] or (nxt is not None and nxt[0] != tr[3])
        if ended or nxt is None:
            episodes.append((cur, ended or closed, tr[4]))
            cur = []
    out = []
    for steps, done, terminated in episodes:
        T = len(steps)
        for t in range(T):
            k = min(n, T - t)
            if not done and t + n > T:
                continue
            ret = sum(G**j * steps[t + j][2] for j in range(k))
            disc = 0.0 if (done and terminated and t + k == T) else G**k
            out.append((steps[t][0], steps[t][1], round(float(np.float32(ret)), 4),
                        round(float(np.float32(disc)), 5), steps[t + k - 1][3]))
    return sorted(out)


# How a one-env caller may pass an action and a reward (the compiled path takes the first three of each;
# the others go through the general path, which converts them).
ACTION_FORMS = [int, np.int64, lambda a: np.array(a, np.int64), np.int32, np.uint8]
REWARD_FORMS = [float, np.float32, np.float64, lambda r: np.array(r, np.float32), int]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 4), st.lists(st.sampled_from(["mid", "mid", "mid", "term", "trunc", "jump", "equal", "equal64"]),
                                   max_size=30),
       st.booleans(), st.lists(st.integers(0, 4), min_size=2, max_size=2), st.integers(3, 9))
def test_matches_the_transitions_added(n, plan, close, forms, block):
    """Transitions added one at a time (the compiled one-call path when the episode goes on from the last
    next_obs object, the general path otherwise), with every block size, equal their plain list."""
    rng = np.random.default_rng(len(plan))
    buf = ReplayBuffer(OBS, ACT, capacity=256, n_step=n, discount=G)
    buf._block = {k: v[:block] for k, v in buf._block.items()}  # blocks fill and flush inside the episodes
    if buf._fast is not None:
        buf._fast = (*buf._fast[:7], buf._block["action"], buf._block["reward"], buf._block["observation"])
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
    assert all_transitions(buf) == reference(added, n, close)


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
def test_bad_input_on_the_compiled_path_changes_nothing(bad, match):
    """A transition continuing from the last next_obs object takes the one-call path: bad values raise the
    general path's error and stage nothing (the buffer then equals one that never saw the call)."""
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
    assert buf._fast is not None and int(buf._block_rows[0]) > 0
    rows = int(buf._block_rows[0])
    args = dict(obs=last[0], action=1, reward=1.0, next_obs=np.ones(3, np.float32), terminated=False,
                truncated=False)
    args.update(bad)
    with pytest.raises(SpecError, match=match):
        buf.add(**args)
    assert int(buf._block_rows[0]) == rows
    for b in bufs:  # and both go on alike
        b.add(last[bufs.index(b)], 2, 0.5, np.full(3, 3.0, np.float32), True, False)
        b.flush()
    for k, v in ref.store.state_dict().items():
        np.testing.assert_array_equal(buf.store.state_dict()[k], v, err_msg=k)
    for k, v in ref.table.items().items():
        np.testing.assert_array_equal(buf.table.items()[k], v, err_msg=k)


def test_float16_observations_take_the_general_path():
    from rlflow import specs

    buf = ReplayBuffer(specs.Field((3,), np.float16), ACT, capacity=100)
    assert buf._fast is None
    obs = np.zeros(3, np.float16)
    for t in range(5):
        nxt = np.full(3, t + 1, np.float16)
        buf.add(obs, t % 4, 1.0, nxt, False, False)
        obs = nxt
    assert len(buf) == 5 and buf.sample(4).data.next_observation.dtype == np.float16
