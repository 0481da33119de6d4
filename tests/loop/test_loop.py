"""The event loop: the rate limiter's ratio, parameter-sync lag, clean stops, logging, bad policy output."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import signal

import gymnasium as gym
import numpy as np
import pytest
from checkpointed_parts import KeyLearner, SeededPolicy, assert_same
from hypothesis import given, settings
from hypothesis import strategies as st

import rlflow
from rlflow import adders, envs
from rlflow.loggers import CsvLogger, read_csv
from rlflow.replay import Fifo, MinSize, SampleToInsertRatio, StepStore, Table, Uniform
from rlflow.specs import SpecError
from rlflow.types import ONE_LANE_NO, ONE_LANE_YES, TimeStep


class RandomPolicy(rlflow.Policy):
    """Uniform actions for a Discrete(n) space; keeps the last parameters it was given as `version`."""

    def __init__(self, n: int = 2, seed: int = 0) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)
        self.version = None

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, self.n, len(observation)), None, state

    def set_params(self, params):
        self.version = params


class CountingLearner(rlflow.Learner):
    """Counts its steps; its parameters are the number of steps taken; checks each sample's size."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.steps = 0

    def step(self, sample):
        assert len(sample) == self.batch_size
        self.steps += 1
        return {"loss": 1.0 / self.steps}

    def get_params(self):
        return self.steps


class InsertsAtEachStep(CountingLearner):
    """Records the table's inserts at each of its steps (``seen``)."""

    def __init__(self, batch_size: int, table) -> None:
        super().__init__(batch_size)
        self.limiter, self.seen = table.rate_limiter, []

    def step(self, sample):
        self.seen.append(self.limiter.inserts)
        return super().step(sample)


def setup(num_envs=1, *, limiter, n=1, capacity=10_000):
    env = envs.make("CartPole-v1", num_envs=num_envs, seed=0)
    store = StepStore(env.spec, capacity=capacity, lanes=num_envs)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=limiter)
    adder = adders.NStepTransition(store, [table], n=n, discount=0.9)
    return env, table, adder


@pytest.mark.parametrize(("spi", "batch", "min_size", "error_buffer", "steps", "expected"), [
    # Learner steps happen before each env step while the limiter admits a batch: after the I-th insert
    # (I >= min_size) the learner has made floor((spi * I - min_diff) / batch) steps, min_diff =
    # spi * min_size - error_buffer; the last insert (the final env step) buys none. With n = 1 each env
    # step inserts exactly one item, so I = steps - 1 at the last learner step.
    (2.0, 4, 10, 20.0, 100, math.floor((2.0 * 99 - 0) / 4)),   # min_diff 0: 49
    (1.0, 8, 20, 20.0, 200, math.floor((1.0 * 199 - 0) / 8)),  # 24
    (8.0, 32, 50, 400.0, 120, math.floor((8.0 * 119 - 0) / 32)),  # 29
    (2.0, 4, 10, 12.0, 100, math.floor((2.0 * 99 - 8) / 4)),  # min_diff 20 - 12 = 8: 47
])
def test_learner_steps_follow_the_samples_per_insert_ratio(spi, batch, min_size, error_buffer, steps, expected):
    env, table, adder = setup(limiter=SampleToInsertRatio(spi, min_size, error_buffer=error_buffer))
    learner = CountingLearner(batch)
    result = rlflow.run(env, RandomPolicy(), learner, adder, table, steps=steps, batch_size=batch, progress=False)
    assert result.env_steps == steps and table.rate_limiter.inserts == steps
    assert result.learner_steps == learner.steps == expected
    assert table.rate_limiter.samples == expected * batch


def test_no_learner_step_before_min_size_and_ratio_held_throughout():
    # spi 4, min_size 40, error_buffer 64: offset 160, so every sample must leave I*4 - S >= 96, and
    # (past min_size) every insert must leave I*4 - S <= 224.
    spi, batch, min_size = 4.0, 16, 40
    env, table, adder = setup(num_envs=4, limiter=SampleToInsertRatio(spi, min_size, error_buffer=64))
    limiter = table.rate_limiter
    seen = []

    class Watch(CountingLearner):
        def step(self, sample):
            seen.append((limiter.inserts, limiter.samples))  # the sample is already counted
            return super().step(sample)

    result = rlflow.run(env, RandomPolicy(), Watch(batch), adder, table, steps=400, batch_size=batch, progress=False)
    assert seen and min(i for i, _ in seen) >= min_size
    assert all(96 <= inserts * spi - samples <= 224 for inserts, samples in seen)
    # The learner kept up: after the last env step, less than one batch of samples was left unclaimed.
    assert 96 <= limiter.inserts * spi - limiter.samples < 96 + batch + 4 * spi
    assert result.learner_steps == len(seen)


@pytest.mark.parametrize(("bursts", "learned_at"), [
    # SampleToInsertRatio(4, 10, (40, 76)), batches of 16, one item an env step, 60 steps; the inserts I when
    # each learner step ran. Spread (default): a sample is admitted from diff 4 I - S >= 56: I = 14, then
    # every 4 inserts (each buys 16 samples) up to 58.
    (False, list(range(14, 59, 4))),
    # bursts: the lanes step until 4 (I + 1) - S > 76: the first 19 inserts (diff 76), then the learner until
    # a sample is refused (76 -> 60 -> 44; 28 < 40 refuses a third), then 8 more inserts (44 + 32 = 76) and
    # two steps, and so on: bursts of 8 * 4 / 16 = 2 every 8 inserts, as SB3's train_freq=8, gradient_steps=2.
    (True, [i for i in range(19, 60, 8) for _ in range(2)]),
])
def test_bursts_use_up_the_window_each_side_in_turn(bursts, learned_at):
    env, table, adder = setup(limiter=SampleToInsertRatio(4.0, 10, error_buffer=(40.0, 76.0)))
    learner = InsertsAtEachStep(16, table)
    result = rlflow.run(env, RandomPolicy(), learner, adder, table, steps=60, batch_size=16, progress=False,
                        bursts=bursts)
    assert learner.seen == learned_at and result.learner_steps == 12 and result.env_steps == 60


