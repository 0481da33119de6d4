"""The two interfaces a user implements: a :class:`Policy` that acts and a :class:`Learner` that learns.

Everything between them (environment wrappers, adders, tables, the loop, parameter sync, logging) is
rlflow's. The loop they live in, as :func:`rlflow.run` drives it::

    ts = env.reset()                                  # TimeStep, E lanes
    state = policy.initial_state(E)
    adder.add_first(ts)
    while training:
        if table.can_sample(batch_size):              # the rate limiter decides who goes next
            update = learner.step(table.sample(batch_size))
            table.update_priorities(keys, update.priorities)   # if the learner returns any
            policy.set_params(learner.get_params())   # every ``sync_period`` env steps
        else:
            actions, extras, state = policy.act(ts.observation, state)
            ts = env.step(actions)
            adder.add(actions, ts, extras)

Both are plain Python objects: numpy in for the policy, numpy or torch tensors out (rlflow copies tensors to
numpy), whatever the learner likes inside (torch, JAX, numpy).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Learner", "LearnerUpdate", "Policy", "learner_step"]


class Policy(ABC):
    """Chooses actions for a batch of ``E`` lanes (one per env of a vector env).

    Contract:

    - :meth:`act` gets the observations of every lane (the env spec's nesting, each leaf ``[E, ...]``)
      and the recurrent ``state`` it returned last time (``initial_state(E)`` at the start), and returns
      ``(actions, extras, state)``: ``actions`` matching the env's action space with a leading ``[E]``
      axis, ``extras`` matching the adder's extras spec (``None`` when it has none: e.g. log-probabilities
      and values for PPO), and the new state. Actions and extras are numpy arrays or torch tensors on any
      device (the actor detaches tensors and copies them to numpy), nested as the spaces are.
    - Recurrent state: its leaves lead with the lane axis ``[E, ...]`` (numpy arrays or torch tensors).
      rlflow's actor puts ``initial_state(E)``'s rows back on the lanes whose observation starts a new
      episode (``first``) before calling :meth:`act`, so an episode never sees the previous one's state.
    - ``evaluation=True`` asks for the policy's evaluation behaviour (greedy, or the mean action);
      evaluation steps are never stored.
    - :meth:`set_params` receives what the learner's :meth:`Learner.get_params` returned, every
      ``sync_period`` env steps (so acting may lag learning by design).
    """

    def initial_state(self, batch_size: int) -> Any:
        """The recurrent state for ``batch_size`` lanes at an episode's start (None: no state)."""
        return None

    @abstractmethod
    def act(self, observation: Any, state: Any, *, evaluation: bool = False) -> tuple[Any, Any, Any]:
        """``(actions, extras, state)`` for the observations of every lane."""

    def set_params(self, params: Any) -> None:
        """Take the learner's latest parameters (default: ignore them, e.g. when sharing the network)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a run checkpoint keeps of the policy (e.g. an exploration schedule's step, RNG states)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (default: nothing to restore)."""
        return None


@dataclass
class LearnerUpdate:
    """What one :meth:`Learner.step` returns: metrics to log and, optionally, new priorities.

    ``priorities[i]`` belongs to ``sample.keys[i]`` of the sample the step trained on; the loop passes
    them to ``Table.update_priorities`` (keys of items evicted in the meantime are skipped).
    """

    metrics: Mapping[str, float] = field(default_factory=dict)
    priorities: np.ndarray | None = None


class Learner(ABC):
    """Trains on sampled batches.

    :meth:`step` gets a :class:`~rlflow.replay.Sample` (``sample.data`` shaped by the table's items:
    a ``Transition`` for n-step transitions, ``[B, L, ...]`` sequences, episodes) and returns a
    :class:`LearnerUpdate`, or just a mapping of metrics. :meth:`get_params` is what policies receive;
    :meth:`state_dict` / :meth:`load_state_dict` are what checkpoints store.
    """

    @abstractmethod
    def step(self, sample: Any) -> LearnerUpdate | Mapping[str, float]:
        """One update on ``sample``; its metrics (floats) and optional priorities."""

    def get_params(self) -> Any:
        """The parameters policies act with (default None: nothing to send)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training (networks, optimisers, counters)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (default: nothing to restore)."""
        return None


def learner_step(learner: Learner, sample: Any) -> LearnerUpdate:
    """One ``learner.step(sample)``, its output as a LearnerUpdate with float metrics; a TypeError names the
    learner and what to return for anything else."""
    out = learner.step(sample)
    if isinstance(out, Mapping):
        out = LearnerUpdate(metrics=out)
    elif not isinstance(out, LearnerUpdate):
        raise TypeError(f"{type(learner).__name__}.step returned {type(out).__name__}: expected a "
                        "LearnerUpdate(metrics, priorities=None) or a dict of float metrics (return {} when there "
                        "are none)")
    metrics: dict[str, float] = {}
    for k, v in out.metrics.items():
        try:
            metrics[k] = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{type(learner).__name__}.step returned the metric {k!r} = {v!r}: expected a number "
                            "(e.g. loss.item())") from None
    return LearnerUpdate(metrics=metrics, priorities=out.priorities)
