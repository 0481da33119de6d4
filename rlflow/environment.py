"""The environment interface the loop drives: ``E`` lanes (env streams) stepped at once, as batched TimeSteps.

:class:`~rlflow.envs.GymEnvironment` (gymnasium envs and vector envs) and
:class:`~rlflow.envs.ParallelEnvironment` (PettingZoo parallel envs) are Environments. Any other class with
these members is one too, without inheriting from anything (a structural type): a simulator of one's own
becomes an Environment by returning :class:`~rlflow.types.TimeStep` from ``reset`` and ``step`` with the flag
table of :mod:`rlflow.types`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rlflow.specs import Spec
from rlflow.types import TimeStep

__all__ = ["Environment"]


@runtime_checkable
class Environment(Protocol):
    """What :func:`rlflow.run`, :func:`rlflow.evaluate` and :func:`rlflow.distributed.run` step.

    Contract:

    - :attr:`num_envs` lanes, each its own stream of episodes; every leaf of a TimeStep leads with ``[E]``.
    - :meth:`reset` starts an episode on every lane (``first`` True, ``last`` False, reward 0); ``seed``
      seeds the lanes (e.g. lane ``i`` with ``seed + i``), None leaves them as they are.
    - :meth:`step` takes one action per lane (``[E, ...]``, fitting :attr:`action_spec`) and returns the next
      TimeStep: the reward and flags of that action, and the observation to act on next. A lane whose
      previous TimeStep had ``last`` set and ``first`` unset ignores its action and starts its next episode.
    - :attr:`action_spec` is the spec of one lane's action; :attr:`single_action_space` is the space errors
      name (a gymnasium space, or None).

    ``isinstance(env, Environment)`` is True for an object with every member (what :func:`rlflow.run` checks).
    A run checkpoint also keeps the env's state when it has ``state_dict()`` and ``load_state_dict(state)``
    (otherwise a checkpoint ends the episodes in progress, as truncated, and restarts the envs).
    """

    @property
    def num_envs(self) -> int:
        """The number of lanes ``E``."""
        ...

    @property
    def action_spec(self) -> Spec:
        """The spec of one lane's action."""
        ...

    @property
    def single_action_space(self) -> Any:
        """One lane's action space, as error messages name it (a gymnasium space, or None)."""
        ...

    def reset(self, seed: int | None = None) -> TimeStep:
        """Start an episode on every lane."""
        ...

    def step(self, actions: Any) -> TimeStep:
        """Apply one action per lane; the outcome and the next observations."""
        ...