def _bursts(seen):
    """``(inserts, learner steps)`` of each burst, from the inserts seen at each learner step."""
    return sorted(collections.Counter(seen).items())


def test_bursts_with_lanes_not_dividing_min_size_are_exact_after_the_first():
    """3 lanes, spi 8, min_size 100, batches of 32, the window of 3 learner steps after every 12 items (as
    baselines.replay_rate_limiter builds it): min_diff 800 - 16 = 784, max_diff 800 + (12 + 3 - 0.5) * 8 = 916.
    The lanes step 3 items at a time while (I + 3) * 8 - S <= 916: to 114 items (diff 912), then the learner
    trains to 784: 4 steps (784 - 32 < 784). Then 5 steps of the lanes to 129 (diff 904), 3 learner steps to 808,
    and from there on 12 items (904 again) and 3 steps: the first burst one step longer, the later ones exact."""
    env, table, adder = setup(num_envs=3, limiter=SampleToInsertRatio(8.0, 100, error_buffer=(784.0, 916.0)))
    learner = InsertsAtEachStep(32, table)
    rlflow.run(env, RandomPolicy(), learner, adder, table, steps=300, batch_size=32, progress=False, bursts=True)
    assert _bursts(learner.seen) == [(114, 4)] + [(i, 3) for i in range(129, 298, 12)]


def test_n_step_bursts_are_at_most_one_step_longer_and_keep_the_ratio():
    """One lane, 3-step transitions, spi 8, batches of 32, 4 learner steps after every 16 items (max_diff 800 +
    (16 + 3 - 0.5) * 8): an episode's end stores up to 3 items at once, so a burst may pass the top by up to 2
    items and take a 5th step; never fewer than 4, never more than 5, and the run ends with the diff in the
    window."""
    env, table, adder = setup(n=3, limiter=SampleToInsertRatio(8.0, 100, error_buffer=(784.0, 948.0)))
    learner = InsertsAtEachStep(32, table)
    rlflow.run(env, RandomPolicy(), learner, adder, table, steps=1_500, batch_size=32, progress=False, bursts=True)
    sizes = [n for _, n in _bursts(learner.seen)]
    assert len(sizes) > 50 and set(sizes) == {4, 5}  # CartPole's random episodes end every 20 steps or so
    limiter = table.rate_limiter
    assert 784 <= limiter.inserts * 8 - limiter.samples <= 948


def test_bursts_refuse_a_limiter_that_never_refuses_an_insert():
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 10, error_buffer=(0.0, math.inf)))
    with pytest.raises(ValueError, match=r"never refuses an insert.*bursts"):
        rlflow.run(env, RandomPolicy(), CountingLearner(4), adder, table, steps=10, batch_size=4, progress=False,
                   bursts=True)
    assert table.rate_limiter.inserts == 0
    result = rlflow.run(env, RandomPolicy(), CountingLearner(4), adder, table, steps=40, batch_size=4, progress=False)
    assert result.learner_steps > 0  # learner first, the same limiter moves


@pytest.mark.parametrize(("steps", "top"), [
    # SampleToInsertRatio(1, 10, (0, 60)), one item an env step: the learner's first turn comes when an insert
    # would take the diff above 60, i.e. before the 61st item. Before a run's last step its inserts ask for at
    # most (inserts so far + the run's items) * 1: 59 and 60 are refused (never above 60), 61 runs.
    (59, 59),
    (60, 60),
    (61, None),  # refused before the 61st step: the learner takes its turn
])
def test_bursts_refuse_a_run_whose_learner_would_never_get_the_turn(steps, top):
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 10, error_buffer=(0.0, 60.0)))
    learner = CountingLearner(4)
    if top is not None:
        with pytest.raises(ValueError, match=rf"with bursts .* ask for at most {top}: it would never train .* lower"):
            rlflow.run(env, RandomPolicy(), learner, adder, table, steps=steps, batch_size=4, progress=False,
                       bursts=True)
        assert table.rate_limiter.inserts == 0
        return
    result = rlflow.run(env, RandomPolicy(), learner, adder, table, steps=steps, batch_size=4, progress=False,
                        bursts=True)
    assert result.learner_steps == learner.steps == 15  # at 60 inserts the diff, 60, buys 15 batches of 4


def test_loop_refuses_a_limiter_that_never_refuses_samples():
    env, table, adder = setup(limiter=MinSize(10))
    with pytest.raises(ValueError, match="never refuses a sample"):
        rlflow.run(env, RandomPolicy(), CountingLearner(4), adder, table, steps=10, progress=False)


def test_loop_refuses_a_window_too_narrow_for_one_step():
    # window 2 * error_buffer = 8 < batch 4 + 4 lanes * n 3 * spi 1 = 16: the loop would deadlock. The least
    # error_buffer that passes every check is 11: (min_size - 1 + 12) * 1 <= 10 + error_buffer.
    env, table, adder = setup(num_envs=4, n=3, limiter=SampleToInsertRatio(1.0, 10, error_buffer=4))
    with pytest.raises(ValueError, match="error_buffer of at least 11"):
        rlflow.run(env, RandomPolicy(), CountingLearner(4), adder, table, steps=10, batch_size=4, progress=False)


@pytest.mark.parametrize("period", [1, 3, 10])
def test_policy_lags_the_learner_by_at_most_the_sync_period(period):
    # 4 samples per insert with batch 4 and min_size 1: one learner step per env step, taken just before
    # the actor acts; the policy pulls the learner's parameters (its step count) every `period` env steps.
    env, table, adder = setup(limiter=SampleToInsertRatio(4.0, 1, error_buffer=4))
    policy, learner = RandomPolicy(), CountingLearner(4)
    seen = []
    act = policy.act

    def spy(observation, state, *, evaluation=False):
        seen.append((learner.steps, policy.version))
        return act(observation, state, evaluation=evaluation)

    policy.act = spy
    rlflow.run(env, policy, learner, adder, table, steps=200, batch_size=4, sync_period=period, progress=False)
    assert seen[0] == (0, 0)  # the first action used the learner's initial parameters
    lags = [now - had for now, had in seen]
    assert max(lags) == period and min(lags[1:]) >= 1
    assert learner.steps == 199


