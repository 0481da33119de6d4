"""An env given to the wrong wrapper, one env where a list is expected, a timestep of other lanes than the
store's: each is refused at once, with the wrapper or the setting that fixes it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from ma_envs import DyingAgents, TurnGame

from rlflow import adders, envs
from rlflow.replay import MinSize, StepStore, Table
from rlflow.specs import SpecError


@pytest.mark.parametrize(("make", "error", "match"), [
    # a turn-based env given to the parallel wrapper (it used to fail only at reset())
    (lambda: envs.ParallelEnvironment([TurnGame()]), TypeError,
     r"envs\[0\]: ParallelEnvironment expected a PettingZoo parallel env, got TurnGame \(a PettingZoo AEC "
     r"\(turn-based\) env\); use envs.AECEnvironment\(\[env, ...\]\)"),
    (lambda: envs.ParallelEnvironment([DyingAgents(), TurnGame()]), TypeError, r"envs\[1\]: .*envs.AECEnvironment"),
    (lambda: envs.AECEnvironment([DyingAgents()]), TypeError,
     r"envs\[0\]: AECEnvironment expected a PettingZoo AEC \(turn-based\) env, got DyingAgents \(a PettingZoo "
     r"parallel env\); use envs.ParallelEnvironment\(\[env, ...\]\)"),
    # one env where a list is expected
    (lambda: envs.ParallelEnvironment(DyingAgents()), TypeError,
     "envs: ParallelEnvironment expected a list of PettingZoo parallel envs, got one DyingAgents: pass \\[env\\]"),
    (lambda: envs.AECEnvironment(TurnGame()), TypeError, "got one TurnGame: pass \\[env\\]"),
    (lambda: envs.ParallelEnvironment(gym.make("CartPole-v1")), TypeError,
     "ParallelEnvironment expected a list of PettingZoo parallel envs, got one TimeLimit: pass \\[env\\]"),
    (lambda: envs.ParallelEnvironment([gym.make("CartPole-v1")]), TypeError,
     r"got TimeLimit \(a gymnasium env\); use envs.GymEnvironment\(env\)"),
    (lambda: envs.ParallelEnvironment([]), ValueError, "expected at least one PettingZoo parallel env, got none"),
    (lambda: envs.AECEnvironment([3]), TypeError, r"envs\[0\]: AECEnvironment expected .*, got int"),
    # a PettingZoo env given to the gymnasium wrapper
    (lambda: envs.GymEnvironment(DyingAgents()), TypeError,
     r"expected a gymnasium.Env or gymnasium.vector.VectorEnv, got DyingAgents; use envs.ParallelEnvironment"),
    (lambda: envs.GymEnvironment(TurnGame()), TypeError, r"got TurnGame; use envs.AECEnvironment"),
])
def test_an_env_of_another_kind_or_not_in_a_list_names_the_wrapper_to_use(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_envs_of_the_right_kind_and_functions_making_them_are_taken():
    assert envs.ParallelEnvironment([DyingAgents(), DyingAgents]).num_envs == 2
    assert envs.AECEnvironment([TurnGame(), TurnGame]).num_envs == 2


def _adder(kind, store, table):
    if kind == "nstep":
        return adders.NStepTransition(store, [table], n=2, discount=0.9)
    if kind == "sequence":
        return adders.Sequence(store, [table], length=3, period=2)
    return adders.Episode(store, [table], max_length=50)


@pytest.mark.parametrize("kind", ["nstep", "sequence", "episode"])
@pytest.mark.parametrize("call", ["add_first", "add", "stage"])
def test_a_timestep_of_other_lanes_than_the_store_speaks_of_lanes(kind, call):
    """4 env lanes and a store of 8 (and the other way round): the error names both lane counts and the fix,
    whichever call brings the timestep, and nothing is written."""
    env4, env8 = envs.make("CartPole-v1", num_envs=4, seed=0), envs.make("CartPole-v1", num_envs=8, seed=0)
    store = StepStore(env4.spec, capacity=100, lanes=8 if call == "add_first" else 4)
    adder = _adder(kind, store, Table(store, rate_limiter=MinSize(1)))
    if call == "add_first":
        ts, got, want = env4.reset(seed=0), 4, 8
        with pytest.raises(SpecError, match=f"the timestep has {got} lanes, the adder's store {want}: expected one "
                                            r"store lane per env lane \(build the store with lanes=env.num_envs\)"):
            adder.add_first(ts)
    else:
        adder.add_first(env4.reset(seed=0))
        env8.reset(seed=0)
        ts = env8.step(np.zeros(8, np.int64))
        with pytest.raises(SpecError, match="the timestep has 8 lanes, the adder's store 4: expected one store lane"):
            getattr(adder, call)(np.zeros(8, np.int64), ts)
            adder.flush()
    assert store.count.tolist() == ([0] * 8 if call == "add_first" else [1] * 4)


def test_add_first_on_named_lanes_speaks_of_the_lanes_given():
    env = envs.make("CartPole-v1", num_envs=4, seed=0)
    store = StepStore(env.spec, capacity=100, lanes=4)
    adder = _adder("nstep", store, Table(store, rate_limiter=MinSize(1)))
    with pytest.raises(SpecError, match="the timestep has 4 lanes, lanes= names 2: expected the timestep of exactly"):
        adder.add_first(env.reset(seed=0), lanes=[0, 1])
    assert store.count.tolist() == [0] * 4


def test_a_parallel_env_timestep_of_other_lanes_than_the_store_speaks_of_lanes():
    env = envs.ParallelEnvironment([DyingAgents(), DyingAgents()])
    store = StepStore(env.spec, capacity=100, lanes=3)
    adder = adders.NStepTransition(store, [Table(store, rate_limiter=MinSize(1))], n=2, discount=0.9)
    with pytest.raises(SpecError, match="the timestep has 2 lanes, the adder's store 3"):
        adder.add_first(env.reset(seed=0))
