"""Real gymnasium vector envs, every autoreset mode, through the wrapper and the n-step adder.

CartPole's own time limit (500 steps) never ends a 300-step run, so the runs also take a 15-step limit:
then episodes both terminate (the pole falls) and are truncated (the limit), on every lane.
"""

import numpy as np
import pytest

from rlflow import adders, envs
from rlflow.replay import Fifo, StepStore, Table, Uniform
from rlflow.replay.items import LANE, LENGTH, START, VALID


def collect(mode: str, n: int, steps: int = 300, max_episode_steps: int | None = None):
    """Run CartPole with 3 lanes; return the table, store and the per-lane episodes seen from the wrapper.

    ``ends[e]`` lists, per finished episode of lane ``e``, its ``(terminated, truncated)`` flags.
    """
    limit = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = envs.make("CartPole-v1", num_envs=3, autoreset_mode=mode, **limit)
    store = StepStore(env.spec, capacity=1024, lanes=3)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=n, discount=0.5)
    rng = np.random.default_rng(0)
    ts = env.reset(seed=0)
    adder.add_first(ts)
    episodes = [[[ts.observation[e].copy()]] for e in range(3)]  # per lane: list of [obs..., final obs]
    rewards = [[[]] for _ in range(3)]
    ends = [[] for _ in range(3)]
    for _ in range(steps):
        actions = rng.integers(0, 2, 3)
        ts = env.step(actions)
        adder.add(actions, ts)
        for e in range(3):
            if ts.first[e] and not ts.last[e]:  # next-step reset call: a new episode, no transition
                episodes[e].append([ts.observation[e].copy()])
                rewards[e].append([])
                continue
            rewards[e][-1].append(float(ts.reward[e]))
            if ts.last[e]:
                episodes[e][-1].append(ts.final_observation[e].copy())
                ends[e].append((bool(ts.terminated[e]), bool(ts.truncated[e])))
                if ts.first[e]:
                    episodes[e].append([ts.observation[e].copy()])
                    rewards[e].append([])
            else:
                episodes[e][-1].append(ts.observation[e].copy())
    env.close()
    return table, store, episodes, rewards, ends


@pytest.mark.parametrize("limit", [None, 15])
@pytest.mark.parametrize("mode", ["same_step", "next_step", "disabled"])
@pytest.mark.parametrize("n", [1, 3])
def test_every_transition_matches_the_episodes_seen(mode, n, limit):
    table, store, episodes, rewards, ends = collect(mode, n, max_episode_steps=limit)
    flags = [f for lane in ends for f in lane]
    assert all(term or trunc for term, trunc in flags)
    if limit is None:  # CartPole's 500-step limit is out of reach: only terminations
        assert flags and not any(trunc for _, trunc in flags)
    else:  # both kinds, and a truncation (not also a termination) comes exactly at the limit
        assert any(term and not trunc for term, trunc in flags) and any(trunc and not term for term, trunc in flags)
        for e in range(3):
            assert all(len(obs) - 1 <= limit for obs in episodes[e])
            assert all(len(episodes[e][i]) - 1 == limit for i, (term, trunc) in enumerate(ends[e]) if not term)
    # The flags reach the store: the row before each final row holds them (no ring wrap here), a step both
    # terminated and truncated (CartPole falling at the time limit) as terminated.
    for e in range(3):
        assert int(store.count[e]) <= store.capacity
        rows = store.gather(np.full(int(store.count[e]), e), np.arange(int(store.count[e])))
        ended = np.flatnonzero(rows["last"]) - 1
        assert ended.size == len(ends[e])
        np.testing.assert_array_equal(rows["terminated"][ended], [term for term, _ in ends[e]])
        np.testing.assert_array_equal(rows["truncated"][ended], [trunc and not term for term, trunc in ends[e]])
        assert rows["terminated"].sum() + rows["truncated"].sum() == len(ends[e])
    want = []
    for e in range(3):
        for i, obs in enumerate(episodes[e]):
            done = i < len(ends[e])  # finished episodes hold their final observation
            T = len(obs) - 1
            for t in range(T):
                k = min(n, T - t)
                if not done and t + n > T:
                    continue  # still open: the window needs more steps
                ret = sum(0.5**j * rewards[e][i][t + j] for j in range(k))
                disc = 0.0 if done and ends[e][i][0] and t + k == T else 0.5**k  # truncated: bootstrap
                want.append((tuple(obs[t]), round(ret, 5), disc, tuple(obs[t + k])))
    items = table.items()
    meta = np.zeros((items["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = (
        items["lane"], items["start"], items["length"], items["valid"])
    b, _ = table.view.gather(store, meta, {"return": items["field/return"], "discount": items["field/discount"]})
    got = [(tuple(b.observation[i]), round(float(b.reward[i]), 5), round(float(b.discount[i]), 6),
            tuple(b.next_observation[i])) for i in range(items["key"].size)]
    want = [(o, r, round(float(np.float32(d)), 6), x) for o, r, d, x in want]
    assert sorted(got) == sorted(want)
