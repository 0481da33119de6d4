"""What rlflow.run refuses before it starts (wrong objects, limiters under which it could only wait), that a
stop request ends a run waiting for room in a table, and the error_buffer its deadlock message suggests."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
import threading

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ma_envs import DyingAgents

import rlflow
from rlflow import adders, envs
from rlflow.loop.checks import check_limiter, least_error_buffer
from rlflow.replay import Fifo, MinSize, Queue, SampleToInsertRatio, StepStore, Table, Uniform


class ZeroPolicy(rlflow.Policy):
    def act(self, observation, state, *, evaluation=False):
        return np.zeros(len(observation), np.int64), None, state


_METRICS = object()  # (StepLearner's default: no metrics)


class StepLearner(rlflow.Learner):
    """Returns what it is given to return from each step."""

    def __init__(self, out=_METRICS) -> None:
        self.out = {} if out is _METRICS else out

    def step(self, sample):
        return self.out


def setup(num_envs=1, *, limiter, n=1, capacity=1_000, max_times_sampled=None, other=None):
    """An env, the table ``t0`` (``limiter``) and an n-step adder writing it and, with ``other`` (a limiter), a
    second table ``t1`` that takes each item at most once."""
    env = envs.make("CartPole-v1", num_envs=num_envs, seed=0)
    store = StepStore(env.spec, capacity=capacity, lanes=num_envs)
    made = [Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=limiter,
                  max_times_sampled=max_times_sampled, name="t0")]
    if other is not None:
        made.append(Table(store, sampler=Fifo(), remover=Fifo(), rate_limiter=other, max_times_sampled=1, name="t1"))
    adder = adders.NStepTransition(store, made, n=n, discount=0.9)
    return env, made[0], adder


# --------------------------------------------------------------------------- wrong objects
def _run_with(**parts):
    env, table, adder = setup(limiter=MinSize(1))
    args = {"env": env, "policy": ZeroPolicy(), "learner": None, "adder": adder, "table": table, **parts}
    rlflow.run(args.pop("env"), args.pop("policy"), args.pop("learner"), args.pop("adder"), args.pop("table"),
               steps=10, progress=False, **args)


@pytest.mark.parametrize(("parts", "match"), [
    ({"env": gym.make("CartPole-v1")},
     r"env: rlflow.run expected an rlflow env .*got TimeLimit; wrap it: envs.GymEnvironment\(env\), or "
     r"envs.make\(env_id, num_envs=...\)"),
    ({"env": gym.make_vec("CartPole-v1", 1)}, r"got CartPoleVectorEnv; wrap it: envs.GymEnvironment\(vector_env\)"),
    ({"env": DyingAgents()}, r"got DyingAgents; wrap it: envs.ParallelEnvironment\(\[env, ...\]\)"),
    ({"env": "CartPole-v1"}, r"got str \(no num_envs, action_spec, single_action_space, reset, step\); use "
                             r"envs.GymEnvironment\(gymnasium_env\), envs.make\(env_id"),
    ({"eval_env": gym.make("CartPole-v1")}, r"eval_env: rlflow.run expected an rlflow env .*envs.GymEnvironment"),
    ({"policy": lambda obs, state: (obs, None, state)},
     r"policy: rlflow.run expected an rlflow.Policy \(act\(observation, state, \*, evaluation\) -> \(actions, "
     r"extras, state\)\), got function \(no act, initial_state"),
    ({"learner": object()}, r"learner: rlflow.run expected an rlflow.Learner .* or None to only collect, got object"),
    ({"adder": object()}, r"adder: rlflow.run expected an rlflow adder"),
    ({"table": object()}, r"table: rlflow.run expected an rlflow.replay.Table"),
])
def test_run_names_what_it_expected_and_how_to_get_it_for_a_wrong_object(parts, match):
    with pytest.raises(TypeError, match=match):
        _run_with(**parts)


def test_evaluate_names_the_wrapper_for_a_gymnasium_env():
    with pytest.raises(TypeError, match=r"env: rlflow.evaluate expected an rlflow env .*got TimeLimit; wrap it: "
                                        r"envs.GymEnvironment\(env\)"):
        rlflow.evaluate(gym.make("CartPole-v1"), ZeroPolicy(), 2)


def test_run_names_the_store_lanes_setting_when_the_env_has_other_lanes():
    _, table, adder = setup(num_envs=2, limiter=MinSize(1))
    with pytest.raises(ValueError, match=r"the adder's store has 2 lanes, the env 4: .*lanes=env.num_envs"):
        rlflow.run(envs.make("CartPole-v1", num_envs=4), ZeroPolicy(), None, adder, table, steps=10, progress=False)


@pytest.mark.parametrize(("out", "match"), [
    (None, r"StepLearner.step returned NoneType: expected a LearnerUpdate\(metrics, priorities=None\) or a dict "
           r"of float metrics \(return \{\} when there are none\)"),
    (0.5, "StepLearner.step returned float: expected a LearnerUpdate"),
    ({"loss": [1.0, 2.0]}, r"StepLearner.step returned the metric 'loss' = \[1.0, 2.0\]: expected a number"),
    (rlflow.LearnerUpdate({"loss": "high"}), "the metric 'loss' = 'high': expected a number"),
])
def test_a_learner_step_that_returns_no_metrics_names_the_learner_and_what_to_return(out, match):
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 4, error_buffer=8))
    with pytest.raises(TypeError, match=match):
        rlflow.run(env, ZeroPolicy(), StepLearner(out), adder, table, steps=50, batch_size=2, progress=False)


# --------------------------------------------------------------------------- tables nothing samples
def bounded(fn, timeout=60.0):
    """``fn()`` in a daemon thread: its result, or its exception raised here; fails the test if it has not
    returned after ``timeout`` seconds (a run that waits for ever must not hang the test session)."""
    out: list = []

    def call():
        try:
            out.append(("ok", fn()))
        except BaseException as exc:  # (handed to the test's thread)
            out.append(("raised", exc))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    assert out, f"still running after {timeout} s: waiting for ever"
    kind, value = out[0]
    if kind == "raised":
        raise value
    return value


def test_without_a_learner_a_limiter_that_waits_for_samples_is_refused_naming_the_fix():
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 10, error_buffer=100))  # admits 110 items
    with pytest.raises(ValueError, match=re.escape(
            "table 't0': learner=None: nothing samples it during the run, so its rate limiter must admit, without a "
            "sample, every item the run may write: up to 1000 (1000 env steps x 1)")
            + r".* admits 110 more; the run would wait for samples for ever\. Give that table MinSize\(min_size\) "
              r"\(it only collects\), sample it with a learner, or run at most 110 steps"):
        bounded(lambda: rlflow.run(env, ZeroPolicy(), None, adder, table, steps=1_000, progress=False))
    assert table.size == 0 and int(table.store.count[0]) == 0  # refused before anything ran


@pytest.mark.parametrize(("steps", "n", "refused"), [
    (110, 1, False),   # 110 items, 110 admitted
    (111, 1, True),
    (36, 3, False),    # up to 3 items an env step: 108 <= 110
    (37, 3, True),     # 111 > 110 (although each action makes one item: the bound counts an episode's end)
])
def test_without_a_learner_a_run_that_fits_the_limiter_runs_to_its_end(steps, n, refused):
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 10, error_buffer=100), n=n)
    if refused:
        with pytest.raises(ValueError, match="learner=None: nothing samples it"):
            bounded(lambda: rlflow.run(env, ZeroPolicy(), None, adder, table, steps=steps, progress=False))
        return
    result = bounded(lambda: rlflow.run(env, ZeroPolicy(), None, adder, table, steps=steps, progress=False))
    assert result.env_steps == steps and result.stopped == "" and 0 < table.size <= 110


def test_a_queue_only_filled_by_a_run_without_learner_is_taken_up_to_its_size():
    env, table, adder = setup(limiter=Queue(64), max_times_sampled=1)
    bounded(lambda: rlflow.run(env, ZeroPolicy(), None, adder, table, steps=64, progress=False))
    assert table.size == 64
    with pytest.raises(ValueError, match=r"Queue\(.*admits 0 more"):
        bounded(lambda: rlflow.run(env, ZeroPolicy(), None, adder, table, steps=8, progress=False))


def test_with_a_learner_another_table_nothing_samples_is_refused():
    env, table, adder = setup(limiter=SampleToInsertRatio(1.0, 4, error_buffer=8), other=Queue(16))
    with pytest.raises(ValueError, match="table 't1': the learner samples table 't0', nothing samples this one"):
        bounded(lambda: rlflow.run(env, ZeroPolicy(), StepLearner(), adder, table, steps=100, batch_size=2,
                                   progress=False))


_WAITING_RUN = """
import os, signal, threading, warnings
import numpy as np
import rlflow
from rlflow import adders, envs
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform

