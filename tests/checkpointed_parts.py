"""A policy and a learner whose whole state a run checkpoint keeps, for the resume and run-checkpoint tests
(a resumed run equals the uninterrupted one only if both come back exactly), and a check that two saved
states are equal."""

from __future__ import annotations

from typing import Any

import numpy as np

import rlflow


class SeededPolicy(rlflow.Policy):
    """Seeded uniform actions for Discrete(2); its state is its RNG's."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 2, len(observation)), None, state

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state) -> None:
        self.rng.bit_generator.state = state["rng"]


class KeyLearner(rlflow.Learner):
    """Its state follows every sample it sees (keys, returns); sets priorities from them."""

    def __init__(self) -> None:
        self.steps, self.total = 0, 0.0

    def step(self, sample):
        self.steps += 1
        self.total += float(np.sum(sample.keys % 997)) + float(np.sum(sample.data.reward))
        return rlflow.LearnerUpdate({"total": self.total}, priorities=(sample.keys % 7 + 1).astype(np.float64))

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "total": self.total}

    def load_state_dict(self, state) -> None:
        self.steps, self.total = state["steps"], state["total"]


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Nested dicts, lists and tuples of arrays, tensors and values are equal, item for item, of the same
    types (arrays and tensors: of the same dtypes and shapes); ``where`` prefixes the path in a failure."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k, v in want.items():
            assert_same(got[k], v, f"{where}{k}/")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}{i}/")
    else:
        np.testing.assert_array_equal(got, want, err_msg=where, strict=True)
