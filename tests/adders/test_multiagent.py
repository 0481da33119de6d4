"""Multi-agent: the PettingZoo parallel wrapper's rows, and per-agent n-step transitions against a reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ma_envs import DyingAgents, RandomAgents, all_items, n_step_targets

from rlflow import adders
from rlflow.envs import ParallelEnvironment
from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform
from rlflow.replay.items import LANE, LENGTH, START
from rlflow.specs import SpecError


def collect(env, adder, steps, seed=0):
    rng = np.random.default_rng(seed)
    ts = env.reset(seed=seed)
    adder.add_first(ts)
    out = [ts]
    for _ in range(steps):
        actions = rng.integers(0, env.single_agent_action_space.n, (env.num_envs, env.num_agents))
        ts = env.step(actions)
        adder.add(actions, ts)
        out.append(ts)
    return out


def make(envs, n=1, discount=0.5, capacity=256, **kw):
    env = ParallelEnvironment(envs, **kw)
    store = StepStore(env.spec, capacity=capacity, lanes=env.num_envs)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.MultiAgentTransition(store, [table], n=n, discount=discount)
    return env, store, table, adder


# ---------------------------------------------------------------------------------------------- the wrapper
def test_a_dying_agent_is_stored_active_at_its_death_step_then_inactive_and_zero():
    env, store, _table, adder = make([DyingAgents(deaths=(2, None, None), max_steps=4)], action_mask="info")
    collect(env, adder, 4)
    rows = store.take(np.arange(5))  # lane 0: rows 0..4 are the episode (4 actions + the final row)
    active = rows["observation/active"][:, 0]
    assert active.tolist() == [True, True, False, False, False]  # acts at t = 0, 1 (its death step), then not
    assert rows["observation/terminated"][:, 0].tolist() == [False, False, True, False, False]
    np.testing.assert_array_equal(rows["observation/obs"][2, 0], [0, 2, 0, 0])  # its true final observation kept
    np.testing.assert_array_equal(rows["observation/obs"][3:, 0], 0)  # then zero-filled
    assert rows["reward"][:, 0].tolist() == [0 + 0 + rows["action"][0, 0], 1 + rows["action"][1, 0], 0, 0, 0]
    np.testing.assert_array_equal(rows["action"][2:, 0], 0)
    np.testing.assert_array_equal(rows["observation/action_mask"][2:, 0], False)  # no legal action: all False
    # the others run to the time limit: truncated on the final row, which is the lane's last
    assert rows["observation/truncated"][4].tolist() == [False, True, True]
    assert rows["last"].tolist() == [False] * 4 + [True]
    assert rows["truncated"][3] and not rows["terminated"][3]


def test_the_last_step_keeps_every_reward_and_flag_although_env_agents_is_empty():
    env = ParallelEnvironment([DyingAgents(deaths=(None, 3, None), max_steps=3)])
    env.reset(seed=0)
    env.step(np.zeros((1, 3), np.int64))
    env.step(np.zeros((1, 3), np.int64))
    ts = env.step(np.array([[1, 2, 0]]))
    assert env.envs[0].agents == [] or ts.first[0]  # reset in the same call
    assert ts.reward.tolist() == [[3.0, 14.0, 22.0]]
    assert ts.last.tolist() == [True] and ts.truncated.tolist() == [True] and ts.terminated.tolist() == [False]
    assert ts.final_observation["terminated"].tolist() == [[False, True, False]]
    assert ts.final_observation["truncated"].tolist() == [[True, False, True]]
    np.testing.assert_array_equal(ts.final_observation["obs"][0, :, 1], [3, 3, 3])
    assert ts.observation["active"].all() and ts.observation["obs"][0, 0, 2] == 1  # the next episode
    assert not ts.observation["terminated"].any()


def test_one_env_ending_leaves_the_other_lanes_flags_untouched():
    env = ParallelEnvironment([DyingAgents(deaths=(None, None, None), max_steps=5),
                               DyingAgents(deaths=(1, 1, 1), max_steps=5)])
    env.reset(seed=0)
    ts = env.step(np.zeros((2, 3), np.int64))
    assert ts.last.tolist() == [False, True] and ts.terminated.tolist() == [False, True]
    assert not ts.observation["terminated"][0].any() and ts.observation["active"][0].all()
    assert ts.final_observation["terminated"][1].all() and not ts.final_observation["terminated"][0].any()
    assert ts.first.tolist() == [False, True]


def test_action_masks_from_the_observation_dict_or_from_info():
    obs_env = ParallelEnvironment([DyingAgents(mask_in_obs=True)])
    info_env = ParallelEnvironment([DyingAgents()], action_mask="info")
    for env in (obs_env, info_env):
        ts = env.reset(seed=0)
        assert ts.observation["action_mask"].tolist() == [[[False, True, True]] * 3]
        ts = env.step(np.ones((1, 3), np.int64))
        assert ts.observation["action_mask"][0, 1].tolist() == [True, False, True]
        assert ts.observation["obs"].shape == (1, 3, 4)
    assert "action_mask" not in ParallelEnvironment([DyingAgents()]).observation_spec


def test_mpe_simple_spread_state_and_time_limit():
    mpe = pytest.importorskip("mpe2.simple_spread_v3")
    env = ParallelEnvironment([mpe.parallel_env(N=3, max_cycles=5) for _ in range(2)], seed=0)
    assert env.observation_spec["obs"].shape == (3, 18) and env.observation_spec["state"].shape == (54,)
    ts = env.reset()
    for _ in range(5):
        ts = env.step(np.zeros((2, 3), np.int64))
    assert ts.last.all() and ts.truncated.all() and ts.final_observation["truncated"].all()
    assert (ts.reward < 0).all()  # the final step's rewards are kept


def test_bad_actions_and_spaces():
    env = ParallelEnvironment([DyingAgents()])
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros((1, 3), np.int64))
    env.reset()
    with pytest.raises(SpecError, match=r"expected shape \(1, 3\)"):
        env.step(np.zeros((1, 2), np.int64))
    with pytest.raises(ValueError, match="possible_agents"):
        ParallelEnvironment([DyingAgents(), DyingAgents(deaths=(1, 2))])
    with pytest.raises(ValueError, match="action_mask='observation'"):
        ParallelEnvironment([DyingAgents()], action_mask="observation")


# ---------------------------------------------------------------------------------------------- transitions
def reference(env: RandomAgents, n: int, g: float, episode: int, t: int, num_agents: int):
    """Per-agent n-step targets of the joint step ``t`` of ``episode``, from the env's own log."""
    targets = n_step_targets(env, n, g, episode, t)
    rows = [targets[f"a{i}"] for i in range(num_agents)]
    return (np.array([r[1] for r in rows]), np.array([r[2] for r in rows]),
            np.array([np.zeros(4, np.float32) if r[3] is None else r[3] for r in rows]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(0, 60), st.integers(0, 2**16), st.sampled_from([8, 16, 512]))
def test_per_agent_nstep_transitions_match_the_reference(lanes, n, steps, seed, capacity):
    g = 0.9
    raw = [RandomAgents(seed=seed + e, lane_id=e, p_term=0.15, p_trunc=0.05, max_steps=9) for e in range(lanes)]
    env, _store, table, adder = make(raw, n=n, discount=g, capacity=capacity)
    collect(env, adder, steps, seed=seed)
    meta, batch = all_items(table)
    seen = set()
    for b in range(meta.shape[0]):
        lane = int(meta[b, LANE])
        t, episode = (int(x) for x in batch.observation["state"][b, :2])
        assert (lane, episode, t) not in seen
        seen.add((lane, episode, t))
        rew, disc, nxt = reference(raw[lane], n, g, episode, t, 3)
        np.testing.assert_allclose(batch.reward[b], rew, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(batch.discount[b], disc, rtol=1e-6)
        np.testing.assert_array_equal(batch.next_observation["obs"][b], nxt)
        assert batch.observation["active"][b].tolist() == [f"a{i}" in raw[lane].history[episode][t][0]
                                                           for i in range(3)]
    if capacity == 512:  # nothing overwritten: one item per joint step whose window is complete
        expected = sum(len(ep) if i < len(e.history) - 1 else max(0, len(ep) - n + 1)
                       for e in raw for i, ep in enumerate(e.history))
        assert len(seen) == expected


def test_worked_example_of_the_module_docstring():
    # two agents; agent 1 terminates on the second step; n = 3, g = 0.5
    class Two(DyingAgents):
        def step(self, actions):
            obs, _, term, trunc, infos = super().step(actions)
            rewards = {"a0": [1.0, 2.0, 4.0][self.t - 1]}
            if "a1" in actions:
                rewards["a1"] = [10.0, 20.0][self.t - 1]
            return obs, rewards, term, trunc, infos

    env, _store, table, adder = make([Two(deaths=(None, 2), max_steps=10)], n=3, discount=0.5)
    collect(env, adder, 3)
    meta, batch = all_items(table)
    assert meta[:, START].tolist() == [0] and meta[:, LENGTH].tolist() == [4]
    np.testing.assert_allclose(batch.reward[0], [3.0, 20.0])
    np.testing.assert_allclose(batch.discount[0], [0.125, 0.0])
    np.testing.assert_array_equal(batch.next_observation["obs"][0, :, 1], [3, 2])  # rows t+3 and t+2


def test_flatten_agents_leaves_out_inactive_agents_and_repeats_the_state():
    env, _store, table, adder = make([DyingAgents(deaths=(1, None, None), max_steps=3)])
    collect(env, adder, 3)
    _meta, batch = all_items(table)
    flat, idx = adders.flatten_agents(batch)
    assert len(idx) == int(batch.observation["active"].sum()) == 3 + 2 + 2
    assert flat.observation["obs"].shape == (7, 4) and flat.observation["state"].shape == (7, 2)
    for m, (b, a) in enumerate(idx):
        assert flat.reward[m] == batch.reward[b, a] and flat.action[m] == batch.action[b, a]
        np.testing.assert_array_equal(flat.observation["state"][m], batch.observation["state"][b])


def test_episodes_sample_synchronised_across_agents():
    env = ParallelEnvironment([DyingAgents(deaths=(2, None, None), max_steps=4)])
    store = StepStore(env.spec, capacity=64, lanes=1)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.Episode(store, [table], max_length=10)
    collect(env, adder, 8)
    s = table.sample(2)
    assert s.data["observation"]["obs"].shape == (2, 10, 3, 4) and s.mask.shape == (2, 10)
    assert s.mask.sum(axis=1).tolist() == [5, 5]
    assert s.data["observation"]["active"][0, :5, 0].tolist() == [True, True, False, False, False]


def test_the_adder_needs_a_multi_agent_store():
    from rlflow.specs import Field
    from rlflow.types import step_spec
    store = StepStore(step_spec(Field((4,), np.float32), Field((), np.int64)), capacity=16)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    with pytest.raises(SpecError, match="active"):
        adders.MultiAgentTransition(store, [table])


def test_add_steps_writes_what_add_writes_on_a_multi_agent_store():
    def build():
        env, store, table, adder = make([DyingAgents(deaths=(2, None, 3), max_steps=5)], n=2)
        return env, store, table, adder

    env, store, table, adder = build()
    steps = collect(env, adder, 5, seed=3)
    env2, store2, table2, adder2 = build()
    adder2.add_first(env2.reset(seed=3))
    rng = np.random.default_rng(3)
    actions = rng.integers(0, 3, (5, 1, 3))[:, 0]
    obs = {k: np.stack([s.observation[k][0] if not s.last[0] else s.final_observation[k][0] for s in steps[1:]])
           for k in steps[1].observation}
    adder2.add_steps(0, actions, np.stack([s.reward[0] for s in steps[1:]]), obs, truncated=True)
    for key in store.fields:
        np.testing.assert_array_equal(store.take(np.arange(6))[key], store2.take(np.arange(6))[key], err_msg=key)
    assert table.items()["start"].tolist() == table2.items()["start"].tolist()


def test_run_collects_from_a_parallel_env():
    import rlflow

    class Random(rlflow.Policy):
        def act(self, observation, state, *, evaluation=False):
            return np.ones(observation["active"].shape, np.int64), None, state

    env, store, table, adder = make([DyingAgents(), DyingAgents(deaths=(1, 2, 3), max_steps=4)])
    result = rlflow.run(env, Random(), None, adder, table, steps=40, progress=False)
    assert result.env_steps == 40 and table.size == 40  # n = 1: one item per joint action
    # rows: an episode of T actions is T + 1 rows; each lane is 2 actions into its next episode (3 rows)
    assert store.count.tolist() == [3 * 7 + 3, 6 * 4 + 3]
    # team returns, actions all 1. Lane 1: every agent dead after 3 steps: (1) + (11 + 12) + (21 + 22 + 23) = 90.
    # Lane 0 runs to the limit of 6: agent 0 dies after 2 steps (1 + 2), agent 1 lives (11 + ... + 16 = 81),
    # agent 2 dies after 4 (21 + ... + 24 = 90): 174.
    assert sorted((length, ret) for _, ret, length in result.episodes) == [(3, 90.0)] * 6 + [(6, 174.0)] * 3
    with pytest.raises(SpecError, match="action space"):
        class Bad(Random):
            def act(self, observation, state, *, evaluation=False):
                return np.full(observation["active"].shape, 7, np.int64), None, state
        env, _store, table, adder = make([DyingAgents()])
        rlflow.run(env, Bad(), None, adder, table, steps=4, progress=False)


def test_squeeze_agents_drops_the_agent_axis_of_a_one_agent_store():
    env, _store, table, adder = make([DyingAgents(deaths=(3,), max_steps=5)], n=2)
    collect(env, adder, 6)
    _, batch = all_items(table)
    one = adders.squeeze_agents(batch)
    assert one.observation["obs"].shape == (len(batch.reward), 4) and one.action.shape == (len(batch.reward),)
    np.testing.assert_array_equal(one.reward, batch.reward[:, 0])
    np.testing.assert_array_equal(one.discount, batch.discount[:, 0])
    assert one.observation["state"].shape == batch.observation["state"].shape  # the team's state as it was
    env2, _, table2, adder2 = make([DyingAgents()])
    collect(env2, adder2, 3)
    with pytest.raises(ValueError, match="one agent"):
        adders.squeeze_agents(all_items(table2)[1])


def test_team_auxiliary_rewards_and_memory_weights_ride_as_extras_and_weight_episode_sampling():
    """Extras hold what the env does not give (a team reward, a second reward such as human feedback per
    agent, a memory weight); a prioritized episode table samples episodes in proportion to their weight."""
    from rlflow.replay import Prioritized
    from rlflow.specs import Field

    env = ParallelEnvironment([DyingAgents(deaths=(None, None, None), max_steps=2)])
    extras = {"team_reward": Field((), np.float32), "aux_reward": Field((3,), np.float32),
              "memory_weight": Field((), np.float32)}
    store = StepStore(env.step_spec(extras), capacity=64, lanes=1)
    table = Table(store, sampler=Prioritized(alpha=1.0, beta=0.0, seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.Episode(store, [table], max_length=3, priority_fns={
        table.name: lambda episodes: episodes["extras"]["memory_weight"][:, 0]})
    ts = env.reset(seed=0)
    adder.add_first(ts)
    for episode, weight in enumerate([1.0, 3.0]):
        for _ in range(2):
            actions = np.zeros((1, 3), np.int64)
            ts = env.step(actions)
            adder.add(actions, ts, {"team_reward": ts.reward.sum(1), "aux_reward": np.full((1, 3), episode, np.float32),
                                    "memory_weight": np.float32([weight])})
    s = table.sample(4000)
    first_aux = s.data["extras"]["aux_reward"][:, 0, 0]  # which episode each draw is
    assert abs((first_aux == 1).mean() - 0.75) < 0.03  # weights 1 : 3
    np.testing.assert_allclose(s.data["extras"]["team_reward"][:, :2], s.data["reward"][:, :2].sum(-1))


def test_rewards_paid_to_agents_that_did_not_act_are_not_stored():
    class PaysEveryone(DyingAgents):  # a team reward paid to every possible agent, the dead included
        def step(self, actions):
            obs, _rewards, term, trunc, infos = super().step(actions)
            return obs, {a: 1.0 for a in self.possible_agents}, term, trunc, infos

    env, store, table, adder = make([PaysEveryone(deaths=(1, None, None), max_steps=4)], n=3, discount=0.5)
    collect(env, adder, 4)
    assert store.take(np.arange(4))["reward"][:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]  # agent 0 acted once
    _, batch = all_items(table)
    first = batch.observation["state"][:, 0] == 0  # the item of t = 0
    np.testing.assert_allclose(batch.reward[first][0], [1.0, 1.75, 1.75])  # agent 0's return stops at its end


def test_an_agent_leaving_without_a_flag_is_an_error():
    class Vanishing(DyingAgents):
        def step(self, actions):
            out = super().step(actions)
            self.agents = self.agents[1:]  # drops an agent with no terminated/truncated flag
            return out

    env = ParallelEnvironment([Vanishing(deaths=(None, None, None))])
    env.reset()
    with pytest.raises(SpecError, match="without a terminated or truncated flag"):
        env.step(np.zeros((1, 3), np.int64))


def test_a_single_agent_observation_field_named_active_changes_no_action():
    from rlflow.specs import Field
    from rlflow.types import TimeStep, step_spec

    spec = step_spec({"pos": Field((2,), np.float32), "active": Field((2,), np.bool_)}, Field((2,), np.float32))
    store = StepStore(spec, capacity=8)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table])
    obs = {"pos": np.zeros((1, 2), np.float32), "active": np.array([[False, True]])}
    f, t = np.zeros(1, bool), np.ones(1, bool)
    adder.add_first(TimeStep(obs, np.zeros(1, np.float32), f, f, t, f))
    adder.add(np.float32([[0.3, -0.4]]), TimeStep(obs, np.ones(1, np.float32), f, f, f, f))
    np.testing.assert_allclose(store.take(np.array([0]))["action"], [[0.3, -0.4]])


def test_masks_from_info_per_discrete_head_are_joined():
    from gymnasium import spaces

    class TwoHeads(DyingAgents):
        def action_space(self, agent):
            return spaces.MultiDiscrete([2, 3])

        def reset(self, seed=None, options=None):
            obs, _ = super().reset(seed, options)
            return obs, {a: {"action_mask": (np.array([1, 0], np.int8), np.array([0, 1, 1], np.int8))}
                         for a in self.agents}

    env = ParallelEnvironment([TwoHeads()], action_mask="info")
    ts = env.reset()
    assert ts.observation["action_mask"][0, 0].tolist() == [True, False, False, True, True]