def test_bad_policy_output_names_the_policy_and_the_space():
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 10, error_buffer=20))

    class Bad(RandomPolicy):
        def __init__(self, actions):
            super().__init__()
            self.actions = actions

        def act(self, observation, state, *, evaluation=False):
            return self.actions, None, state

    for actions, match in [(np.array([5]), "expected values <= 1"), (np.array([-1]), "expected values >= 0"),
                           (np.array([0, 1]), r"expected shape \(1,\)"), (np.array([0.5]), "expected dtype int64"),
                           (np.array([[1]]), r"expected shape \(1,\)")]:
        before = len(table.store)
        with pytest.raises(SpecError, match=rf"Bad.act returned actions .*Discrete\(2\).*{match}"):
            rlflow.run(env, Bad(actions), CountingLearner(4), adder, table, steps=5, batch_size=4, progress=False)
        assert len(table.store) == before + 1  # only the reset observation of the run's start was stored
        adder.reset()


def test_sigterm_stops_the_run_cleanly():
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 10, error_buffer=20))

    def observer(stream, env_step, metrics):
        if stream == "train":
            os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    result = rlflow.run(env, RandomPolicy(), CountingLearner(4), adder, table, steps=100_000, batch_size=4,
                        progress=False, observers=[observer])
    assert result.stopped == "SIGTERM" and result.env_steps < 100_000 and len(result.episodes) == 1
    assert signal.getsignal(signal.SIGTERM) is handler  # the previous handler is back


def test_logs_episodes_learner_metrics_and_evaluations(tmp_path):
    env, table, adder = setup(num_envs=2, limiter=SampleToInsertRatio(2.0, 20, error_buffer=40))
    eval_env = envs.make("CartPole-v1", num_envs=1)
    seen = []
    result = rlflow.run(env, RandomPolicy(), CountingLearner(8), adder, table, steps=600, batch_size=8,
                        eval_env=eval_env, eval_every=200, eval_episodes=2, logdir=tmp_path, log_every=100,
                        progress=False, seed=3, observers=[lambda *row: seen.append(row)])
    train, learner, evals = (read_csv(tmp_path / f"{s}.csv") for s in ("train", "learner", "eval"))
    assert [float(r["return"]) for r in train] == [r for _, r, _ in result.episodes]
    assert [int(r["step"]) for r in evals] == [200, 400, 600] == [s for s, _, _ in result.evaluations]
    assert [(float(r["return"]), float(r["return_std"])) for r in evals] == [e[1:] for e in result.evaluations]
    assert len(learner) == 6 and all(math.isfinite(float(r["loss"])) for r in learner)
    assert len(seen) == len(train) + len(learner) + len(evals)
    assert list(tmp_path.glob("events.out.tfevents.*"))  # TensorBoard
    # CartPole gives 1 per step: a return equals its episode's length, written as an integer.
    assert all(float(r["return"]) == int(r["length"]) for r in train)


def test_csv_logger_widens_its_header_for_new_keys(tmp_path):
    log = CsvLogger(tmp_path)
    log.write("x", 1, {"a": 1.0})
    log.write("x", 2, {"a": 2.0, "b": 3.0})
    log.close()
    assert read_csv(tmp_path / "x.csv") == [{"step": "1", "a": "1.0", "b": ""}, {"step": "2", "a": "2.0", "b": "3.0"}]


def test_csv_cells_keep_integers_as_integers(tmp_path):
    log = CsvLogger(tmp_path)
    log.write("x", 7, {"int": 19, "np_int": np.int64(-3), "flag": np.bool_(True), "float": 2.0,
                       "np_float": np.float32(0.5)})
    log.close()
    assert read_csv(tmp_path / "x.csv") == [
        {"step": "7", "int": "19", "np_int": "-3", "flag": "1", "float": "2.0", "np_float": "0.5"}]


def test_collect_only_and_evaluate():
    env, table, adder = setup(num_envs=3, limiter=MinSize(1))
    result = rlflow.run(env, RandomPolicy(), None, adder, table, steps=90, progress=False)
    assert result.env_steps == 90 and table.size == 90 and result.learner_steps == 0
    returns = rlflow.evaluate(envs.make("CartPole-v1", num_envs=2), RandomPolicy(), 5, seed=0)
    assert len(returns) == 5 and all(r >= 1 for r in returns)


class PoleSign(rlflow.Policy):
    """Pushes the cart toward the side the pole leans to: a policy that is a function of the observation."""

    def act(self, observation, state, *, evaluation=False):
        assert evaluation
        return (observation[:, 2] > 0).astype(np.int64), None, state


def test_evaluate_with_a_seed_repeats_its_returns():
    """The same seed and a deterministic policy: the same returns (in the order episodes end); another seed:
    other returns."""
    first = rlflow.evaluate(envs.make("CartPole-v1", num_envs=3), PoleSign(), 7, seed=4)
    again = rlflow.evaluate(envs.make("CartPole-v1", num_envs=3), PoleSign(), 7, seed=4)
    other = rlflow.evaluate(envs.make("CartPole-v1", num_envs=3), PoleSign(), 7, seed=5)
    assert len(first) == 7 and first == again and first != other


# --------------------------------------------------------------------------- checkpoints and resume
def prioritized_setup():
    from rlflow.replay import Prioritized

    env = envs.make("CartPole-v1", num_envs=2)
    store = StepStore(env.spec, capacity=500, lanes=2)  # the ring wraps: items are evicted too
    table = Table(store, sampler=Prioritized(0.6, 0.4, seed=1), remover=Fifo(),
                  rate_limiter=SampleToInsertRatio(2.0, 20, error_buffer=40))
    adder = adders.NStepTransition(store, [table], n=3, discount=0.9)
    return env, table, adder


def run_parts(tmp_path, stops):
    """Run to each of ``stops`` in turn, each part with new objects resuming from the last checkpoint."""
    for stop in stops:
        env, table, adder = prioritized_setup()
        policy, learner = SeededPolicy(seed=5), KeyLearner()
        result = rlflow.run(env, policy, learner, adder, table, steps=stop, batch_size=8, checkpoint_every=300,
                            logdir=tmp_path, tensorboard=False, progress=False, seed=11, resume=True)
    return result, table, learner, policy


