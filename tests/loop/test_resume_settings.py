"""Exact resume: adder state, item settings checked on load, parameter sync, and multi-agent truncation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adder_reference import ADDERS, SPEC, G, Stream, episode, nstep, sequence
from checkpointed_parts import SeededPolicy
from ma_envs import DyingAgents

import rlflow
from rlflow import adders, envs
from rlflow.envs import ParallelEnvironment
from rlflow.loop import checkpoint as run_checkpoint
from rlflow.loop.actors import VariableClient
from rlflow.replay import Fifo, Queue, SampleToInsertRatio, StepStore, Table, Uniform
from rlflow.replay import checkpoint as replay_checkpoint
from rlflow.replay.checkpoint import CheckpointError


def multiagent(n=3, discount=G):
    return lambda store, tables: adders.MultiAgentTransition(store, tables, n=n, discount=discount)


def build(make_adder, spec=SPEC, lanes=2, capacity=300):
    store = StepStore(spec, capacity=capacity, lanes=lanes)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), max_size=10 * capacity * lanes, cross_episodes=True)
    return store, table, make_adder(store, [table])


def same_tables(t1, t2):
    i1, i2 = t1.items(), t2.items()
    assert i1.keys() == i2.keys() and i1["key"].size > 0
    for k in i1:
        np.testing.assert_array_equal(i1[k], i2[k], err_msg=k)
    for k, v in t1.store.state_dict().items():
        np.testing.assert_array_equal(v, t2.store.state_dict()[k], err_msg=k)


# --------------------------------------------------------------------------- adder state
def stream_run(make_adder, tmp_path, *, save_at, steps=160, same_step=True, seed=3):
    """A random episode stream into a fresh adder; at ``save_at`` (if any) the store, table and adder are
    saved and the stream goes on into new objects restored from them."""
    store, table, adder = build(make_adder)
    stream = Stream(2, np.random.default_rng(seed), same_step)
    adder.add_first(stream.reset())
    for i in range(steps):
        if i == save_at:
            replay_checkpoint.save(tmp_path / "replay.ckpt", store, [table])
            state = adder.state_dict()
            store, table, adder = build(make_adder)
            replay_checkpoint.load(tmp_path / "replay.ckpt", store, [table])
            adder.load_state_dict(state)
        actions, ts, extras = stream.step(stream.random_events(0.08))
        adder.add(actions, ts, extras)
    adder.truncate()
    return table


@pytest.mark.parametrize("same_step", [True, False])
@pytest.mark.parametrize("name", list(ADDERS))
def test_every_adder_restored_mid_episode_writes_what_the_uninterrupted_one_writes(tmp_path, name, same_step):
    """An adder's state holds every position that shapes its future items (a sequence's next start too):
    saved mid-episode at several steps and restored into new objects, it writes the same rows and items."""
    whole = stream_run(ADDERS[name], tmp_path, save_at=None, same_step=same_step)
    for save_at in (37, 90, 91):
        same_tables(whole, stream_run(ADDERS[name], tmp_path, save_at=save_at, same_step=same_step))


def learner_digest(sample) -> float:
    leaves = sample.data.values() if isinstance(sample.data, dict) else sample.data
    total = float(np.sum(sample.keys % 997))
    for leaf in leaves:
        if isinstance(leaf, dict):
            total += sum(float(np.sum(v)) for v in leaf.values())
        elif leaf is not None:
            total += float(np.sum(leaf))
    return total


class DigestLearner(rlflow.Learner):
    """Its state follows every sample it sees (keys and data)."""

    def __init__(self):
        self.steps, self.total = 0, 0.0

    def step(self, sample):
        self.steps += 1
        self.total += learner_digest(sample)
        return {"total": self.total}

    def get_params(self):
        return self.steps

    def state_dict(self):
        return {"steps": self.steps, "total": self.total}

    def load_state_dict(self, state):
        self.steps, self.total = state["steps"], state["total"]


def queue_run(make_adder, logdir, stops, capacity=40):
    """PPO's set-up on 2 CartPole lanes (a FIFO queue emptied 2 items at a time), run to each of ``stops``
    with new objects resuming from the last checkpoint (every 200 env steps)."""
    for stop in stops:
        env = envs.make("CartPole-v1", num_envs=2)
        store = StepStore(env.spec, capacity=capacity, lanes=2)
        table = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, cross_episodes=True,
                      rate_limiter=Queue(2 * 4))
        adder = make_adder(store, [table])
        learner = DigestLearner()
        result = rlflow.run(env, SeededPolicy(5), learner, adder, table, steps=stop, batch_size=2,
                            checkpoint_every=200, logdir=logdir, tensorboard=False, progress=False, seed=3,
                            resume=True)
    return result, table, learner


@pytest.mark.parametrize(("name", "capacity"), [("sequence-continue", 40), ("sequence-zero_pad", 40),
                                                ("sequence-write", 40), ("nstep-3", 40), ("episode", 1_100)])
def test_a_run_stopped_at_a_checkpoint_and_resumed_equals_the_uninterrupted_run(tmp_path, name, capacity):
    """PPO's and MAPPO's set-up (a continuing sequence adder, length 6, period 4) and the other adders: a run
    to 800 env steps and one stopped at 400 and resumed to 800 insert and sample the same items."""
    make_adder = ADDERS[name] if name != "episode" else episode(501)
    (r1, t1, l1), (r2, t2, l2) = (queue_run(make_adder, tmp_path / "whole", [800], capacity),
                                  queue_run(make_adder, tmp_path / "parts", [400, 800], capacity))
    assert r1.learner_steps >= 15 and r1.episodes == r2.episodes
    assert (t1.rate_limiter.inserts, r1.learner_steps, l1.total) == (t2.rate_limiter.inserts, r2.learner_steps,
                                                                     l2.total)
    same_tables(t1, t2)


# --------------------------------------------------------------------------- item settings checked on resume
def ma_env(max_steps=100, deaths=(2, None, 4)):
    return ParallelEnvironment([DyingAgents(deaths=deaths, max_steps=max_steps)], action_mask="info")


def feed(adder, steps=30, seed=0):
    """Steps of a random single-agent stream, or of DyingAgents for a multi-agent store."""
    rng = np.random.default_rng(seed)
    if "observation/active" in adder.store.fields:
        env = ma_env(max_steps=7)
        adder.add_first(env.reset())
        for _ in range(steps):
            actions = rng.integers(0, 3, (1, 3))
            adder.add(actions, env.step(actions))
        return
    stream = Stream(adder.num_lanes, rng, True)
    adder.add_first(stream.reset())
    for _ in range(steps):
        adder.add(*stream.step(stream.random_events(0.1)))


SETTING_CHANGES = [
    # (setting, the checkpoint's adder, the resuming adder, its value in the checkpoint, the resuming value)
    ("n", nstep(3), nstep(1), 3, 1),
    ("discount", nstep(3, 0.9), nstep(3, 0.99), 0.9, 0.99),
    ("length", sequence(6, 4), sequence(8, 4), 6, 8),
    ("period", sequence(6, 4), sequence(6, 3), 4, 3),
    ("end_behavior", sequence(6, 4, "continue"), sequence(6, 4, "write"), "'continue'", "'write'"),
    ("end_behavior", sequence(6, 4, "zero_pad"), sequence(6, 4, "write"), "'zero_pad'", "'write'"),
    ("max_length", episode(60), episode(80), 60, 80),
    ("ragged", episode(60), episode(60, ragged=True), False, True),
    ("kind", sequence(6, 4), episode(60), "'sequence'", "'episode'"),
    ("kind", nstep(1), sequence(2, 1), "'transition'", "'sequence'"),
    ("n", multiagent(3), multiagent(1), 3, 1),
    ("discount", multiagent(3, 0.9), multiagent(3, 0.5), 0.9, 0.5),
]


def snapshot(store, table):
    return {k: v.copy() for k, v in store.state_dict().items()}, table.items()


def assert_unchanged(store, table, before):
    for k, v in store.state_dict().items():
        np.testing.assert_array_equal(v, before[0][k], err_msg=k)
    after = table.items()
    for k in before[1]:
        np.testing.assert_array_equal(after[k], before[1][k], err_msg=k)


@pytest.mark.parametrize(("setting", "saved_adder", "new_adder", "saved", "new"), SETTING_CHANGES)
def test_a_changed_item_setting_is_refused_on_resume_naming_it_and_changing_nothing(tmp_path, setting, saved_adder,
                                                                                    new_adder, saved, new):
    multi = saved_adder.__qualname__.startswith("multiagent.")  # made by multiagent(): a multi-agent store
    spec, lanes = (ma_env().spec, 1) if multi else (SPEC, 2)
    store, table, adder = build(saved_adder, spec, lanes)
    feed(adder)
    path = run_checkpoint.save_run(tmp_path, 30, store, table, {"adder": adder.state_dict()})
    store, table, adder = build(new_adder, spec, lanes)
    feed(adder, steps=5, seed=1)
    before, open_rows = snapshot(store, table), adder.state_dict()
    message = rf"adder setting '{setting}': .*{setting}={saved}, this \w+ has {setting}={new}"
    with pytest.raises(CheckpointError, match=message):
        run_checkpoint.load_run(path, store, table, adder)
    with pytest.raises(CheckpointError, match=message):
        adder.load_state_dict(run_checkpoint.load_state(path / "run.pt")["adder"])
    # A replay checkpoint alone is refused too: the setting is part of the table's configuration.
    with pytest.raises(CheckpointError, match=f"'{setting}'"):
        replay_checkpoint.load(path / "replay.ckpt", store, [table])
    assert_unchanged(store, table, before)
    for k, v in adder.state_dict().items():
        np.testing.assert_array_equal(v, open_rows[k], err_msg=k)


def test_zero_pad_and_truncate_write_the_same_items_so_either_resumes_the_other(tmp_path):
    store, table, adder = build(sequence(6, 4, "truncate"))
    feed(adder)
    path = run_checkpoint.save_run(tmp_path, 30, store, table, {"adder": adder.state_dict()})
    store, table, adder = build(sequence(6, 4, "zero_pad"))
    state = run_checkpoint.load_run(path, store, table, adder)
    adder.load_state_dict(state["adder"])
    assert table.size > 0


def test_bad_lane_arrays_in_an_adder_state_are_refused_changing_nothing():
    _store, _table, adder = build(sequence())
    feed(adder)
    good = adder.state_dict()
    for bad, match in [({**good, "next_start": good["next_start"][:1]}, r"'next_start': expected 2 integers"),
                       ({k: v for k, v in good.items() if k != "open"}, r"'open': expected 2 integers"),
                       ({k: v for k, v in good.items() if k != "items"}, "settings of its items")]:
        with pytest.raises(CheckpointError, match=match):
            adder.load_state_dict(bad)
        for k, v in adder.state_dict().items():
            np.testing.assert_array_equal(v, good[k], err_msg=k)


def test_run_refuses_to_resume_with_another_n_before_anything_changes(tmp_path):
    def setup(n):
        env = envs.make("CartPole-v1", num_envs=2)
        store = StepStore(env.spec, capacity=200, lanes=2)
        table = Table(store, sampler=Uniform(seed=1), remover=Fifo(),
                      rate_limiter=SampleToInsertRatio(2.0, 20, error_buffer=40))
        return env, table, adders.NStepTransition(store, [table], n=n, discount=G)

    env, table, adder = setup(3)
    rlflow.run(env, SeededPolicy(5), DigestLearner(), adder, table, steps=100, batch_size=8, checkpoint_every=100,
               logdir=tmp_path, tensorboard=False, progress=False, seed=1)
    env, table, adder = setup(1)
    learner = DigestLearner()
    with pytest.raises(CheckpointError, match=r"adder setting 'n': .*n=3, this NStepTransition has n=1"):
        rlflow.run(env, SeededPolicy(5), learner, adder, table, steps=200, batch_size=8, checkpoint_every=100,
                   logdir=tmp_path, tensorboard=False, progress=False, seed=1, resume=True)
    assert len(table.store) == 0 and table.size == 0 and learner.steps == 0


# --------------------------------------------------------------------------- parameter sync
class ParamPolicy(SeededPolicy):
    """Acts on its RNG and on the parameters it was last given (logged per action); saves both."""

    def __init__(self, log):
        super().__init__(5)
        self.params, self.log = None, log

    def act(self, observation, state, *, evaluation=False):
        self.log.append(self.params)
        return (self.rng.integers(0, 2, len(observation)) + self.params // 5) % 2, None, state

    def set_params(self, params):
        self.params = params

    def state_dict(self):
        return {**super().state_dict(), "params": self.params}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.params = state["params"]


def synced_run(logdir, stops, policy_log):
    """One lane, one learner step per env step (its parameters: its step count), sync_period 7, checkpoints
    every 100 env steps: the last pull before each checkpoint was at step 98 (or 196)."""
    for stop in stops:
        env = envs.make("CartPole-v1", num_envs=1)
        store = StepStore(env.spec, capacity=1_000, lanes=1)
        table = Table(store, sampler=Uniform(seed=2), remover=Fifo(),
                      rate_limiter=SampleToInsertRatio(4.0, 1, error_buffer=4))
        adder = adders.NStepTransition(store, [table], n=1, discount=G)
        learner = DigestLearner()
        rlflow.run(env, ParamPolicy(policy_log), learner, adder, table, steps=stop, batch_size=4, sync_period=7,
                   checkpoint_every=100, logdir=logdir, tensorboard=False, progress=False, seed=4, resume=True)
    return table, learner


def test_a_run_resumed_between_parameter_pulls_acts_with_the_parameters_of_the_uninterrupted_run(tmp_path):
    log1, log2 = [], []
    t1, l1 = synced_run(tmp_path / "whole", [250], log1)
    t2, l2 = synced_run(tmp_path / "parts", [100, 200, 250], log2)
    # The pull after env step 98 gets the learner's 97 steps; the actions from 100 on use them until the pull
    # at 105 (a pull at the checkpoint's step would have given 99).
    assert log1[98:105] == [97] * 7 and log1[105] == 104
    assert log1 == log2
    assert (l1.steps, l1.total) == (l2.steps, l2.total)
    same_tables(t1, t2)


class Params(rlflow.Learner):
    def step(self, sample):
        return {}

    def get_params(self):
        return "latest"


class Holder(rlflow.Policy):
    def __init__(self):
        self.params = "restored"

    def act(self, observation, state, *, evaluation=False):
        return None, None, state

    def set_params(self, params):
        self.params = params


@pytest.mark.parametrize(("last_pull", "policy_restored", "pulls"), [
    (98, True, False),   # between pulls: the restored parameters stay until the pull due at 105
    (100, True, True),   # pulled at the checkpoint's step: the learner's parameters are those it had
    (98, False, True),   # a policy that saved nothing has only the learner's parameters to act with
    (None, True, True),  # a checkpoint without the client's state: pull
])
def test_the_variable_client_resumes_its_pull_schedule(last_pull, policy_restored, pulls):
    policy = Holder()
    client = VariableClient(Params(), policy, period=7)
    state = None if last_pull is None else client.state_dict() | {"last_pull": last_pull}
    assert client.resume(state, 100, policy_restored=policy_restored) is pulls
    assert policy.params == ("latest" if pulls else "restored")
    assert client.update(104) is False and client.update(105) is (not pulls)
    assert client.state_dict() == {"last_pull": 105 if not pulls else 100}


# --------------------------------------------------------------------------- multi-agent truncation
def ma_rows(deaths, cut_by_adder, make_adder, steps=9, cut_at=6):
    """DyingAgents rows of ``steps`` joint actions: the env cuts the episode at step ``cut_at`` (its time
    limit), or the adder truncates it there (:meth:`~rlflow.adders.Adder.truncate`) and the env restarts."""
    env = ma_env(max_steps=100 if cut_by_adder else cut_at, deaths=deaths)
    store, table, adder = build(make_adder, env.spec, lanes=1, capacity=64)
    rng = np.random.default_rng(0)
    adder.add_first(env.reset())
    for t in range(steps):
        if cut_by_adder and t == cut_at:
            adder.truncate()
            adder.add_first(env.reset())
        actions = rng.integers(0, 3, (1, 3))
        adder.add(actions, env.step(actions))
    return store, table


@pytest.mark.parametrize("deaths", [(2, None, 4), (2, None, 6), (None, None, None), (1, 3, None)])
@pytest.mark.parametrize("make_adder", [multiagent(3), sequence(4, 3), episode(20)], ids=["nstep", "seq", "ep"])
def test_an_adder_truncation_writes_the_rows_and_items_of_an_env_truncation(deaths, make_adder):
    """The agents still active where the adder cuts are left as the env's time limit leaves them: inactive,
    truncated, no legal action, on the final row; the items (per-agent n-step, sequences, episodes) match."""
    env_cut, adder_cut = ma_rows(deaths, False, make_adder), ma_rows(deaths, True, make_adder)
    final = env_cut[0].take(np.array([6]))
    assert final["last"].all() and not final["observation/active"].any()
    live = [d is None or d > 6 for d in deaths]
    assert final["observation/truncated"][0].tolist() == live
    same_tables(env_cut[1], adder_cut[1])


def test_mappo_advantages_are_cut_where_the_adder_truncates():
    """MAPPO's per-agent GAE on a rollout through an adder's truncation: the same advantages as through an
    env truncation at that step, none of them reaching past the final row into the next episode."""
    mappo = pytest.importorskip("baselines.mappo")
    rollouts = []
    for cut_by_adder in (False, True):
        store, _ = ma_rows((2, None, None), cut_by_adder, sequence(4, 3))
        rows = store.unflatten(store.take(np.arange(10)[None]))  # one rollout [1, 10, ...]: rows 0..6, then 7..9
        rollouts.append(rows)
    values = torch.arange(30, dtype=torch.float32).reshape(1, 10, 3)
    mask = np.ones((1, 10), bool)
    env_cut, adder_cut = (mappo.agent_targets(values, rows, mask, 0.9, 0.8) for rows in rollouts)
    for key in env_cut:
        np.testing.assert_array_equal(env_cut[key].numpy(), adder_cut[key].numpy(), err_msg=key)
    changed = values.clone()
    changed[0, 7:] += 100.0  # the next episode's values
    later = mappo.agent_targets(changed, rollouts[1], mask, 0.9, 0.8)
    np.testing.assert_array_equal(later["advantages"][:6].numpy(), adder_cut["advantages"][:6].numpy())
    # the last step of agents 1 and 2 bootstraps from their final observation (row 6): r + .9 V(6) - V(5)
    reward = rollouts[1]["reward"][0, 5]
    np.testing.assert_allclose(adder_cut["advantages"][5, 0, 1:].numpy(),
                               reward[1:] + 0.9 * values[0, 6, 1:].numpy() - values[0, 5, 1:].numpy(), rtol=1e-6)
