"""The extension examples (examples/custom_env.py, examples/reward_filter_adder.py), written against rlflow's
public interfaces only, work with tables, checkpoints, rlflow.run, rlflow.evaluate and distributed.run."""

import sys
from pathlib import Path

import numpy as np
import pytest

import rlflow
from rlflow import adders, distributed, specs
from rlflow.replay import (
    Fifo,
    MinSize,
    RowTable,
    SampleToInsertRatio,
    StepStore,
    Table,
    TransitionView,
    Uniform,
    load,
    save,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # as Ray's workers import them
from custom_env import CorridorEnv, Random
from reward_filter_adder import RewardFilter


# --------------------------------------------------------------------------- the environment
def test_the_corridor_env_follows_the_timestep_flag_table():
    env = CorridorEnv(num_envs=3, length=4, max_steps=5)
    assert isinstance(env, rlflow.Environment)
    ts = env.reset()
    assert ts.first.all() and not ts.last.any() and (ts.observation == 0).all()
    rng = np.random.default_rng(0)
    position = np.zeros(3, int)
    steps = np.zeros(3, int)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(300):
        actions = rng.integers(0, 2, 3)
        ts = env.step(actions)
        position = np.maximum(0, position + np.where(actions == 1, 1, -1))
        steps += 1
        terminated = position == 3
        truncated = ~terminated & (steps == 5)
        np.testing.assert_array_equal(ts.terminated, terminated)
        np.testing.assert_array_equal(ts.truncated, truncated)
        np.testing.assert_array_equal(ts.last, terminated | truncated)
        np.testing.assert_array_equal(ts.first, ts.last)  # an ended lane starts its next episode at once
        np.testing.assert_array_equal(ts.reward, terminated.astype(np.float32))
        if ts.last.any():
            np.testing.assert_allclose(ts.final_observation[ts.last, 0], position[ts.last] / 3)
        else:
            assert ts.final_observation is None
        position[ts.last], steps[ts.last] = 0, 0
        np.testing.assert_allclose(ts.observation[:, 0], position / 3)
        ends["terminated"] += int(terminated.sum())
        ends["truncated"] += int(truncated.sum())
    assert min(ends.values()) > 10  # both endings were seen


def test_the_corridor_env_with_evaluate_and_a_wrong_action():
    returns = rlflow.evaluate(CorridorEnv(num_envs=2), Random(seed=1), episodes=10, seed=0)
    assert len(returns) == 10 and set(returns) <= {0.0, 1.0}

    class Three(rlflow.Policy):
        def act(self, observation, state, *, evaluation=False):
            return np.full(len(observation), 3), None, state

    with pytest.raises(rlflow.specs.SpecError, match="action"):
        rlflow.evaluate(CorridorEnv(num_envs=2), Three(), episodes=1)


def test_an_object_missing_a_member_is_refused_naming_what_rlflow_expected():
    class NoStep:
        num_envs, action_spec, single_action_space = 1, None, None

        def reset(self, seed=None):
            return None

    with pytest.raises(TypeError, match=r"expected an rlflow env .*got NoStep \(no step\)"):
        rlflow.evaluate(NoStep(), Random(seed=0), episodes=1)


# --------------------------------------------------------------------------- the adder
def parts(adder_cls=RewardFilter, share=0.2, seed=0, lanes=2, capacity=4_000):
    env = CorridorEnv(num_envs=lanes, length=5, max_steps=12)
    store = StepStore(env.spec, capacity=capacity, lanes=lanes)
    table = Table(store, sampler=Fifo(), remover=Fifo(), rate_limiter=MinSize(1), name="replay")
    kwargs = {"share": share, "seed": seed} if adder_cls is RewardFilter else {}
    return env, store, table, adder_cls(store, [table], n=2, discount=0.5, **kwargs)


def feed(env, adder, steps, seed):
    """``steps`` random actions on every lane (the same stream for the same seed)."""
    rng = np.random.default_rng(seed)
    ts = env.reset()
    adder.add_first(ts)
    for _ in range(steps):
        actions = rng.integers(0, 2, env.num_envs)
        ts = env.step(actions)
        adder.add(actions, ts)


def windows(table):
    """Every held item as (lane, first row, length, return, discount), from the table's ``items()``."""
    it = table.items()
    return set(zip(it["lane"].tolist(), it["start"].tolist(), it["length"].tolist(),
                   it["field/return"].tolist(), it["field/discount"].tolist(), strict=True))


def test_it_keeps_every_rewarded_transition_and_a_share_of_the_others():
    env, _, plain_table, plain = parts(adders.NStepTransition)
    feed(env, plain, 3_000, seed=1)
    env, _, table, adder = parts(share=0.2)
    feed(env, adder, 3_000, seed=1)
    every, kept = windows(plain_table), windows(table)
    assert kept <= every
    rewarded = {w for w in every if w[3] != 0}
    assert rewarded and rewarded <= kept
    others, kept_others = len(every - rewarded), len(kept - rewarded)
    assert abs(kept_others - 0.2 * others) < 4 * np.sqrt(0.2 * 0.8 * others)  # binomial, 4 sigma


def test_on_a_row_table_it_keeps_the_same_items():
    env, _, table, adder = parts()
    feed(env, adder, 1_000, seed=5)
    env = CorridorEnv(num_envs=2, length=5, max_steps=12)
    store = StepStore(env.spec, capacity=4_000, lanes=2)
    rows = RowTable(store, seed=0)
    feed(env, RewardFilter(store, [rows], share=0.2, seed=0, n=2, discount=0.5), 1_000, seed=5)
    assert windows(rows) == windows(table) and rows.size > 0


def test_its_checkpoint_carries_its_random_generator(tmp_path):
    env, store, table, adder = parts()
    feed(env, adder, 500, seed=2)
    adder.flush()
    save(tmp_path / "replay.ckpt", store, [table])
    state = adder.state_dict()
    rng = np.random.default_rng(3)
    steps = [(a, env.step(a)) for a in rng.integers(0, 2, (400, 2))]  # the stream after the checkpoint
    for actions, ts in steps:
        adder.add(actions, ts)
    expected = windows(table)

    _, store2, table2, adder2 = parts(seed=99)  # another seed: only the checkpoint makes them agree
    load(tmp_path / "replay.ckpt", store2, [table2])
    adder2.load_state_dict(state)
    for actions, ts in steps:
        adder2.add(actions, ts)
    assert windows(table2) == expected
    _, store3, table3, adder3 = parts(seed=99)
    load(tmp_path / "replay.ckpt", store3, [table3])
    adder3.load_state_dict({**state, "rng": np.random.default_rng(99).bit_generator.state})
    for actions, ts in steps:
        adder3.add(actions, ts)
    assert windows(table3) != expected  # (the generator's state is what decides)


def test_a_bad_generator_state_is_refused_before_anything_changes():
    _, _, _, adder = parts()
    state = adder.state_dict()
    before = {k: np.copy(v) for k, v in adder.lane_state().items()}
    with pytest.raises((TypeError, ValueError, KeyError)):
        adder.load_state_dict({**state, "rng": {"bit_generator": "PCG64", "state": "garbage"}})
    assert all(np.array_equal(before[k], v) for k, v in adder.lane_state().items())


def test_with_rlflow_run_and_its_checkpoints(tmp_path):
    env, _, table, adder = parts()
    result = rlflow.run(env, Random(seed=0), None, adder, table, steps=2_000, progress=False,
                        checkpoint_every=1_000, logdir=tmp_path)
    assert result.env_steps == 2_000 and 0 < table.size < 2_000
    env, _, table, adder = parts(seed=5)
    resumed = rlflow.run(env, Random(seed=0), None, adder, table, steps=3_000, progress=False, checkpoint_every=1_000,
                         logdir=tmp_path, resume=True)
    assert resumed.env_steps == 3_000 and table.size > 0


class RewardShare(rlflow.Learner):
    """Counts the sampled transitions and the rewarded ones among them."""

    def __init__(self):
        self.items = self.rewarded = 0

    def step(self, sample):
        self.items += len(sample.keys)
        self.rewarded += int((sample.data.reward != 0).sum())
        return {}


@pytest.mark.timeout(180)
def test_with_distributed_run(ray_local):
    env = CorridorEnv(num_envs=4, length=5, max_steps=12)
    store = StepStore(env.spec, capacity=2_000, lanes=4)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), name="replay",
                  rate_limiter=SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=32, error_buffer=400))
    adder = RewardFilter(store, [table], share=0.1, seed=0, n=2, discount=0.5)
    learner = RewardShare()
    result = distributed.run(lambda i: CorridorEnv(num_envs=2, length=5, max_steps=12), lambda i: Random(seed=i),
                             learner, adder, table, steps=3_000, batch_size=16, num_actors=2, progress=False)
    assert result.env_steps >= 3_000 and learner.items > 500
    # Unfiltered, about 1 in 12 of these transitions is rewarded; with 10% of the others kept, about half
    assert learner.rewarded / learner.items > 0.3


