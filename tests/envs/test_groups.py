"""Heterogeneous agents: groups of shared spaces, their rows, and per-agent transitions against a reference."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from ma_envs import DyingAgents, MixedAgents, all_items, n_step_targets

from rlflow import adders
from rlflow.envs import ParallelEnvironment
from rlflow.envs.groups import make_groups
from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform
from rlflow.replay.items import LANE
from rlflow.specs import SpecError

BOX4 = spaces.Box(-1, 1, (4,))
BOX6 = spaces.Box(-1, 1, (6,))
D3, D5 = spaces.Discrete(3), spaces.Discrete(5)


def groups_of(obs, act, **kw):
    return {g.name: list(g.agents) for g in make_groups(list(obs), obs.__getitem__, act.__getitem__, **kw)}


# ---------------------------------------------------------------------------------------------- grouping
@pytest.mark.parametrize(("obs", "act", "expected"), [
    ({"a_0": BOX4, "a_1": BOX4}, {"a_0": D3, "a_1": D3}, {"a": ["a_0", "a_1"]}),
    # one group whenever the spaces agree, whatever the names
    ({"red_0": BOX4, "blue_0": BOX4}, {"red_0": D3, "blue_0": D3}, {"agents": ["red_0", "blue_0"]}),
    # MPE's simple_adversary: by name prefix, in order of first appearance
    ({"adversary_0": BOX4, "agent_0": BOX6, "agent_1": BOX6}, {"adversary_0": D5, "agent_0": D5, "agent_1": D5},
     {"adversary": ["adversary_0"], "agent": ["agent_0", "agent_1"]}),
    # the action space alone splits a prefix's agents apart: group by spaces
    ({"x_0": BOX4, "x_1": BOX4, "x_2": BOX4}, {"x_0": D3, "x_1": D5, "x_2": D3},
     {"group_0": ["x_0", "x_2"], "group_1": ["x_1"]}),
    # interleaved prefixes keep the team's order within each group
    ({"p_0": BOX4, "q_0": BOX6, "p_1": BOX4}, {"p_0": D3, "q_0": D3, "p_1": D3},
     {"p": ["p_0", "p_1"], "q": ["q_0"]}),
])
def test_agents_are_grouped_by_shared_spaces(obs, act, expected):
    assert groups_of(obs, act) == expected


def test_given_groups_are_checked():
    obs = {"a_0": BOX4, "a_1": BOX4, "b_0": BOX6}
    act = dict.fromkeys(obs, D3)
    assert groups_of(obs, act, groups={"team": ["a_1", "a_0"], "b": ["b_0"]}) == {"team": ["a_0", "a_1"],
                                                                                  "b": ["b_0"]}
    for groups, match in [({"a": ["a_0", "a_1"]}, r"\['b_0'\] are in no group"),
                          ({"a": ["a_0", "a_1", "b_0"]}, "share one observation space"),
                          ({"a": ["a_0", "a_1"], "b": ["b_0", "a_0"]}, "in both"),
                          ({"a": ["a_0", "a_1"], "b": ["c_0"]}, "not one of possible_agents"),
                          ({"a": ["a_0", "a_1"], "b/c": ["b_0"]}, "without '/'"),
                          ({"a": ["a_0", "a_1"], "b": ["b_0"], "c": []}, "at least one agent")]:
        with pytest.raises(SpecError, match=match):
            groups_of(obs, act, groups=groups)


# ---------------------------------------------------------------------------------------------- the wrapper
def test_a_grouped_team_stores_each_group_with_its_own_shapes_and_no_padding():
    env = ParallelEnvironment([MixedAgents(kinds="stts"), MixedAgents(kinds="stts")], action_mask="info")
    assert {name: (g.agents, g.indices) for name, g in env.groups.items()} == {
        "scout": (("scout_0", "scout_1"), (0, 3)), "tank": (("tank_0", "tank_1"), (1, 2))}
    obs = env.observation_spec
    assert obs["obs"]["scout"].shape == (2, 4) and obs["obs"]["scout"].dtype == np.float32
    assert obs["obs"]["tank"].shape == (2, 6) and obs["obs"]["tank"].dtype == np.float64
    assert set(obs["action_mask"]) == {"scout"} and obs["action_mask"]["scout"].shape == (2, 4)
    assert obs["active"].shape == (4,) and env.reward_spec.shape == (4,)
    assert env.action_spec["scout"].shape == (2,) and env.action_spec["tank"].shape == (2, 2)
    assert env.single_action_space == spaces.Dict({"scout": spaces.MultiDiscrete([4, 4]),
                                                   "tank": spaces.Box(-1.0, 1.0, (2, 2), np.float32)})
    with pytest.raises(AttributeError, match=r"env.groups\[name\]"):
        _ = env.single_agent_observation_space
    # memory per row: the sum of the agents' own fields (no agent padded to another's shape)
    store = StepStore(env.spec, capacity=8, lanes=2)
    own = (2 * 4 * 4 + 2 * 6 * 8  # observations: scouts float32 [4], tanks float64 [6]
           + 3 * 4 + 2 * 4  # active, terminated, truncated per agent; the scouts' masks
           + 3 * 4  # state
           + 2 * 8 + 2 * 2 * 4  # actions: scouts int64, tanks float32 [2]
           + 4 * 4 + 4)  # rewards per agent; the row's terminated, truncated, first and last
    assert sum(f.nbytes for f in store.fields.values()) == own


def test_each_agent_gets_its_own_action_and_its_observation_lands_in_its_group():
    raw = [MixedAgents(kinds="stts", seed=3, p_term=0.2, max_steps=5)]
    env = ParallelEnvironment(raw, action_mask="info")
    ts = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(12):
        actions = {"scout": rng.integers(0, 4, (1, 2)), "tank": rng.uniform(-1, 1, (1, 2, 2)).astype(np.float32)}
        before = ts
        ts = env.step(actions)
        acting, acts, _, _, _, obs = raw[0].history[-1 if not ts.last[0] else -2][-1]
        for group, g in env.groups.items():
            for pos, agent in enumerate(g.agents):
                if agent in acting:
                    np.testing.assert_array_equal(acts[agent], actions[group][0, pos])
                    assert before.observation["active"][0, g.indices[pos]]
                    seen = (ts.final_observation if ts.last[0] else ts.observation)["obs"][group][0, pos]
                    np.testing.assert_array_equal(seen, obs[agent])
        scouts = ts.observation["action_mask"]["scout"][0]
        active = ts.observation["active"][0, [0, 3]]
        assert (scouts.sum(axis=1) == np.where(active, 3, 0)).all()  # one illegal action each, none when inactive


def test_one_group_keeps_the_team_layout():
    env = ParallelEnvironment([DyingAgents()])
    assert {name: g.agents for name, g in env.groups.items()} == {"agents": ("a0", "a1", "a2")}
    assert env.observation_spec["obs"].shape == (3, 4) and env.action_spec.shape == (3,)
    assert env.single_agent_action_space == spaces.Discrete(3)


# ---------------------------------------------------------------------------------------------- transitions
def make(raw, n, discount, capacity, **kw):
    env = ParallelEnvironment(raw, action_mask="info", **kw)
    store = StepStore(env.spec, capacity=capacity, lanes=env.num_envs)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.MultiAgentTransition(store, [table], n=n, discount=discount, groups=env.groups)
    return env, store, table, adder


def collect(env, adder, steps, seed):
    rng = np.random.default_rng(seed)
    ts = env.reset(seed=seed)
    adder.add_first(ts)
    for _ in range(steps):
        actions = {name: (rng.integers(0, 4, (env.num_envs, len(g.agents))) if name == "scout" else
                          rng.uniform(-1, 1, (env.num_envs, len(g.agents), 2)).astype(np.float32))
                   for name, g in env.groups.items()}
        ts = env.step(actions)
        adder.add(actions, ts)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(0, 50), st.integers(0, 2**16),
       st.sampled_from([8, 16, 512]), st.sampled_from(["stts", "tsst", "sstt"]))
def test_per_agent_transitions_of_a_grouped_team_match_the_reference(lanes, n, steps, seed, capacity, kinds):
    g = 0.9
    raw = [MixedAgents(kinds=kinds, seed=seed + e, lane_id=e, p_term=0.15, p_trunc=0.05, max_steps=9)
           for e in range(lanes)]
    env, _store, table, adder = make(raw, n, g, capacity)
    collect(env, adder, steps, seed)
    meta, batch = all_items(table)
    per_agent = adders.split_agents(batch, env.groups)
    parts = adders.split_groups(batch, env.groups)
    for b in range(meta.shape[0]):
        lane = int(meta[b, LANE])
        t, episode = (int(x) for x in batch.observation["state"][b, :2])
        expected = n_step_targets(raw[lane], n, g, episode, t)
        for group, grp in env.groups.items():
            for pos, (agent, i) in enumerate(zip(grp.agents, grp.indices, strict=True)):
                active, ret, disc, nxt, act = expected[agent]
                mine = per_agent[i]
                assert batch.observation["active"][b, i] == active == mine.observation["active"][b]
                np.testing.assert_allclose([batch.reward[b, i], mine.reward[b], parts[group].reward[b, pos]],
                                           [ret] * 3, rtol=1e-6, atol=1e-6)
                np.testing.assert_allclose([batch.discount[b, i], mine.discount[b]], [disc] * 2, rtol=1e-6)
                if active:
                    np.testing.assert_array_equal(batch.next_observation["obs"][group][b, pos], nxt)
                    np.testing.assert_array_equal(mine.next_observation["obs"][b], nxt)
                    np.testing.assert_array_equal(mine.action[b], act)
                    np.testing.assert_array_equal(parts[group].action[b, pos], act)
                    assert mine.observation["obs"][b][0] == i and mine.observation["obs"][b][1] == t
                np.testing.assert_array_equal(mine.observation["state"][b], batch.observation["state"][b])


def test_a_grouped_store_needs_the_groups_and_they_must_be_its_own():
    env = ParallelEnvironment([MixedAgents()], action_mask="info")
    store = StepStore(env.spec, capacity=16)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    with pytest.raises(SpecError, match=r"pass groups=env.groups"):
        adders.MultiAgentTransition(store, [table])
    other = ParallelEnvironment([MixedAgents(kinds="sttts")], action_mask="info")
    with pytest.raises(SpecError, match=r"groups\['tank'\]: expected the store's observation/obs/tank columns"):
        adders.MultiAgentTransition(store, [table], groups=other.groups)
    assert table.size == 0


def test_flatten_agents_works_per_group():
    env, _store, table, adder = make([MixedAgents(seed=1, p_term=0.3)], 2, 0.5, 64)
    collect(env, adder, 10, 0)
    _meta, batch = all_items(table)
    tanks = adders.split_groups(batch, env.groups)["tank"]
    flat, idx = adders.flatten_agents(tanks)
    assert flat.observation["obs"].shape == (int(tanks.observation["active"].sum()), 6)
    assert flat.action.shape[1:] == (2,) and "action_mask" not in flat.observation
    np.testing.assert_array_equal(flat.observation["obs"][:, 0], np.asarray(env.groups["tank"].indices)[idx[:, 1]])


def test_sequences_and_episodes_of_a_grouped_team():
    env = ParallelEnvironment([MixedAgents(seed=2, p_term=0.0, p_trunc=0.0, max_steps=4)], action_mask="info")
    store = StepStore(env.spec, capacity=64, lanes=1)
    episodes = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.Episode(store, [episodes], max_length=6)
    collect(env, adder, 8, 0)
    s = episodes.sample(3)
    assert s.data["observation"]["obs"]["scout"].shape == (3, 6, 2, 4)
    assert s.data["observation"]["obs"]["tank"].shape == (3, 6, 2, 6)
    assert s.data["action"]["tank"].shape == (3, 6, 2, 2) and s.mask.sum(axis=1).tolist() == [5, 5, 5]
    np.testing.assert_array_equal(s.data["observation"]["obs"]["tank"][0, :5, 1, 1], np.arange(5))


class _Speaker(DyingAgents):
    """DyingAgents whose agent a0 has a 2-long observation and Discrete(2) actions (a speaker)."""

    @functools.cache  # noqa: B019
    def observation_space(self, agent):
        return spaces.Box(-np.inf, np.inf, (2,) if agent == "a0" else (4,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return spaces.Discrete(2 if agent == "a0" else 3)

    def _obs(self, agent):
        o = super()._obs(agent)
        return o[:2] if agent == "a0" else o


def test_a_dying_agent_of_a_group_keeps_its_final_observation_and_later_rows_are_zero():
    env = ParallelEnvironment([_Speaker(deaths=(2, None, 4))], action_mask=None)
    assert {n: g.agents for n, g in env.groups.items()} == {"group_0": ("a0",), "group_1": ("a1", "a2")}
    store = StepStore(env.spec, capacity=32)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.MultiAgentTransition(store, [table], n=3, discount=0.5, groups=env.groups)
    ts = env.reset(seed=0)
    adder.add_first(ts)
    for _ in range(5):
        actions = {"group_0": np.ones((1, 1), np.int64), "group_1": np.full((1, 2), 2)}
        ts = env.step(actions)
        adder.add(actions, ts)
    rows = store.take(np.arange(6))
    np.testing.assert_array_equal(rows["observation/obs/group_0"][:, 0, 1], [0, 1, 2, 0, 0, 0])  # dies at 2
    np.testing.assert_array_equal(rows["observation/active"][:, 0], [1, 1, 0, 0, 0, 0])
    _meta, batch = all_items(table)
    first = adders.split_agents(batch, env.groups)
    # the window from t = 0: a0 ends at j = 2 with its final observation, a2 dies at 4 (past the window)
    np.testing.assert_array_equal(first[0].next_observation["obs"][0], [0, 2])
    assert first[0].discount[0] == 0.0 and first[2].discount[0] == 0.125
    np.testing.assert_allclose(first[0].reward[0], (0 + 0 + 1) + 0.5 * (0 + 1 + 1))


def test_run_collects_from_a_grouped_team():
    import rlflow

    class Random(rlflow.Policy):
        def act(self, observation, state, *, evaluation=False):
            e = observation["active"].shape[0]
            return {"scout": np.ones((e, 2), np.int64), "tank": np.zeros((e, 2, 2), np.float32)}, None, state

    raw = [MixedAgents(seed=4, p_term=0.1, max_steps=6), MixedAgents(seed=5, p_term=0.1, max_steps=6)]
    env, _store, table, adder = make(raw, 2, 0.9, 256)
    result = rlflow.run(env, Random(), None, adder, table, steps=40, progress=False)
    assert result.env_steps == 40
    for e in raw:  # every action reached its agent, each kind in its own space
        for episode in e.history:
            for acting, actions, *_ in episode:
                for agent in acting:
                    expected = 1 if agent.startswith("scout") else np.zeros(2, np.float32)
                    np.testing.assert_array_equal(actions[agent], expected)
    with pytest.raises(SpecError, match=r"actions/tank: expected shape \(2, 2, 2\)"):
        env.step({"scout": np.ones((2, 2), np.int64), "tank": np.zeros((2, 2), np.float32)})
    with pytest.raises(SpecError, match=r"expected a dict with keys \['scout', 'tank'\]"):
        env.step(np.ones((2, 4), np.int64))
