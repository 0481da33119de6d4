"""Multi-agent n-step transitions: one item per joint step, sampled ``[B, A, ...]`` with each agent's own end.

The rows are those of :class:`rlflow.envs.ParallelEnvironment` (one lane per env, an agent axis on
every per-agent column, per-agent ``active``/``terminated``/``truncated`` in the observation). The
items are the joint n-step windows of :class:`~rlflow.adders.NStepTransition` (one per joint action,
each episode's rows stored once); what differs is how a sample is shaped. For the joint step at row
``t`` with window ``t .. t + k`` and agent ``a``:

- ``j_a`` is the first ``j`` in ``1 .. k`` whose row carries agent ``a``'s ``terminated`` or ``truncated``
  flag (its own end), else ``k``;
- ``reward[:, a] = r_t + g r_{t+1} + ... + g^(j_a - 1) r_{t+j_a-1}`` (an ended agent's later rewards are
  zero, so this is the joint return over the window);
- ``discount[:, a] = 0`` if the agent terminated at ``j_a`` or was not active at ``t``, else ``g^j_a``;
- ``next_observation`` holds, per agent, row ``t + j_a``'s per-agent columns (the agent's true final
  observation when it ended inside the window), and row ``t + k``'s ``state``.

So every agent's target ``reward + discount * Q(next_observation)`` is its own n-step target, stopping
at its own end, while the batch stays synchronised (the same joint step for every agent), which is what
QMIX, VDN and MAPPO-style learners need. :func:`flatten_agents` turns such a batch into independent
per-agent transitions, leaving inactive agents out.

Worked example (``n = 3``, ``g = 0.5``): two agents from row ``t``, rewards ``(1, 10), (2, 20), (4, 0)``,
agent 1 terminating on the second step (its reward on the third is zero), nothing else ending::

    agent  j_a  reward                     discount   next observation row
    0      3    1 + .5*2 + .25*4 = 3       .125       t + 3
    1      2    10 + .5*20       = 20      0          t + 2 (its final observation)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow.adders.base import PriorityFn
from rlflow.adders.transition import NStepTransition
from rlflow.kernels.items import LANE, LENGTH, START
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase
from rlflow.replay.views import ItemView, Transition, nest_part, under
from rlflow.specs import SpecError

__all__ = ["MultiAgentTransition", "MultiAgentTransitionView", "flatten_agents", "squeeze_agents"]

_AGENT_FLAGS = ("observation/active", "observation/terminated", "observation/truncated")
TEAM_KEYS = ("state",)


@dataclass(frozen=True)
class MultiAgentTransitionView(ItemView):
    """Joint n-step windows as per-agent transitions ``[B, A, ...]`` (see :mod:`rlflow.adders.multiagent`)."""

    n: int
    discount: float
    kind = "multiagent_transition"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "n": self.n, "discount": self.discount}

    def gather(self, store: Any, meta: np.ndarray, fields: dict[str, np.ndarray]) -> tuple[Transition, None]:
        cap = store.capacity
        base = meta[:, LANE] * cap
        start = meta[:, START]
        k = meta[:, LENGTH] - 1  # rewards in each window
        first = base + start % cap
        team_row = base + (start + k) % cap
        flat = store.flat_columns()
        active = np.take(flat["observation/active"], first, axis=0)  # [B, A]
        if self.n == 1:  # every window is one step: the agents' flags are those of the next row
            died = np.take(flat["observation/terminated"], team_row, axis=0)
            offset = None
            powers = np.float32(self.discount)
        else:
            # Each agent's own end inside the window: the first row j in 1..k carrying its terminated/truncated flag.
            j = np.arange(1, self.n + 1)
            rows = base[:, None] + (start[:, None] + j) % cap  # [B, n]
            inside = (j[None, :] <= k[:, None])[:, :, None]
            term = np.take(flat["observation/terminated"], rows, axis=0) & inside  # [B, n, A]
            ended = term | (np.take(flat["observation/truncated"], rows, axis=0) & inside)
            any_end = ended.any(axis=1)
            at = ended.argmax(axis=1)  # the first end's position (0 where none)
            offset = np.where(any_end, at + 1, k[:, None])  # j_a, [B, A]
            died = any_end & np.take_along_axis(term, at[:, None, :], axis=1)[:, 0]
            powers = (self.discount ** offset).astype(np.float32)
            if (offset == k[:, None]).all():
                offset = None  # no agent ended early: every agent's next observation is the window's last row
        discount = np.where(died | ~active, np.float32(0.0), powers).astype(np.float32)
        if offset is not None:
            agent_rows = base[:, None] + (start[:, None] + offset) % cap  # [B, A]
            agents = np.arange(active.shape[1])[None, :]
        obs: dict[str, np.ndarray] = {}
        nxt: dict[str, np.ndarray] = {}
        cur: dict[str, np.ndarray] = {}
        for name, col in flat.items():
            if under(name, "observation"):
                obs[name] = np.take(col, first, axis=0)
                if offset is None or any(under(name, f"observation/{key}") for key in TEAM_KEYS):
                    nxt[name] = np.take(col, team_row, axis=0)
                else:
                    nxt[name] = col[agent_rows, agents]
            elif under(name, "action") or under(name, "extras"):
                cur[name] = np.take(col, first, axis=0)
        batch = Transition(observation=nest_part(store, obs, "observation"), action=nest_part(store, cur, "action"),
                           reward=fields["return"], discount=discount,
                           next_observation=nest_part(store, nxt, "observation"),
                           extras=nest_part(store, cur, "extras"))
        return batch, None


class MultiAgentTransition(NStepTransition):
    """N-step transitions of a multi-agent store, sampled per agent (see :mod:`rlflow.adders.multiagent`).

    Args:
        store: rows of a :class:`rlflow.envs.ParallelEnvironment` (``StepStore(env.spec, ...)``, or
            ``env.step_spec(extras)``), one lane per env.
        tables: tables receiving every joint step.
        n: rewards summed per transition (``n >= 1``), stopping early at each agent's own end.
        discount: the per-step discount ``g``.
        priority_fns: per table name, ``fn(transitions) -> priorities`` of the new items (default 1).
    """

    def __init__(self, store: StepStore, tables: Sequence[TableBase], *, n: int = 1, discount: float = 0.99,
                 priority_fns: Mapping[str, PriorityFn] | None = None) -> None:
        missing = [name for name in (*_AGENT_FLAGS, "observation/obs") if not any(
            under(f, name) for f in store.fields)]
        if missing:
            raise SpecError(f"a multi-agent adder needs the observation keys of rlflow.envs.ParallelEnvironment "
                            f"(obs, active, terminated, truncated); the store lacks {missing}")
        num_agents = store.fields["observation/active"].shape
        if store.fields["reward"].shape != num_agents:
            raise SpecError(f"a multi-agent store's reward: expected one per agent, shape {num_agents}, got "
                            f"{store.fields['reward'].shape}")
        super().__init__(store, tables, n=n, discount=discount, priority_fns=priority_fns)

    def _item_view(self) -> MultiAgentTransitionView:
        return MultiAgentTransitionView(self.n, self.discount)


def flatten_agents(batch: Transition, *, team_keys: Sequence[str] = TEAM_KEYS) -> tuple[Transition, np.ndarray]:
    """Independent per-agent transitions from a synchronised batch, leaving out agents not active at ``t``.

    Returns the transitions (each leaf ``[N, ...]``, ``N`` = active (item, agent) pairs, in item-major
    order) and their ``[N, 2]`` (item, agent) indices. Observation keys in ``team_keys`` (the global
    state) are repeated for each agent of their item; extras leaves whose second axis has the agents'
    size are taken per agent, others repeated.
    """
    active = np.asarray(batch.observation["active"])
    a = active.shape[1]
    idx = np.argwhere(active)  # row-major: item-major order
    items, agents = idx[:, 0], idx[:, 1]

    def per_agent(x: Any) -> Any:
        return np.asarray(x)[items, agents]

    def repeated(x: Any) -> Any:
        return np.asarray(x)[items]

    def obs_part(o: Mapping[str, Any]) -> dict[str, Any]:
        return {key: _map(repeated if key in team_keys else per_agent, value) for key, value in o.items()}

    def extra(x: Any) -> Any:
        arr = np.asarray(x)
        return per_agent(arr) if arr.ndim >= 2 and arr.shape[1] == a else repeated(arr)

    out = Transition(observation=obs_part(batch.observation), action=_map(per_agent, batch.action),
                     reward=per_agent(batch.reward), discount=per_agent(batch.discount),
                     next_observation=obs_part(batch.next_observation),
                     extras=None if batch.extras is None else _map(extra, batch.extras))
    return out, idx


def squeeze_agents(batch: Transition, *, team_keys: Sequence[str] = TEAM_KEYS) -> Transition:
    """A one-agent batch without its agent axis: ``[B, 1, ...]`` leaves become ``[B, ...]`` (the ``state``
    and extras without an agent axis stay as they are), for single-agent code on a multi-agent store."""
    a = np.asarray(batch.observation["active"]).shape[1]
    if a != 1:
        raise ValueError(f"squeeze_agents: expected a batch of one agent, got {a} agents (use flatten_agents)")

    def first(x: Any) -> Any:
        return np.asarray(x)[:, 0]

    def obs_part(o: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value if key in team_keys else _map(first, value) for key, value in o.items()}

    def extra(x: Any) -> Any:
        arr = np.asarray(x)
        return arr[:, 0] if arr.ndim >= 2 and arr.shape[1] == 1 else arr

    return Transition(observation=obs_part(batch.observation), action=_map(first, batch.action),
                      reward=first(batch.reward), discount=first(batch.discount),
                      next_observation=obs_part(batch.next_observation),
                      extras=None if batch.extras is None else _map(extra, batch.extras))


def _map(fn: Any, tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_map(fn, v) for v in tree)
    return fn(tree)