def test_resumed_run_continues_exactly_as_the_uninterrupted_one(tmp_path):
    whole = run_parts(tmp_path / "whole", [1_500])
    parts = run_parts(tmp_path / "parts", [600, 900, 1_500])  # stops at checkpoints, and between them
    (r1, t1, l1, p1), (r2, t2, l2, p2) = whole, parts
    assert (r1.env_steps, r1.learner_steps) == (r2.env_steps, r2.learner_steps) == (1_500, r1.learner_steps)
    assert r1.learner_steps > 100 and r1.episodes == r2.episodes
    assert (l1.steps, l1.total) == (l2.steps, l2.total)
    assert p1.rng.bit_generator.state == p2.rng.bit_generator.state
    i1, i2 = t1.items(), t2.items()
    for k in i1:
        np.testing.assert_array_equal(i1[k], i2[k], err_msg=k)
    for k, v in t1.store.state_dict().items():
        np.testing.assert_array_equal(v, t2.store.state_dict()[k], err_msg=k)
    # The episode log of the resumed parts adds up to the uninterrupted run's; learner rows are also
    # written where each part ended (the metrics since the last row).
    assert read_csv(tmp_path / "whole" / "train.csv") == read_csv(tmp_path / "parts" / "train.csv")
    assert [r["step"] for r in read_csv(tmp_path / "whole" / "learner.csv")] == ["1000", "1500"]
    assert [r["step"] for r in read_csv(tmp_path / "parts" / "learner.csv")] == ["600", "900", "1000", "1500"]


def test_sigterm_writes_a_checkpoint_a_new_run_resumes_from(tmp_path):
    env, table, adder = prioritized_setup()

    def observer(stream, env_step, metrics):
        if stream == "train":
            os.kill(os.getpid(), signal.SIGTERM)

    result = rlflow.run(env, SeededPolicy(0), KeyLearner(), adder, table, steps=10_000, batch_size=8,
                        checkpoint_every=5_000, logdir=tmp_path, tensorboard=False, progress=False, seed=3,
                        observers=[observer])
    assert result.stopped == "SIGTERM"
    from rlflow.loop import checkpoint as run_checkpoint

    path = run_checkpoint.latest(tmp_path / "checkpoints")
    assert path is not None and path.name == f"step-{result.env_steps:012d}"
    env, table, adder = prioritized_setup()
    resumed = rlflow.run(env, SeededPolicy(0), KeyLearner(), adder, table, steps=result.env_steps + 100,
                         batch_size=8, checkpoint_every=5_000, logdir=tmp_path, tensorboard=False,
                         progress=False, seed=3, resume=True)
    assert resumed.env_steps == result.env_steps + 100
    assert resumed.episodes[:len(result.episodes)] == result.episodes  # the stopped run's, then new ones


def test_a_run_with_bursts_stopped_in_a_burst_resumes_in_it(tmp_path):
    """SIGTERM at the learner's 6th step, the middle of the second burst of 4 (the window of docs/loop.md's
    example: 4 steps after every 16 items): the checkpoint written at the stop keeps the learner's turn, so the
    resumed run ends the burst and learns at the same inserts as the uninterrupted one."""
    def parts():
        env = envs.make("CartPole-v1", num_envs=4)
        store = StepStore(env.spec, capacity=2_000, lanes=4)
        table = Table(store, sampler=Uniform(seed=1), remover=Fifo(),
                      rate_limiter=SampleToInsertRatio(8, 100, error_buffer=(800 - 16, 800 + 19.5 * 8)))
        return env, table, adders.NStepTransition(store, [table], n=1)

    def run(logdir, stop_at=None, resume=False):
        env, table, adder = parts()
        seen = []

        class Recorder(KeyLearner):
            def step(self, sample):
                seen.append(table.rate_limiter.inserts)
                if len(seen) == stop_at:
                    os.kill(os.getpid(), signal.SIGTERM)
                return super().step(sample)

        learner = Recorder()
        result = rlflow.run(env, SeededPolicy(seed=5), learner, adder, table, steps=400, batch_size=32, bursts=True,
                            checkpoint_every=1_000, logdir=logdir, tensorboard=False, progress=False, seed=2,
                            resume=resume)
        return result, seen, learner

    whole, seen, learner = run(tmp_path / "whole")
    assert seen[:8] == [116] * 4 + [132] * 4 and whole.learner_steps == len(seen)
    stopped, first, _ = run(tmp_path / "parts", stop_at=6)
    assert stopped.stopped == "SIGTERM" and first == seen[:6]
    resumed, rest, again = run(tmp_path / "parts", resume=True)
    assert first + rest == seen and resumed.learner_steps == whole.learner_steps
    assert (again.steps, again.total) == (learner.steps, learner.total)


def test_a_corrupt_run_checkpoint_is_refused_and_changes_nothing(tmp_path):
    from rlflow.loop import checkpoint as run_checkpoint
    from rlflow.replay import CheckpointError

    env, table, adder = prioritized_setup()
    rlflow.run(env, SeededPolicy(0), KeyLearner(), adder, table, steps=200, batch_size=8, checkpoint_every=100,
               logdir=tmp_path, tensorboard=False, progress=False)
    path = run_checkpoint.latest(tmp_path / "checkpoints")
    (path / "run.pt").write_bytes(b"not a checkpoint")
    env, table, adder = prioritized_setup()
    before = table.items()
    with pytest.raises(CheckpointError, match="cannot be read as a run checkpoint"):
        rlflow.run(env, SeededPolicy(0), KeyLearner(), adder, table, steps=400, batch_size=8, checkpoint_every=100,
                   logdir=tmp_path, tensorboard=False, progress=False, resume=True)
    assert all(np.array_equal(before[k], v) for k, v in table.items().items())


