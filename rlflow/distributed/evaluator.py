"""The evaluator: evaluation episodes in a process of their own, with the learner's latest parameters.

:func:`rlflow.distributed.run` starts one (a Ray actor reserving no CPU) when it is given an ``eval_env``:
the env is pickled into it and the policy built there with ``make_policy(0)``. Each
:meth:`Evaluator.evaluate` call takes the latest parameters from the variable source and runs
``episodes`` episodes with ``evaluation=True`` (seeded with ``seed``, as ``rlflow.evaluate`` seeds them);
the learner goes on meanwhile.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from rlflow.core import Policy
from rlflow.environment import Environment
from rlflow.loop.actors import evaluate

__all__ = ["Evaluation", "Evaluator"]


class Evaluation(NamedTuple):
    """One evaluation: the env step it was asked at, its episodes' mean return and standard deviation, and
    the wall-clock seconds it took."""

    env_steps: int
    mean: float
    std: float
    seconds: float


class Evaluator:
    """Evaluation episodes of ``make_policy(0)`` on ``env`` (or its pickle: unpickled here, its arrays are this
    process's own and writable) with the parameters ``source`` holds."""

    def __init__(self, env: Environment, make_policy: Callable[[int], Policy], source: Any, episodes: int,
                 seed: int | None) -> None:
        self.env = pickle.loads(env) if isinstance(env, bytes) else env
        self.policy, self.source = make_policy(0), source
        self.episodes, self.seed = int(episodes), seed

    def evaluate(self, env_steps: int) -> Evaluation:
        """``episodes`` episodes with the latest parameters."""
        import ray

        answer = ray.get(self.source.newer.remote(-1))
        if answer is not None:
            self.policy.set_params(ray.get(answer[1][0]))
        began = time.monotonic()
        returns = evaluate(self.env, self.policy, self.episodes, seed=self.seed)
        return Evaluation(env_steps, float(np.mean(returns)), float(np.std(returns)), time.monotonic() - began)