# --------------------------------------------------------------------------- a new item kind, from Adder itself
class LastTransitions(adders.Adder):
    """One item per ended episode: its last transition (the final action's row and the final row), shaped as
    1-step transitions, with discount 0 when the episode terminated and ``discount`` when it was truncated."""

    def __init__(self, store, tables, discount=0.9):
        self.discount = discount
        super().__init__(store, tables, view=TransitionView(1, discount), priority_fns=None, min_capacity=3,
                         item_spec={"return": specs.Field((), np.float32), "discount": specs.Field((), np.float32)})

    def on_step(self, events):
        acted = events.final_rows > events.episode_starts  # (an episode of no action has no transition)
        lanes, final = events.ended[acted], events.final_rows[acted]
        if lanes.size:
            reward = self.store.gather(lanes, final - 1)["reward"]
            discount = np.where(events.terminated[acted], 0.0, self.discount).astype(np.float32)
            self.insert_items(lanes, final - 1, np.full(lanes.size, 2), {"return": reward, "discount": discount},
                              priorities=1.0 + reward)


def test_a_new_item_kind_made_from_the_step_events():
    env = CorridorEnv(num_envs=3, length=4, max_steps=6)
    store = StepStore(env.spec, capacity=500, lanes=3)
    table = Table(store, sampler=Fifo(), remover=Fifo(), rate_limiter=MinSize(1))
    adder = LastTransitions(store, [table])
    ts = env.reset()
    adder.add_first(ts)
    rng = np.random.default_rng(4)
    ended = []
    for _ in range(200):
        actions = rng.integers(0, 2, 3)
        previous, ts = ts, env.step(actions)
        adder.add(actions, ts)
        for lane in np.flatnonzero(ts.last):  # what its item must hold, from the stream itself
            ended.append((previous.observation[lane, 0], ts.final_observation[lane, 0], ts.reward[lane],
                          0.0 if ts.terminated[lane] else 0.9))
    assert table.size == len(ended) > 20
    assert table.items()["priority"].tolist() == [1.0 + e[2] for e in ended]
    assert drain(table) == [tuple(np.float32(v) for v in e) for e in ended]


def drain(table):
    """Every item as (observation, next observation, reward, discount), oldest first (Fifo draws, each item
    deleted once drawn)."""
    out = []
    while table.size:
        s = table.sample(1)
        out.append((s.data.observation[0, 0], s.data.next_observation[0, 0], s.data.reward[0], s.data.discount[0]))
        table.delete(s.keys)
    return out