def test_a_crash_while_saving_leaves_the_previous_checkpoint_as_the_latest(tmp_path, monkeypatch):
    from rlflow.loop import checkpoint as run_checkpoint

    env, table, adder = prioritized_setup()
    rlflow.run(env, SeededPolicy(0), KeyLearner(), adder, table, steps=200, batch_size=8, checkpoint_every=200,
               logdir=tmp_path, tensorboard=False, progress=False, seed=1)
    first = run_checkpoint.latest(tmp_path / "checkpoints")
    assert first is not None and first.name == f"step-{200:012d}"

    def crash(path, store, tables):  # dies after writing part of the new checkpoint's file
        path.write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(run_checkpoint.replay_checkpoint, "save", crash)
    env, table, adder = prioritized_setup()
    with pytest.raises(OSError, match="disk full"):
        rlflow.run(env, SeededPolicy(0), KeyLearner(), adder, table, steps=400, batch_size=8, checkpoint_every=200,
                   logdir=tmp_path, tensorboard=False, progress=False, seed=1, resume=True)
    monkeypatch.undo()
    assert run_checkpoint.latest(tmp_path / "checkpoints") == first
    env, table, adder = prioritized_setup()
    result = rlflow.run(env, SeededPolicy(0), KeyLearner(), adder, table, steps=200, batch_size=8,
                        checkpoint_every=200, logdir=tmp_path, tensorboard=False, progress=False, seed=1, resume=True)
    assert result.env_steps == 200  # resumed from the first checkpoint, already at its end


def test_a_recurrent_policys_state_restarts_with_each_episode():
    """The actor hands the policy its initial state on lanes whose observation starts an episode."""
    from rlflow.loop.actors import Actor

    class Counter(rlflow.Policy):  # state: steps seen in the current episode, per lane
        def initial_state(self, batch_size):
            return {"steps": np.zeros(batch_size, np.int64), "h": torch.zeros(batch_size, 2)}

        def act(self, observation, state, *, evaluation=False):
            seen.append(state["steps"].copy())
            return np.zeros(len(observation), np.int64), None, {"steps": state["steps"] + 1, "h": state["h"] + 1}

    import torch

    seen: list[np.ndarray] = []
    env = envs.make("CartPole-v1", num_envs=3, seed=0)
    actor = Actor(Counter(), env.action_spec, 3, env.single_action_space)
    ts = env.reset(seed=0)
    lengths = np.zeros(3, np.int64)
    for _ in range(60):
        actions, _ = actor.select_action(ts.observation, first=ts.first)
        lengths = np.where(ts.first, 0, lengths)
        assert seen[-1].tolist() == lengths.tolist()  # the state counts this episode's steps only
        assert actor.state["h"][:, 0].tolist() == (lengths + 1).tolist()
        ts = env.step(actions)
        lengths += 1
    assert (lengths < 60).any()  # some episode restarted (always pushing left ends CartPole early)


def test_state_reset_keeps_namedtuples_none_and_refuses_states_without_the_lanes_first():
    from typing import NamedTuple

    import torch

    from rlflow.loop.actors import _reset_rows

    class LSTMState(NamedTuple):
        h: torch.Tensor
        c: torch.Tensor
        step: None = None

    first = np.array([True, False])
    state = LSTMState(torch.ones(2, 3), torch.full((2, 3), 2.0))
    out = _reset_rows(state, LSTMState(torch.zeros(2, 3), torch.zeros(2, 3)), first)
    assert isinstance(out, LSTMState) and out.step is None
    assert out.h[:, 0].tolist() == [0.0, 1.0] and out.c[:, 0].tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="lanes first"):  # nn.GRU's [layers, E, H] layout
        _reset_rows(torch.ones(1, 2, 4), torch.zeros(1, 2, 4), first)


def test_run_refuses_a_limiter_that_deadlocks_just_below_min_size():
    """(m - 1 + items) * spi > max_diff: with m - 1 items stored an env step's items cannot enter, and no sample
    can run before m items: run() refuses it up front (4 lanes x 3-step windows = 12 items a step)."""
    env = envs.make("CartPole-v1", num_envs=4, seed=0)
    store = StepStore(env.spec, capacity=256, lanes=4)
    limiter = SampleToInsertRatio(samples_per_insert=40, min_size_to_sample=100, error_buffer=300)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=limiter)
    adder = adders.NStepTransition(store, [table], n=3)

    class Learner(rlflow.Learner):
        def step(self, sample):
            return {}

        def get_params(self):
            return None

    class Zero(rlflow.Policy):
        def act(self, observation, state, *, evaluation=False):
            return np.zeros(len(observation), np.int64), None, state

    # the window (600) holds a sample plus a step's items (32 + 480), but (99 + 12) * 40 = 4440 > 4300
    with pytest.raises(ValueError, match="error_buffer of at least 440"):
        rlflow.run(env, Zero(), Learner(), adder, table, steps=100, progress=False)


def _stats_reference(steps):
    """Plain Python: per lane, a running return and length; a lone ``first`` is a reset (nothing counts)."""
    lanes = len(steps[0][1])
    ret, length, out = [0.0] * lanes, [0] * lanes, []
    for reward, first, last in steps:
        ended = []
        for i in range(lanes):
            if first[i] and not last[i]:
                continue
            ret[i] += float(np.sum(reward[i], dtype=np.float64))
            length[i] += 1
            if last[i]:
                ended.append((ret[i], length[i]))
                ret[i], length[i] = 0.0, 0
        out.append(ended)
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_episode_stats_match_a_plain_reference(data):
    """Returns and lengths per lane over random flag streams (lone firsts, ends, same-step restarts), with one
    reward per lane or several (per agent, summed); episodes come out in lane order."""
    from rlflow.loop.actors import EpisodeStats

    lanes = data.draw(st.integers(1, 4))
    agents = data.draw(st.sampled_from([None, 1, 3]))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    shape = (lanes,) if agents is None else (lanes, agents)
    steps = []
    for _ in range(data.draw(st.integers(1, 30))):
        reward = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, -0.5, 2.25]), min_size=int(np.prod(shape)),
                                             max_size=int(np.prod(shape)))), dtype).reshape(shape)
        first = np.array(data.draw(st.lists(st.booleans(), min_size=lanes, max_size=lanes)))
        last = np.array(data.draw(st.lists(st.booleans(), min_size=lanes, max_size=lanes)))
        steps.append((reward, first, last))
    stats = EpisodeStats(lanes)
    shared = data.draw(st.booleans())  # one lane's flags as the shared arrays rlflow's one-env wrapper hands out
    cut = data.draw(st.integers(0, len(steps)))  # where the statistics go through state_dict into new ones
    for i, ((reward, first, last), expected) in enumerate(zip(steps, _stats_reference(steps), strict=True)):
        if i == cut:
            state, stats, no = stats.state_dict(), EpisodeStats(lanes), np.zeros(lanes, bool)
            stats.update(TimeStep(None, np.ones(shape, dtype), no, no, no, no))  # counts that the state replaces
            stats.load_state_dict(state)
        if shared and lanes == 1:
            first, last = (ONE_LANE_YES if f[0] else ONE_LANE_NO for f in (first, last))
        ts = TimeStep(None, reward, last & False, last.copy(), first, last)
        got = stats.update(ts)
        assert [(pytest.approx(r), n) for r, n in expected] == got
        assert all(type(r) is float and type(n) is int for r, n in got)


