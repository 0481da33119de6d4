"""rlflow's public API as a type checker (and so a user's IDE) reads it: a program written against it checks
clean with mypy, and the usual wrong calls are reported at the line that makes them.

Each program is checked with the project's mypy settings (``[tool.mypy]`` in pyproject.toml), which CI also
runs on ``rlflow/`` itself.
"""

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[1]

USER_PROGRAM = '''
from typing import Any

import numpy as np

import rlflow
from rlflow import adders, envs, specs
from rlflow.distributed import Layout
from rlflow.replay import Fifo, RowTable, SampleToInsertRatio, StepStore, Table, Uniform
from rlflow.types import TimeStep


class Greedy(rlflow.Policy):
    def act(self, observation: Any, state: Any, *, evaluation: bool = False) -> tuple[Any, Any, Any]:
        return np.zeros(len(observation), np.int64), None, state


class Counter(rlflow.Learner):
    def step(self, sample: Any) -> dict[str, float]:
        return {"n": float(len(sample.keys))}


class Coin:
    """A simulator of one's own: an Environment by its members alone."""

    num_envs = 2
    action_spec = specs.Field((), np.int64, low=0, high=1)
    single_action_space = None

    def _timestep(self, first: bool) -> TimeStep:
        flags = np.zeros(2, bool)
        return TimeStep(np.zeros((2, 3), np.float32), np.zeros(2, np.float32), flags, flags,
                        np.full(2, first), flags)

    def reset(self, seed: int | None = None) -> TimeStep:
        return self._timestep(True)

    def step(self, actions: Any) -> TimeStep:
        return self._timestep(False)


env = envs.make("CartPole-v1", num_envs=2)
store = StepStore(env.step_spec(), capacity=100, lanes=env.num_envs)
table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=SampleToInsertRatio(1.0, 8, 64))
adder = adders.NStepTransition(store, [table], n=3, discount=0.99)
result: rlflow.RunResult = rlflow.run(env, Greedy(), Counter(), adder, table, steps=100, batch_size=4)
returns: list[float] = rlflow.evaluate(Coin(), Greedy(), episodes=1, seed=0)
rows = RowTable(store, seed=0)
config = rlflow.RunConfig(eval_env=Coin(), eval_every=50)
own: rlflow.Environment = Coin()
layout = Layout(num_actors=2)
fn = rlflow.distributed.run  # (make_env, make_policy, learner, adder, table, ...)
'''

MISTAKES = {
    "a gymnasium env where an rlflow env goes": (
        'rlflow.run(gymnasium.make("CartPole-v1"), Greedy(), None, adder, table, steps=10)',
        'Argument 1 to "run" has incompatible type'),
    "the table where the adder goes": (
        "rlflow.run(env, Greedy(), None, table, adder, steps=10)",
        'Argument 4 to "run" has incompatible type'),
    "a policy class, not an instance": (
        "rlflow.run(env, Greedy, None, adder, table, steps=10)",
        'Argument 2 to "run" has incompatible type'),
    "steps given positionally": (
        "rlflow.run(env, Greedy(), None, adder, table, 10)",
        'Too many positional arguments for "run"'),
    "a Field with a shape that is not a sequence of ints": (
        "specs.Field(3.5, np.float32)",
        'Argument 1 to "Field" has incompatible type "float"'),
}


def _mypy(tmp_path: Path, source: str) -> tuple[str, int]:
    program = tmp_path / "program.py"
    program.write_text(source)
    out, err, code = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary",
                                   "--cache-dir", str(ROOT / ".mypy_cache"), str(program)])
    return out + err, code


def test_a_user_program_checks_clean(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out, code = _mypy(tmp_path, USER_PROGRAM)
    assert (code, out) == (0, "")


def test_wrong_calls_are_reported_where_they_are_made(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    lines = [line for line, _ in MISTAKES.values()]
    first = USER_PROGRAM.count("\n") + 2  # the line of the first mistake (after "import gymnasium")
    out, code = _mypy(tmp_path, USER_PROGRAM + "import gymnasium\n" + "\n".join(lines) + "\n")
    assert code == 1
    for i, (what, (_, message)) in enumerate(MISTAKES.items()):
        at = f"program.py:{first + i}: error: "
        assert any(at in line and message in line for line in out.splitlines()), (what, at, out)
