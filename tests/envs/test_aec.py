"""PettingZoo AEC envs: one lane per (env, agent), rewards accumulated across the other agents' turns."""

from __future__ import annotations

import numpy as np
import pytest
from ma_envs import LeaderGame, TurnGame

from rlflow import adders
from rlflow.envs import AECEnvironment
from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform
from rlflow.replay.items import LANE, LENGTH, START, VALID
from rlflow.specs import SpecError

G = 0.9


def setup(envs, capacity=512, n=1):
    probe = AECEnvironment(envs)
    store = StepStore(probe.spec, capacity=capacity, lanes=probe.num_lanes)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=n, discount=G)
    return AECEnvironment(envs, adder, seed=0), store, table


def play(env, turns, seed=0):
    """Random legal moves; returns every ended agent episode ``(env, agent, return)``."""
    rng = np.random.default_rng(seed)
    turn = env.reset()
    ended = list(turn.episode_returns)
    for _ in range(turns):
        mask = turn.observation["action_mask"]
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
        turn = env.step(actions)
        ended += turn.episode_returns
    return ended


def items(table):
    it = table.items()
    meta = np.zeros((it["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = it["lane"], it["start"], it["length"], it["valid"]
    batch = table.view.gather(table.store, meta, {"return": it["field/return"], "discount": it["field/discount"]})[0]
    return meta, batch


def reference(game_log, agent, move):
    """The reward agent ``agent`` accumulates from its move number ``move`` (0-based) until its next turn or
    its end: every reward given to it by that move and the moves after it, up to its next own move."""
    total = 0.0
    for _, m, actor, _, rewards in game_log:
        if m < move:
            continue
        if m > move and actor == agent:
            break
        total += rewards.get(agent, 0.0)
    return total


@pytest.mark.parametrize("ending", ["terminated", "truncated"])
def test_every_transition_carries_the_rewards_of_the_other_agents_turns(ending):
    raw = [TurnGame(length=7, quitter=1, quit_at=2, ending=ending), TurnGame(length=5, quitter=0, quit_at=1,
                                                                             ending=ending)]
    env, _store, table = setup(raw)
    play(env, 40)
    meta, batch = items(table)
    assert len(meta) > 20
    seen = set()
    for b in range(len(meta)):
        e, i = divmod(int(meta[b, LANE]), 3)
        agent_id, move, game = (int(x) for x in batch.observation["observation"][b])
        assert agent_id == i
        key = (e, game, move)
        assert key not in seen
        seen.add(key)
        log = [entry for entry in raw[e].log if entry[0] == game]
        assert batch.reward[b] == pytest.approx(reference(log, f"a{i}", move))
        # the agent's own end: the quitter terminates; at the game's end the others end as `ending` says
        acted = [m for _, m, actor, _, _ in log if actor == f"a{i}"]
        last_own = move == acted[-1] and len(log) == raw[e].length if game < raw[e].games else move == acted[-1]
        quitter = i == raw[e].quitter and acted.index(move) + 1 == raw[e].quit_at
        if quitter:
            assert batch.discount[b] == 0.0
        elif last_own and ending == "terminated" and game < raw[e].games:
            assert batch.discount[b] == 0.0
        elif not (last_own and game < raw[e].games):
            assert batch.discount[b] == pytest.approx(G)
    # every move of every finished game became exactly one transition
    for e, r in enumerate(raw):
        for game in range(r.games):
            moves = {m for g, m, *_ in r.log if g == game}
            assert {m for (ee, g, m) in seen if ee == e and g == game} == moves


def test_the_final_turn_lands_the_losers_reward_whoever_ends_the_game():
    ttt = pytest.importorskip("pettingzoo.classic.tictactoe_v3")
    env, _store, table = setup([ttt.env() for _ in range(4)], capacity=2048)
    ended = play(env, 400, seed=1)
    assert ended
    games: dict[int, list[float]] = {}
    for e, _, ret in ended:
        games.setdefault(e, []).append(ret)
    _meta, batch = items(table)
    terminal = batch.discount == 0
    assert set(np.unique(batch.reward[terminal])) <= {-1.0, 0.0, 1.0}
    assert (batch.reward[~terminal] == 0).all()  # tictactoe rewards only at the end
    for rets in games.values():  # two agents per game: +1/-1 or 0/0, whichever player moved last
        pairs = np.array(rets[: len(rets) // 2 * 2]).reshape(-1, 2)
        assert (pairs.sum(axis=1) == 0).all()
    # both players' last transitions of a won game are terminal: the winner's +1 and the loser's -1
    assert (batch.reward[terminal] == 1).sum() == (batch.reward[terminal] == -1).sum()


def test_the_acting_agent_alternates_and_bad_actions_raise():
    env, store, table = setup([TurnGame(num_agents=2, length=6, quit_at=99)])
    turn = env.reset()
    assert turn.agents.tolist() == [0] and turn.lanes.tolist() == [0]
    turn = env.step(np.array([1]))
    assert turn.agents.tolist() == [1] and turn.lanes.tolist() == [1]
    with pytest.raises(SpecError, match="action space"):
        env.step(np.array([7]))
    with pytest.raises(SpecError, match="one action per env"):
        env.step(np.array([1, 1]))
    with pytest.raises(ValueError, match="one per"):
        AECEnvironment([TurnGame()], adders.NStepTransition(store, [table], discount=G))


def test_nstep_returns_span_an_agents_own_turns():
    env, _store, table = setup([TurnGame(num_agents=2, length=8, quitter=0, quit_at=99)], n=2)
    raw = env.envs[0]
    play(env, 8)  # one whole game of 8 moves, 4 per agent
    meta, batch = items(table)
    game = [entry for entry in raw.log if entry[0] == 0]
    for b in range(len(meta)):
        i = int(meta[b, LANE])
        _, move, g = (int(x) for x in batch.observation["observation"][b])
        if g:
            continue
        own = [m for _, m, actor, _, _ in game if actor == f"a{i}"]
        k = own.index(move)
        r = [reference(game, f"a{i}", m) for m in own]
        expected = r[k] + (G * r[k + 1] if k + 1 < len(own) else 0.0)
        assert batch.reward[b] == pytest.approx(expected)
        assert batch.discount[b] == pytest.approx(0.0 if k + 2 >= len(own) else G * G)


def test_actions_are_copied_when_taken_and_seeds_follow_each_env_and_reset_twice_works():
    raw = [TurnGame(num_agents=2, length=4, quit_at=99, vector_actions=True) for _ in range(2)]
    env, store, table = setup(raw)
    buf = np.zeros((2, 2), np.int64)  # a policy that reuses one action buffer
    turn = env.reset(seed=100)
    taken = []
    for step in range(16):
        buf[:] = [[step % 4, (step + 1) % 4], [(step + 2) % 4, step % 4]]
        taken.append((turn.lanes.copy(), buf.copy()))
        turn = env.step(buf)
    _, batch = items(table)
    it = table.items()
    for b in range(len(it["lane"])):
        lane, (_, move, game) = int(it["lane"][b]), (int(x) for x in batch.observation["observation"][b])
        e = lane // 2
        entry = next(x for x in raw[e].log if x[0] == game and x[1] == move)
        assert batch.action[b].tolist() == entry[3]  # the action taken then, not the buffer's later content
    assert raw[0].seeds[:4] == [100, 102, 104, 106] and raw[1].seeds[:4] == [101, 103, 105, 107]
    env.reset(seed=0)
    env.reset(seed=0)  # every lane's episode is abandoned, also those of agents still to act
    with pytest.raises(TypeError, match="NStepTransition"):
        AECEnvironment([TurnGame()], adders.Episode(store, [Table(store, sampler=Uniform(seed=0), remover=Fifo(),
                                                                  rate_limiter=MinSize(1))], max_length=20))


def test_agents_with_different_spaces_write_to_their_groups_stores():
    raw = [LeaderGame(length=7, quitter=1, quit_at=2), LeaderGame(length=5, quitter=2, quit_at=1)]
    probe = AECEnvironment(raw)
    assert {name: g.agents for name, g in probe.groups.items()} == {"group_0": ("a0",), "group_1": ("a1", "a2")}
    with pytest.raises(AttributeError, match=r"group_spec\(name\)"):
        _ = probe.spec
    tables, group_adders = {}, {}
    for name, g in probe.groups.items():
        store = StepStore(probe.group_spec(name), capacity=512, lanes=len(raw) * len(g.agents))
        tables[name] = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
        group_adders[name] = adders.NStepTransition(store, [tables[name]], n=1, discount=G)
    assert tables["group_0"].store.fields["observation"].dtype == np.float64
    with pytest.raises(TypeError, match="a dict of one adder per group"):
        AECEnvironment(raw, group_adders["group_1"])
    env = AECEnvironment(raw, group_adders, seed=0)
    rng = np.random.default_rng(0)
    turn = env.reset()
    with pytest.raises(SpecError, match="a dict of"):
        env.step(np.zeros(2, np.int64))
    for _ in range(60):
        leads = turn.groups == "group_0"
        assert (turn.agents[leads] == 0).all() and (turn.agents[~leads] > 0).all()
        np.testing.assert_array_equal(turn.lanes, np.where(leads, np.arange(2), np.arange(2) * 2 + turn.agents - 1))
        masks = turn.observation["group_1"]["action_mask"]
        assert not masks[leads].any()  # the rows of envs where the other group acts are zeros
        actions = {"group_0": rng.integers(0, 4, (2, 2)),
                   "group_1": np.array([rng.choice(np.flatnonzero(m)) if m.any() else 0 for m in masks])}
        turn = env.step(actions)
    seen = set()
    for name, table in tables.items():
        meta, batch = items(table)
        size = len(env.groups[name].agents)
        for b in range(len(meta)):
            e, pos = divmod(int(meta[b, LANE]), size)
            agent = env.groups[name].agents[pos]
            obs = batch.observation if name == "group_0" else batch.observation["observation"]
            move, game = int(obs[b][-2]), int(obs[b][-1])
            assert name == "group_0" or int(obs[b][0]) == pos + 1
            log = [entry for entry in raw[e].log if entry[0] == game]
            assert [actor for _, m, actor, _, _ in log if m == move] == [agent]
            assert batch.reward[b] == pytest.approx(reference(log, agent, move))
            seen.add((e, game, move))
    for e, r in enumerate(raw):  # every move of every finished game became one transition, in its group's table
        for game in range(r.games):
            assert {m for (ee, g, m) in seen if ee == e and g == game} == {m for g, m, *_ in r.log if g == game}