def test_episode_stats_of_one_lane_in_progress_and_reset():
    # One lane's steps as the one-env wrapper gives them (one reward, the shared read-only flags) and with a
    # reward per agent (summed): the episode in progress carries across the two.
    from rlflow.loop.actors import EpisodeStats

    stats = EpisodeStats(1)
    yes, no = ONE_LANE_YES, ONE_LANE_NO
    assert stats.update(TimeStep(None, np.zeros(1, np.float32), no, no, yes, no)) == []  # the reset
    assert stats.update(TimeStep(None, np.array([1.5], np.float32), no, no, no, no)) == []
    assert stats.update(TimeStep(None, np.array([[0.25, 0.25]]), no, no, np.array([False]), np.array([False]))) == []
    assert stats.returns.tolist() == [2.0] and stats.lengths.tolist() == [2]
    assert stats.update(TimeStep(None, np.array([3.0], np.float32), no, no, no, no)) == []
    got = stats.update(TimeStep(None, np.array([[1.0, 1.0]]), yes, yes, yes, yes))  # ends, restarts
    assert got == [(7.0, 4)] and stats.returns.tolist() == [0.0] and stats.lengths.tolist() == [0]
    stats.update(TimeStep(None, np.array([2.0], np.float32), no, no, no, no))
    stats.returns[0] = 99.0  # a copy: the count is not touched
    assert stats.returns.tolist() == [2.0] and stats.lengths.dtype == np.int64
    stats.reset()
    assert stats.returns.tolist() == [0.0] and stats.lengths.tolist() == [0]
    assert stats.update(TimeStep(None, np.array([1.0], np.float32), no, yes, no, yes)) == [(1.0, 1)]
    several = EpisodeStats(2)
    several.update(TimeStep(None, np.array([1.0, 2.0]), np.zeros(2, bool), np.zeros(2, bool), np.zeros(2, bool),
                            np.zeros(2, bool)))
    assert several.returns.tolist() == [1.0, 2.0] and several.lengths.tolist() == [1, 1]
    several.reset()
    assert several.returns.tolist() == [0.0, 0.0] and several.lengths.tolist() == [0, 0]


def test_numpy_state_round_trips_through_a_run_checkpoint(tmp_path):
    # Learners and policies keep numpy arrays and scalars in their state (running statistics, RNG draws);
    # a run checkpoint loads with weights_only=True, which refuses them as they are: they come back encoded
    # and decoded, same dtype, shape, values and type, and modules' OrderedDict states are left as they are.
    from collections import OrderedDict

    import torch

    from rlflow.loop import checkpoint as run_checkpoint
    from rlflow.returns import ValueNormalizer

    table = prioritized_setup()[1]
    norm = ValueNormalizer()
    norm.update(np.array([1.0, 2.0, 4.0]))
    module_state = torch.nn.Linear(2, 1).state_dict()
    learner = {"matrix": np.arange(6, dtype=np.float32).reshape(2, 3), "flags": np.array([True, False]),
               "empty": np.zeros((0, 4), np.int16), "zero_d": np.array(7, np.uint8), "f64": np.float64(2.5),
               "i32": np.int32(-3), "nested": [1, (np.int64(4), "x"), {"b": np.array([1.5], np.float16)}],
               "norm": norm.state_dict(), "module": module_state, "plain": {"n": 3, "s": "abc", "none": None}}
    run_checkpoint.save_run(tmp_path, 10, table.store, table, {"learner": learner})
    table = prioritized_setup()[1]
    back = run_checkpoint.load_run(run_checkpoint.latest(tmp_path), table.store, table)["learner"]

    def same(a, b):
        assert type(a) is type(b), (a, b)
        if isinstance(a, np.ndarray | np.generic):
            assert a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.array_equal(a, b)
        elif isinstance(a, dict):
            assert list(a) == list(b)
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, list | tuple):
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        elif isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert a == b

    same(learner, back)
    assert isinstance(back["module"], OrderedDict) and back["zero_d"].shape == ()
    other = ValueNormalizer()
    other.load_state_dict(back["norm"])
    assert other.mean == norm.mean and other.var == norm.var
    # a saved state file (the baselines' learner.pt) takes the same values the same way
    run_checkpoint.save_state(tmp_path / "learner.pt", {"learner": learner, "args": {"hidden": (64, 64)}})
    saved = run_checkpoint.load_state(tmp_path / "learner.pt")
    same(learner, saved["learner"])
    assert saved["args"] == {"hidden": (64, 64)}


