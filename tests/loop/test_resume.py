"""Resume is exact at any step: a run stopped anywhere (SIGTERM, ``steps=``) and resumed equals the
uninterrupted run, with a learner and collecting without one (one env, several lanes); taking checkpoints
changes nothing; an env whose state cannot be saved is truncated at each checkpoint, said once."""

from __future__ import annotations

import itertools
import os
import signal
import types
import warnings
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import pytest
import torch
from checkpointed_parts import KeyLearner, SeededPolicy, assert_same

import rlflow
from rlflow import adders, envs
from rlflow.loggers import read_csv
from rlflow.replay import Fifo, MinSize, Prioritized, SampleToInsertRatio, StepStore, Table, Uniform
from rlflow.replay.checkpoint import CheckpointError


class Memory(NamedTuple):
    count: np.ndarray  # [E] int64: steps taken in the lane's episode
    h: torch.Tensor  # [E, 1]: the same count, as a float tensor


class RecurrentPolicy(SeededPolicy):
    """Seeded random actions for Discrete(n), flipped on every third step of an episode: the actions depend
    on the recurrent state and on the RNG, both of which a checkpoint keeps. ``stop_at``: the training
    ``act`` call after which it sends SIGTERM to the process (the run stops after that step)."""

    def __init__(self, n: int = 2, seed: int = 5, stop_at: int | None = None, sig=signal.SIGTERM) -> None:
        super().__init__(seed)
        self.n, self.stop_at, self.calls, self.sig = n, stop_at, 0, sig

    def initial_state(self, batch_size):
        return Memory(np.zeros(batch_size, np.int64), torch.zeros(batch_size, 1))

    def act(self, observation, state, *, evaluation=False):
        assert np.array_equal(state.count, state.h[:, 0].numpy().astype(np.int64))
        draw = self.rng.integers(0, self.n, len(observation))
        actions = np.where(state.count % 3 == 2, (draw + 1) % self.n, draw).astype(np.int64)
        if not evaluation:
            self.calls += 1
            if self.calls == self.stop_at:
                os.kill(os.getpid(), self.sig)
        return actions, None, Memory(state.count + 1, state.h + 1)


LANES, STEPS, EVERY = 2, 1_200, 300


def learner_run(logdir, *, checkpoint_every=EVERY, stop_at=None, resume=False, steps=STEPS, max_seconds=None,
                sig=signal.SIGTERM):
    """CartPole (2 lanes, episodes cut at 40 steps) into a prioritized table whose ring wraps, a learner,
    and an evaluation every 250 env steps; returns the result and the objects it leaves."""
    env = envs.make("CartPole-v1", num_envs=LANES, max_episode_steps=40)
    store = StepStore(env.spec, capacity=400, lanes=LANES)
    table = Table(store, sampler=Prioritized(0.6, 0.4, seed=1), remover=Fifo(seed=0),
                  rate_limiter=SampleToInsertRatio(2.0, 20, error_buffer=40))
    adder = adders.NStepTransition(store, [table], n=3, discount=0.9)
    policy, learner = RecurrentPolicy(stop_at=stop_at, sig=sig), KeyLearner()
    eval_env = envs.make("CartPole-v1", num_envs=None, max_episode_steps=40)
    result = rlflow.run(env, policy, learner, adder, table, steps=steps, batch_size=8, eval_env=eval_env,
                        eval_every=250, eval_episodes=2, checkpoint_every=checkpoint_every, logdir=logdir,
                        tensorboard=False, progress=False, seed=11, resume=resume, log_every=500,
                        max_seconds=max_seconds)
    return result, table, learner, policy


def assert_same_run(a, b):
    (r1, t1, l1, p1), (r2, t2, l2, p2) = a, b
    assert (r1.env_steps, r1.learner_steps, r1.stopped) == (r2.env_steps, r2.learner_steps, "")
    assert r1.learner_metrics == r2.learner_metrics
    assert r1.episodes == r2.episodes and r1.evaluations == r2.evaluations
    assert (l1.steps, l1.total) == (l2.steps, l2.total)
    assert p1.rng.bit_generator.state == p2.rng.bit_generator.state
    assert_same(t1.items(), t2.items())
    assert_same(t1.store.state_dict(), t2.store.state_dict())


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("whole")
    return learner_run(logdir, checkpoint_every=0), logdir