class ZeroPolicy(rlflow.Policy):
    def act(self, observation, state, *, evaluation=False):
        return np.zeros(len(observation), np.int64), None, state

env = envs.make("CartPole-v1", num_envs=2, seed=0)
store = StepStore(env.spec, capacity=1_000, lanes=2)
table = Table(store, sampler=Uniform(seed=0), remover=Fifo(),
              rate_limiter=SampleToInsertRatio(1.0, 1, error_buffer=(-1.0, 2_000.0)))
adder = adders.NStepTransition(store, [table], n=1, discount=0.9, stage_steps=1)
filled = []

def observer(stream, env_step, metrics):
    # Another writer fills the table at the first episode's end: the run's next items find no room.
    if stream == "train" and not filled:
        while table.can_insert(1):
            table.insert([0], [int(store.count[0]) - 1], [1], fields={"return": np.zeros(1), "discount": np.ones(1)})
        filled.append(env_step)
        if STOP != "max_seconds":
            threading.Timer(0.3, os.kill, (os.getpid(), getattr(signal, STOP))).start()

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = rlflow.run(env, ZeroPolicy(), None, adder, table, steps=1_000, progress=False, observers=[observer],
                        max_seconds=MAX_SECONDS)
waited = [str(w.message) for w in caught if "waiting for a sampler" in str(w.message)]
print(result.stopped, result.env_steps == filled[0], result.env_steps < 1_000, len(waited))
"""


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT", "max_seconds"])
def test_a_stop_request_ends_a_run_waiting_for_room_in_a_table(stop):
    """A run without a learner whose table another writer filled waits for a sampler, in slices that end on
    Ctrl-C, SIGTERM or max_seconds (run in a child process, so that a wait that never ends fails the test
    at its timeout instead of hanging it)."""
    max_seconds = 1.0 if stop == "max_seconds" else 60.0
    script = textwrap.dedent(_WAITING_RUN).replace("STOP", repr(stop)).replace("MAX_SECONDS", repr(max_seconds))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [stop, "True", "True", "1"]


# --------------------------------------------------------------------------- the error_buffer to suggest
def test_the_suggested_error_buffer_satisfies_every_check_of_the_loop():
    """SampleToInsertRatio(1.0, 10, 4), 4 lanes, 3-step windows (12 items a step), batches of 4: the window needs
    (4 + 12) / 2 = 8 and the phase below min_size (12 - 1) * 1 = 11: the message says 11, and 11 runs."""
    env, table, adder = setup(num_envs=4, n=3, limiter=SampleToInsertRatio(1.0, 10, error_buffer=4))
    with pytest.raises(ValueError, match=r"error_buffer of at least 11 \(the least that passes every check\)"):
        rlflow.run(env, ZeroPolicy(), StepLearner(), adder, table, steps=10, batch_size=4, progress=False)
    for e, ok in ((10, False), (11, True)):
        env, table, adder = setup(num_envs=4, n=3, limiter=SampleToInsertRatio(1.0, 10, error_buffer=e))
        if not ok:
            with pytest.raises(ValueError, match="error_buffer of at least 11"):
                rlflow.run(env, ZeroPolicy(), StepLearner(), adder, table, steps=10, batch_size=4, progress=False)
            continue
        result = rlflow.run(env, ZeroPolicy(), StepLearner(), adder, table, steps=400, batch_size=4, progress=False)
        assert result.env_steps == 400 and result.learner_steps > 0


def test_a_queue_too_small_for_the_loop_is_given_the_size_that_works():
    env, table, adder = setup(num_envs=2, n=2, limiter=Queue(6), max_times_sampled=1)
    with pytest.raises(ValueError, match=r"give the Queue a size of at least 8 \(batch_size 4 \+ one env step's 4"):
        rlflow.run(env, ZeroPolicy(), StepLearner(), adder, table, steps=10, batch_size=4, progress=False)


class _Table:
    """What check_limiter reads of a table."""

    def __init__(self, limiter: SampleToInsertRatio) -> None:
        self.rate_limiter, self.name = limiter, "t"


def _limiter(spi: float, m: int, e: float) -> SampleToInsertRatio | None:
    """The limiter, if it and a table of it can be made (else None)."""
    try:
        limiter = SampleToInsertRatio(spi, m, e)
        limiter.check_deadlock_free(10**9, None)
    except ValueError:
        return None
    return limiter


@settings(max_examples=300, deadline=None)
@given(spi=st.one_of(st.integers(1, 40).map(float), st.floats(0.05, 40.0, allow_nan=False)),
       m=st.integers(1, 500), e=st.floats(0.0, 2_000.0), lanes=st.integers(1, 16), n=st.integers(1, 6),
       batch=st.integers(1, 256))
def test_the_suggested_error_buffer_passes_and_one_less_fails(spi, m, e, lanes, n, batch):
    items = lanes * n
    limiter = _limiter(spi, m, e)
    if limiter is None:
        return
    try:
        check_limiter(_Table(limiter), batch, items)
    except ValueError as exc:
        suggested = int(re.search(r"error_buffer of at least (\d+)", str(exc)).group(1))
        assert suggested == least_error_buffer(spi, m, batch, items) > e
        good = _limiter(spi, m, suggested)
        assert good is not None
        check_limiter(_Table(good), batch, items)  # passes
        worse = _limiter(spi, m, suggested - 1)
        if worse is not None:
            with pytest.raises(ValueError, match="the loop would deadlock"):
                check_limiter(_Table(worse), batch, items)
        # the bound by hand, max((batch + items*spi) / 2, (items - 1)*spi, max(1, spi)), rounded up (float
        # rounding of the limiter's diffs may move the least whole number that passes by one)
        exact = max((batch + items * spi) / 2, (items - 1) * spi, max(1.0, spi))
        assert abs(suggested - math.ceil(exact)) <= 1
    else:  # it passed: e is above the next whole number below the least that passes
        assert e > least_error_buffer(spi, m, batch, items) - 1


def test_least_error_buffer_by_hand():
    assert least_error_buffer(1.0, 10, 4, 12) == 11   # max(8, 11, 1)
    assert least_error_buffer(8.0, 100, 32, 12) == 88   # max((32 + 96) / 2 = 64, 11 * 8 = 88, 8)
    assert least_error_buffer(1.0, 10, 64, 1) == 33   # max(65 / 2 = 32.5, 0, 1): 33
    assert least_error_buffer(0.25, 10, 1, 1) == 1    # max(1.25 / 2, 0, 1): 1