def test_a_state_that_cannot_be_stored_is_refused_keeping_the_last_checkpoint(tmp_path):
    from rlflow.loop import checkpoint as run_checkpoint
    from rlflow.replay import CheckpointError

    table = prioritized_setup()[1]
    first = run_checkpoint.save_run(tmp_path, 10, table.store, table, {"learner": {"ok": np.zeros(2)}})
    bad = np.empty(2, object)
    with pytest.raises(TypeError, match=r"state\['learner'\]\['stats'\]\[1\] is a numpy value of dtype object"):
        run_checkpoint.save_run(tmp_path, 20, table.store, table, {"learner": {"stats": [1, bad]}})
    assert run_checkpoint.latest(tmp_path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", first.name]  # nothing half-written
    # a state file: the refusal leaves the file written before as it was
    path = tmp_path / "state" / "learner.pt"
    path.parent.mkdir()
    run_checkpoint.save_state(path, {"learner": {"ok": np.zeros(2)}})
    before = path.read_bytes()
    with pytest.raises(TypeError, match=r"state\['learner'\]\['stats'\]\[1\] is a numpy value of dtype object"):
        run_checkpoint.save_state(path, {"learner": {"stats": [1, bad]}})
    assert path.read_bytes() == before and [p.name for p in path.parent.iterdir()] == ["learner.pt"]
    np.testing.assert_array_equal(run_checkpoint.load_state(path)["learner"]["ok"], np.zeros(2))
    path.write_bytes(b"not a state")
    with pytest.raises(CheckpointError, match="cannot be read as a saved state"):
        run_checkpoint.load_state(path)


# --------------------------------------------------------------------------- what a run collects
class ScriptedEnv(gym.Env):
    """Box(3,) observations and Discrete(3) actions. Episodes of 1 to 11 steps (seeded) end by termination
    when their length is even; a TimeLimit of 7 truncates the others. Rewards (0.1 t + action) are not exact
    in float32; every fifth step has an info entry. ``obs_dtype`` and ``reward_type`` are what the env
    returns (the space says float32), ``nan_at`` the env step whose observation is NaN."""

    action_space = gym.spaces.Discrete(3)

    def __init__(self, *, obs_shape=(3,), obs_dtype=np.float32, reward_type=float, nan_at=None) -> None:
        self.observation_space = gym.spaces.Box(-100.0, 100.0, obs_shape, np.float32)
        self.obs_shape, self.obs_dtype, self.reward_type, self.nan_at = obs_shape, obs_dtype, reward_type, nan_at
        self.steps = 0

    def _obs(self):
        values = np.array([self.t, self.length, self.steps % 17], self.obs_dtype) / 3
        if self.steps == self.nan_at:
            values[1] = np.nan
        return np.resize(values, self.obs_shape)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(1, 12))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.steps += 1
        reward = self.reward_type(0.1 * self.t + int(action))
        info = {"step": self.steps} if self.steps % 5 == 0 else {}
        return self._obs(), reward, self.t >= self.length and self.length % 2 == 0, False, info


def scripted_parts(*, stage_steps=5, n=3, capacity=40, **env_kwargs):
    """A one-env ``ScriptedEnv`` (time limit 7, first reset seeded) and a small ring (it wraps) with its table
    and n-step adder."""
    env = envs.GymEnvironment(gym.wrappers.TimeLimit(ScriptedEnv(**env_kwargs), max_episode_steps=7), seed=3)
    store = StepStore(env.spec, capacity=capacity, lanes=1)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(seed=0), rate_limiter=MinSize(1))
    return env, store, table, adders.NStepTransition(store, [table], n=n, discount=0.9, stage_steps=stage_steps)


def hand_loop(env, policy, adder, steps):
    """The loop body spelled out, one ``adder.add`` per step and the episodes counted in plain Python:
    what ``rlflow.run(..., learner=None)`` must leave. Returns its episodes as ``RunResult.episodes``."""
    from rlflow.loop.actors import Actor

    actor = Actor(policy, env.action_spec, 1, env.single_action_space)
    ts = env.reset()
    adder.add_first(ts)
    episodes, ret, length = [], 0.0, 0
    for step in range(1, steps + 1):
        actions, extras = actor.select_action(ts.observation, first=ts.first)
        ts = env.step(actions)
        adder.add(actions, ts, extras)
        ret, length = ret + float(ts.reward[0]), length + 1
        if ts.last[0]:
            episodes.append((step, ret, length))
            ret, length = 0.0, 0
    return episodes


def without_keys(items):
    """A table's items without their keys (staged steps get other keys than steps added one by one)."""
    return {k: v for k, v in items.items() if k != "key"}


@pytest.mark.parametrize("env_kwargs", [
    {}, {"reward_type": np.float64}, {"reward_type": np.float32}, {"obs_dtype": np.float64},  # (the wrapper casts)
    {"obs_shape": ()}, {"obs_shape": (2, 3)}, {"obs_shape": (6, 7)},
])
@pytest.mark.parametrize(("stage_steps", "n", "checkpoints"), [(5, 3, False), (64, 1, False), (3, 2, True)])
def test_a_run_without_learner_collects_what_one_add_per_step_writes(tmp_path, env_kwargs, stage_steps, n,
                                                                      checkpoints):
    """Episodes that terminate and truncate, infos, a ring that wraps (items evicted), blocks of staged steps
    written inside episodes, and checkpoints (which change nothing): the run leaves the rows, items and
    episodes of a hand-written loop that adds each step."""
    env, store, table, adder = scripted_parts(stage_steps=stage_steps, n=n, **env_kwargs)
    extra = {"checkpoint_every": 37, "checkpoint_dir": tmp_path} if checkpoints else {}
    result = rlflow.run(env, RandomPolicy(3, seed=1), None, adder, table, steps=300, progress=False, **extra)
    ref_env, ref_store, ref_table, ref_adder = scripted_parts(stage_steps=stage_steps, n=n, **env_kwargs)
    episodes = hand_loop(ref_env, RandomPolicy(3, seed=1), ref_adder, 300)
    assert result.env_steps == 300 and result.stopped == ""
    assert result.episodes == episodes and len(episodes) > 30  # returns to the last bit, lengths, env steps
    assert {length for _, _, length in episodes} >= {2, 7}  # ends by termination (even) and by the time limit
    assert store.count[0] > 40  # the ring wrapped: items were evicted
    assert_same(store.state_dict(), ref_store.state_dict())
    assert_same(without_keys(table.items()), without_keys(ref_table.items()))
    assert table.size == ref_table.size > 0
    assert (len(list(tmp_path.glob("step-*"))) == 1) is checkpoints  # the last checkpoint, older ones removed


