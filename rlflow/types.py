"""TimeStep: what an environment wrapper hands the actor and the adder, batched over lanes.

One ``TimeStep`` describes one call of the environment for ``E`` lanes (env streams) at once. Each lane
carries the observation to act on next and the outcome of the action it took last::

    ts = env.reset(seed=0)                  # every lane: first=True
    adder.add_first(ts)
    while ...:
        actions = policy(ts.observation)    # [E, ...]
        ts = env.step(actions)              # reward, flags, and the next observation per lane
        adder.add(actions, ts)

Per lane, the flags say what happened:

====================  =====================================================================
``first``, ``last``    meaning
====================  =====================================================================
False, False           a middle step: ``reward``/``terminated``/``truncated`` belong to the action
                       just taken, ``observation`` is the next one in the same episode.
False, True            the action ended the episode (``terminated`` or ``truncated``);
                       ``final_observation`` is the episode's true final observation. The lane
                       has no observation to act on yet: the action given for it on the next
                       call is ignored and that call starts its next episode.
True, True             the action ended the episode *and* the next episode started in the same
                       call: ``final_observation`` is the end of the old episode,
                       ``observation`` the start of the new one.
True, False            a new episode starts (``env.reset``, or the reset call after a lone
                       ``last``): ``observation`` is its first observation, ``reward`` is 0
                       and both flags are False. No action belongs to this call.
====================  =====================================================================

``last == terminated | truncated`` always. A truncated episode keeps its true final observation, so
learners bootstrap from it; a terminated one has no future. A step both terminated and truncated is
terminated: the adders store it so (the block filler, the one place the rule lives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow.specs import Field, Spec

__all__ = ["ONE_LANE_NO", "ONE_LANE_YES", "TimeStep", "step_spec"]

# One lane's False and True flags, shared by the one-lane TimeSteps rlflow's env wrappers and adders make
# (so read-only): a consumer may recognise a one-lane step that neither starts nor ends an episode by
# identity, before any dtype, shape or value check.
ONE_LANE_NO = np.zeros(1, np.bool_)
"""A read-only ``[1]`` bool array ``[False]``: a flag of a one-lane TimeStep (shared, never copied)."""
ONE_LANE_YES = np.ones(1, np.bool_)
"""A read-only ``[1]`` bool array ``[True]``: a flag of a one-lane TimeStep."""
ONE_LANE_NO.flags.writeable = ONE_LANE_YES.flags.writeable = False


@dataclass(slots=True)  # slots: cheaper to make and to read, on every env step
class TimeStep:
    """One environment call for ``E`` lanes (see the module docstring for the flag table).

    Attributes:
        observation: nested arrays, each ``[E, ...]``: the observation each lane acts on next.
        reward: ``[E, ...]`` (``[E]`` for one agent): the reward of the action just taken, 0 where only
            ``first``.
        terminated: ``[E]`` bool: the action reached a terminal state.
        truncated: ``[E]`` bool: the episode was cut short (time limit); it has a future.
        first: ``[E]`` bool: ``observation`` starts an episode.
        last: ``[E]`` bool: the action just taken ended an episode.
        final_observation: like ``observation``; the lanes where ``last`` hold the episode's final
            observation. ``None`` when no lane is ``last``.
        info: the environment's info dict, as it came.
    """

    observation: Any
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    first: np.ndarray
    last: np.ndarray
    final_observation: Any = None
    info: Any = None

    @property
    def num_lanes(self) -> int:
        return int(self.first.shape[0])


def step_spec(observation: Spec, action: Spec, extras: Spec | None = None, *,
              reward: Field | None = None) -> dict[str, Spec]:
    """The columns of one stored step row.

    A row holds ``observation``, the ``action`` taken from it, the ``reward``, ``terminated`` and
    ``truncated`` received after that action, ``first`` (the row starts an episode) and ``last`` (the
    row holds an episode's final observation: its action is zero-filled and its reward 0), plus the
    user's ``extras`` (log-probs, values, RNN state, ...). ``reward`` defaults to a float32 scalar.
    """
    spec: dict[str, Spec] = {
        "observation": observation,
        "action": action,
        "reward": reward if reward is not None else Field((), np.float32),
        "terminated": Field((), np.bool_),
        "truncated": Field((), np.bool_),
        "first": Field((), np.bool_),
        "last": Field((), np.bool_),
    }
    if extras is not None:
        spec["extras"] = extras
    return spec