def stop_points(result):
    """Env steps to stop at: mid-episode, right after an episode end, on a checkpoint step."""
    ends = {step for step, _, _ in result.episodes}
    steps = range(LANES, STEPS - 200, LANES)
    mid = next(s for s in steps if s > 350 and s % EVERY and s not in ends and s % 250)
    after_end = next(s for s in steps if s > 650 and s % EVERY and s in ends)
    return [mid, after_end, 2 * EVERY]


@pytest.mark.parametrize("which", ["mid-episode", "after an episode end", "on a checkpoint step"])
def test_a_sigterm_anywhere_then_resume_equals_the_uninterrupted_run(tmp_path, whole, which):
    (result, *_), whole_dir = whole
    stop = stop_points(result)[["mid-episode", "after an episode end", "on a checkpoint step"].index(which)]
    stopped = learner_run(tmp_path, stop_at=stop // LANES)
    assert stopped[0].stopped == "SIGTERM" and stopped[0].env_steps == stop
    resumed = learner_run(tmp_path, resume=True)
    assert_same_run(whole[0], resumed)
    assert read_csv(tmp_path / "train.csv") == read_csv(whole_dir / "train.csv")
    assert read_csv(tmp_path / "eval.csv") == read_csv(whole_dir / "eval.csv")


def test_ctrl_c_mid_episode_then_resume_equals_the_uninterrupted_run(tmp_path, whole):
    (result, *_), _ = whole
    stop = stop_points(result)[0]
    stopped = learner_run(tmp_path, stop_at=stop // LANES, sig=signal.SIGINT)
    assert stopped[0].stopped == "SIGINT" and stopped[0].env_steps == stop
    assert_same_run(whole[0], learner_run(tmp_path, resume=True))


def test_a_max_seconds_stop_then_resume_equals_the_uninterrupted_run(tmp_path, whole, monkeypatch):
    ticks = itertools.count()  # a clock that advances one second each time the loop reads it
    monkeypatch.setattr(rlflow.loop.runner, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    stopped = learner_run(tmp_path, max_seconds=700)
    monkeypatch.undo()
    assert stopped[0].stopped == "max_seconds" and 300 < stopped[0].env_steps < STEPS
    assert_same_run(whole[0], learner_run(tmp_path, resume=True))


def test_a_run_resumed_at_its_end_keeps_its_last_learner_metrics(tmp_path):
    stopped = learner_run(tmp_path, stop_at=300)
    resumed = learner_run(tmp_path, resume=True, steps=stopped[0].env_steps)
    assert resumed[0].learner_metrics == stopped[0].learner_metrics and "total" in resumed[0].learner_metrics


def test_a_run_with_checkpoints_equals_one_without(tmp_path, whole):
    assert_same_run(whole[0], learner_run(tmp_path))


def test_stopping_twice_between_checkpoints_then_resuming_equals_the_uninterrupted_run(tmp_path, whole):
    learner_run(tmp_path, stop_at=211)
    learner_run(tmp_path, stop_at=70, resume=True)  # counts the calls of this part: stops at 2 * (211 + 70)
    assert_same_run(whole[0], learner_run(tmp_path, resume=True))


# --------------------------------------------------------------------------- collecting without a learner
def collect_run(logdir, *, steps, checkpoint_every=37, resume=False, num_envs=None):
    """CartPole as a plain env (one lane), or a vector env of ``num_envs`` lanes, collected into a small ring
    in blocks of staged steps."""
    env = envs.make("CartPole-v1", num_envs=num_envs, max_episode_steps=30)
    store = StepStore(env.spec, capacity=120, lanes=env.num_envs)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(seed=0), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=2, discount=0.9, stage_steps=16)
    result = rlflow.run(env, RecurrentPolicy(), None, adder, table, steps=steps, seed=3, progress=False,
                        checkpoint_every=checkpoint_every, checkpoint_dir=logdir, resume=resume)
    return result, table, adder


def assert_same_collection(a, b):
    (r1, t1, a1), (r2, t2, a2) = a, b
    assert r1.env_steps == r2.env_steps and r1.episodes == r2.episodes
    assert_same(t1.store.state_dict(), t2.store.state_dict(), "store/")
    assert_same(t1.state_dict(), t2.state_dict(), "table/")
    assert_same(a1.state_dict(), a2.state_dict(), "adder/")


def test_one_env_stops_at_any_step_then_resume_equal_the_uninterrupted_run(tmp_path):
    whole = collect_run(tmp_path / "whole", steps=600, checkpoint_every=0)
    assert len(whole[0].episodes) > 15 and whole[1].store.count[0] > 120
    ends = {step for step, _, _ in whole[0].episodes}
    after_end = next(s for s in range(300, 600) if s in ends and s % 37)
    for stop in (100, 111, after_end, 600):  # mid-episode, on a checkpoint step (111 = 3 * 37), after an end
        assert stop in ends or stop in (100, 111, 600)
        part = collect_run(tmp_path / "parts", steps=stop, resume=True)
    assert_same_collection(whole, part)
    assert_same_collection(whole, collect_run(tmp_path / "every", steps=600))


def test_collecting_several_lanes_in_blocks_stops_anywhere_then_resumes_as_the_uninterrupted_run(tmp_path):
    """Without a learner the adder holds steps of every lane staged in blocks: a checkpoint keeps them
    staged, as a run that goes on holds them."""
    whole = collect_run(tmp_path / "whole", steps=900, checkpoint_every=0, num_envs=3)
    assert len(whole[0].episodes) > 20 and whole[1].store.count.min() > 120
    for stop in (100, 111, 301, 900):
        part = collect_run(tmp_path / "parts", steps=stop, resume=True, num_envs=3)
    assert_same_collection(whole, part)
    assert_same_collection(whole, collect_run(tmp_path / "every", steps=900, num_envs=3))


# --------------------------------------------------------------------------- an env whose state cannot be saved
class Engine:
    """Stands for a physics engine or renderer: an object that is not plain data."""


class EngineEnv(gym.Env):
    """Observation [t, mark], ``mark`` drawn at each reset; every episode terminates after 7 steps; holds an
    :class:`Engine`."""

    observation_space = gym.spaces.Box(0, 1e6, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.engine = Engine()
        self.t, self.mark = 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.mark = 0, int(self.np_random.integers(0, 1_000))
        return np.array([self.t, self.mark], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, self.mark], np.float32), 1.0, self.t == 7, False, {}


def engine_run(logdir, *, steps, resume=False):
    env = envs.GymEnvironment(EngineEnv())
    store = StepStore(env.spec, capacity=1_000, lanes=1)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(seed=0), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1, discount=0.9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = rlflow.run(env, RecurrentPolicy(), None, adder, table, steps=steps, seed=0, progress=False,
                            checkpoint_every=10, checkpoint_dir=logdir, resume=resume)
    return result, table, adder, [str(w.message) for w in caught if "cannot be saved" in str(w.message)]


def test_an_env_that_cannot_be_saved_is_truncated_at_each_checkpoint_said_once(tmp_path):
    result, table, _, notices = engine_run(tmp_path / "a", steps=60)
    assert len(notices) == 1 and "env.engine" in notices[0] and "Engine" in notices[0]
    assert "truncated" in notices[0]
    # Episodes of 7 steps, and at each checkpoint (every 10 env steps) the episode in progress ends
    # truncated and the env restarts: 7 steps, then 3 cut off, per 10.
    assert [length for _, _, length in result.episodes] == [7] * 6
    rows = int(table.store.count[0])
    got = table.store.gather(np.zeros(rows, np.int64), np.arange(rows))
    assert got["terminated"].sum() == 6 and got["truncated"].sum() == 6
    np.testing.assert_array_equal(got["observation"][np.flatnonzero(got["truncated"]) + 1, 0], [3] * 6)  # its 3rd step
    # A run stopped at a checkpoint step and resumed equals the uninterrupted one (both truncate there).
    engine_run(tmp_path / "b", steps=30)
    resumed = engine_run(tmp_path / "b", steps=60, resume=True)
    assert_same_collection((result, table, _), resumed[:3])
    # A stop between checkpoints truncates there: the episode in progress at step 25 is cut at its 5th step,
    # and the next one (restarted at 25) at the checkpoint of step 30, also at its 5th.
    engine_run(tmp_path / "c", steps=25)
    _, cut, _, _ = engine_run(tmp_path / "c", steps=60, resume=True)
    got = cut.store.gather(np.zeros(int(cut.store.count[0]), np.int64), np.arange(int(cut.store.count[0])))
    np.testing.assert_array_equal(got["observation"][np.flatnonzero(got["truncated"]) + 1, 0], [3, 3, 5, 5, 3, 3, 3])


def test_a_wrong_env_at_resume_is_refused_before_the_table_changes(tmp_path):
    one_env = envs.make("CartPole-v1", num_envs=None, max_episode_steps=30)
    store = StepStore(one_env.spec, capacity=200, lanes=1)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(seed=0), rate_limiter=MinSize(1))
    rlflow.run(one_env, RecurrentPolicy(), None, adders.NStepTransition(store, [table], n=1), table, steps=50,
               seed=0, progress=False, checkpoint_every=25, checkpoint_dir=tmp_path)
    other = envs.GymEnvironment(gym.wrappers.TimeLimit(EngineEnv(), 30))
    other_store = StepStore(one_env.spec, capacity=200, lanes=1)
    other_table = Table(other_store, sampler=Uniform(seed=0), remover=Fifo(seed=0), rate_limiter=MinSize(1))
    other_adder = adders.NStepTransition(other_store, [other_table], n=1)
    before = other_table.state_dict()
    with pytest.raises(ValueError, match="build the env as the checkpointed run did"):
        rlflow.run(other, RecurrentPolicy(), None, other_adder, other_table, steps=100, progress=False,
                   checkpoint_every=25, checkpoint_dir=tmp_path, resume=True)
    assert_same(other_table.state_dict(), before)
    assert other_store.count[0] == 0


def test_an_adders_staged_steps_stay_staged_in_its_state_and_load_only_into_a_like_adder():
    env = envs.make("CartPole-v1", num_envs=2)
    store = StepStore(env.spec, capacity=200, lanes=2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(seed=0), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=2, discount=0.9, stage_steps=16)
    ts = env.reset(seed=0)
    adder.add_first(ts)
    for _ in range(5):
        actions = np.zeros(2, np.int64)
        adder.stage(actions, ts := env.step(actions))
    count, size = store.count.copy(), table.size
    state = adder.state_dict()
    assert state["staged"]["steps"] == 5
    np.testing.assert_array_equal(store.count, count)  # taking the state wrote nothing
    assert table.size == size
    with pytest.raises(CheckpointError, match="staged steps: expected 0 to 4, got 5"):
        adders.NStepTransition(store, [table], n=2, discount=0.9, stage_steps=4).load_state_dict(state)
    other = Table(store, sampler=Uniform(seed=0), remover=Fifo(seed=0), rate_limiter=MinSize(1), name="episodes")
    with pytest.raises(CheckpointError, match="adder setting 'kind'"):
        adders.Episode(store, [other], max_length=50).load_state_dict(state)
    again = adders.NStepTransition(store, [table], n=2, discount=0.9, stage_steps=16)
    again.load_state_dict(state)
    assert_same(again.state_dict(), state)
    again.flush()  # the 5 steps of each lane
    np.testing.assert_array_equal(store.count, count + 5)