@pytest.mark.parametrize("obs_shape", [(3,), (6, 7)])
@pytest.mark.parametrize("nan_at", [4, 23])
def test_a_bad_observation_stops_the_run_with_the_steps_before_written(nan_at, obs_shape):
    """The env step whose observation is NaN raises the adder's SpecError; the run flushes on its way out, so
    the store holds every step before it, as a hand-written loop that adds each step leaves it."""
    env, store, table, adder = scripted_parts(nan_at=nan_at, stage_steps=8, capacity=100, obs_shape=obs_shape)
    with pytest.raises(SpecError, match="finite") as raised:
        rlflow.run(env, RandomPolicy(3, seed=1), None, adder, table, steps=100, progress=False)
    ref_env, ref_store, ref_table, ref_adder = scripted_parts(nan_at=nan_at, stage_steps=8, capacity=100,
                                                              obs_shape=obs_shape)
    with pytest.raises(SpecError, match="finite") as expected:
        hand_loop(ref_env, RandomPolicy(3, seed=1), ref_adder, 100)
    assert str(raised.value) == str(expected.value)
    assert_same(store.state_dict(), ref_store.state_dict())
    assert_same(without_keys(table.items()), without_keys(ref_table.items()))
    assert int(store.count[0]) >= nan_at  # every step before the bad one, and the episodes' first rows


def test_run_options_come_as_keywords_or_as_a_config():
    from rlflow.loop import RunConfig

    parts = [setup(num_envs=2, limiter=SampleToInsertRatio(2.0, 20, error_buffer=40)) for _ in range(3)]
    seen = [[], [], []]
    config = RunConfig(log_every=100, progress=False, seed=3, observers=[lambda *row: seen[1].append(row)])
    results = [
        rlflow.run(parts[0][0], RandomPolicy(), CountingLearner(8), parts[0][2], parts[0][1], steps=300, batch_size=8,
                   log_every=100, progress=False, seed=3, observers=[lambda *row: seen[0].append(row)]),
        rlflow.run(parts[1][0], RandomPolicy(), CountingLearner(8), parts[1][2], parts[1][1], steps=300, batch_size=8,
                   config=config),
        # keywords replace the config's fields
        rlflow.run(parts[2][0], RandomPolicy(), CountingLearner(8), parts[2][2], parts[2][1], steps=300, batch_size=8,
                   config=dataclasses.replace(config, seed=7, log_every=5), seed=3, log_every=100,
                   observers=[lambda *row: seen[2].append(row)]),
    ]
    assert results[0] == results[1] == results[2] and results[0].learner_steps > 0
    assert seen[0] == seen[1] == seen[2] and any(stream == "learner" for stream, _, _ in seen[0])


def test_an_unknown_run_option_is_refused_naming_the_valid_ones():
    env, table, adder = setup(limiter=MinSize(1))
    with pytest.raises(TypeError, match=r"unknown option\(s\) eval_evry, logdri: expected steps, batch_size, config, "
                                        r"or the fields of RunConfig: sync_period, eval_env, eval_every, .*resume"):
        rlflow.run(env, RandomPolicy(), None, adder, table, steps=10, progress=False, eval_evry=5, logdri="x")
    assert int(table.store.count[0]) == 0  # refused before anything ran
    with pytest.raises(ValueError, match="eval_every: expected env steps >= 0, got -1"):
        rlflow.run(env, RandomPolicy(), None, adder, table, steps=10, progress=False, eval_every=-1)
    with pytest.raises(ValueError, match="eval_episodes: expected an integer >= 1, got 0"):
        rlflow.run(env, RandomPolicy(), None, adder, table, steps=10, progress=False, eval_episodes=0)


def test_max_seconds_stops_the_run_between_steps(monkeypatch):
    import itertools
    import types

    ticks = itertools.count()  # a clock that advances one second each time the loop reads it
    monkeypatch.setattr(rlflow.loop.runner, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    env, table, adder = setup(num_envs=2, limiter=MinSize(1))
    result = rlflow.run(env, RandomPolicy(), None, adder, table, steps=1_000, progress=False, max_seconds=50)
    assert result.stopped == "max_seconds" and 0 < result.env_steps <= 2 * 50  # at most one turn per clock read
    assert table.size == result.env_steps  # the staged steps were written


@pytest.mark.parametrize(("space", "good", "bad", "match"), [
    (gym.spaces.Discrete(3), np.array([2]), np.array([3]), "<= 2"),
    (gym.spaces.Discrete(3, start=-1), np.array([-1]), np.array([-2]), ">= -1"),
    (gym.spaces.Box(-1, 1, (1,), np.float32), np.array([[0.5]], np.float32), np.array([[np.nan]], np.float32),
     "finite"),
    (gym.spaces.Box(-1, 1, (), np.float64), np.array([7.0]), np.array([np.inf]), "finite"),  # no bounds on floats
    (gym.spaces.MultiBinary(1), np.array([[1]], np.int8), np.array([[2]], np.int8), "<= 1"),
])
def test_the_actor_checks_one_lanes_single_action_as_any_other(space, good, bad, match):
    from rlflow.loop.actors import Actor
    from rlflow.specs import from_space

    class Fixed(rlflow.Policy):
        def act(self, observation, state, *, evaluation=False):
            return self.actions, None, state

    policy = Fixed()
    actor = Actor(policy, from_space(space), 1, space)
    policy.actions = good
    assert actor.select_action(np.zeros((1, 2)))[0] is good
    policy.actions = bad
    with pytest.raises(SpecError, match=match):
        actor.select_action(np.zeros((1, 2)))


def test_the_progress_bar_redraws_rarely_into_a_log_file(capsys):
    """Standard error not a terminal (pytest captures it into a file): redrawn at most every 30 s; a count
    shows as an integer."""
    from rlflow.loggers import PROGRESS_LOG_INTERVAL, progress_bar

    bar = progress_bar(50_000, initial=10_000)
    assert bar.mininterval == PROGRESS_LOG_INTERVAL == 30.0 and bar.n == 10_000 and not bar.disable
    for _ in range(100):
        bar.update(100)
    bar.set_postfix(learner_steps=str(12_345), refresh=False)
    bar.close()
    written = capsys.readouterr().err
    assert written.count("\r") <= 3  # the first draw and the close, not one per update
    assert "20000/50000" in written and "learner_steps=12345" in written and "e+" not in written
    assert progress_bar(5, enabled=False).disable
