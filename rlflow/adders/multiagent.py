"""Multi-agent n-step transitions: one item per joint step, sampled ``[B, A, ...]`` with each agent's own end.

The rows are those of :class:`rlflow.envs.ParallelEnvironment` (one lane per env, an agent axis on
every per-agent column, per-agent ``active``/``terminated``/``truncated`` in the observation). The
items are the joint n-step windows of :class:`~rlflow.adders.NStepTransition` (one per joint action,
each episode's rows stored once); what differs is how a sample is shaped. For the joint step at row
``t`` with window ``t .. t + k`` and agent ``a``:

- ``j_a`` is the first ``j`` in ``1 .. k`` whose row carries agent ``a``'s ``terminated`` or ``truncated``
  flag (its own end), else ``k``;
- ``reward[:, a] = r_t + g r_{t+1} + ... + g^(j_a - 1) r_{t+j_a-1}`` (rewards after the agent's own end
  do not count; in an env's rows an ended agent's later rewards are zero anyway);
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
from rlflow.replay.items import LANE, LENGTH, START
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase
from rlflow.replay.views import ItemView, Transition, nest_part, under
from rlflow.specs import AgentGroup, SpecError

__all__ = ["MultiAgentTransition", "MultiAgentTransitionView", "flatten_agents", "split_agents", "split_groups",
           "squeeze_agents"]

_AGENT_FLAGS = ("observation/active", "observation/terminated", "observation/truncated")
TEAM_KEYS = ("state",)
GROUPED_KEYS = ("obs", "action_mask")  # observation keys holding one entry per group in a grouped team


@dataclass(frozen=True)
class MultiAgentTransitionView(ItemView):
    """Joint n-step windows as per-agent transitions ``[B, A, ...]`` (see :mod:`rlflow.adders.multiagent`)."""

    n: int
    discount: float
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a grouped team's groups: (name, agent indices)
    kind = "multiagent_transition"

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"kind": self.kind, "n": self.n, "discount": self.discount}
        if self.groups:
            config["groups"] = {name: list(indices) for name, indices in self.groups}
        return config

    def _agents_of(self, name: str) -> np.ndarray | None:
        """The team indices of the agents on column ``name``'s agent axis (None: every agent's)."""
        for group, indices in self.groups:
            if any(under(name, f"observation/{key}/{group}") for key in GROUPED_KEYS):
                return np.asarray(indices)
        return None

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
        reward = fields["return"]  # each agent's rewards over the whole window
        if offset is not None:
            agent_rows = base[:, None] + (start[:, None] + offset) % cap  # [B, A]
            # Rewards after an agent's own end do not count: take them off (zero where the ended agent is
            # inactive, as in rlflow.envs.ParallelEnvironment's rows; not in general, e.g. HARL's FP data).
            m = np.arange(self.n)  # the window's steps t + m
            after = (m[None, :, None] >= offset[:, None, :]) & (m[None, :, None] < k[:, None, None])  # [B, n, A]
            steps = np.take(flat["reward"], base[:, None] + (start[:, None] + m) % cap, axis=0)  # [B, n, A]
            tail = (np.where(after, steps, 0) * (self.discount ** m)[None, :, None]).sum(axis=1)
            reward = (reward - tail).astype(np.float32)
        obs: dict[str, np.ndarray] = {}
        nxt: dict[str, np.ndarray] = {}
        cur: dict[str, np.ndarray] = {}
        for name, col in flat.items():
            if under(name, "observation"):
                obs[name] = np.take(col, first, axis=0)
                if offset is None or any(under(name, f"observation/{key}") for key in TEAM_KEYS):
                    nxt[name] = np.take(col, team_row, axis=0)
                else:
                    indices = self._agents_of(name)
                    rows = agent_rows if indices is None else agent_rows[:, indices]  # [B, agents on this column]
                    nxt[name] = col[rows, np.arange(rows.shape[1])[None, :]]
            elif under(name, "action") or under(name, "extras"):
                cur[name] = np.take(col, first, axis=0)
        batch = Transition(observation=nest_part(store, obs, "observation"), action=nest_part(store, cur, "action"),
                           reward=reward, discount=discount,
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
        groups: the env's agent groups (``env.groups``); needed when they are several (agents with
            different spaces), optional otherwise.
        stage_steps: as :class:`~rlflow.adders.NStepTransition`'s.
    """

    def __init__(self, store: StepStore, tables: Sequence[TableBase], *, n: int = 1, discount: float = 0.99,
                 priority_fns: Mapping[str, PriorityFn] | None = None,
                 groups: Mapping[str, AgentGroup] | None = None, stage_steps: int = 64) -> None:
        missing = [name for name in (*_AGENT_FLAGS, "observation/obs") if not any(
            under(f, name) for f in store.fields)]
        if missing:
            raise SpecError(f"a multi-agent adder needs the observation keys of rlflow.envs.ParallelEnvironment "
                            f"(obs, active, terminated, truncated); the store lacks {missing}")
        num_agents = store.fields["observation/active"].shape
        if store.fields["reward"].shape != num_agents:
            raise SpecError(f"a multi-agent store's reward: expected one per agent, shape {num_agents}, got "
                            f"{store.fields['reward'].shape}")
        self._groups = _check_groups(store, groups)
        super().__init__(store, tables, n=n, discount=discount, priority_fns=priority_fns, stage_steps=stage_steps)

    def _item_view(self) -> MultiAgentTransitionView:
        return MultiAgentTransitionView(self.n, self.discount, self._groups)


def _check_groups(store: StepStore, groups: Mapping[str, AgentGroup] | None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A grouped store's groups as (name, indices), checked against its columns; () for a one-group team."""
    num_agents = store.fields["observation/active"].shape[0]
    obs = {name: f for name, f in store.fields.items() if under(name, "observation/obs")}
    if groups is None or len(groups) <= 1:
        grouped = sorted(name for name, f in obs.items() if not f.shape or f.shape[0] != num_agents)
        if grouped:
            raise SpecError(f"the store's observation columns {grouped} have no axis of the team's {num_agents} "
                            "agents: its agents form several groups; pass groups=env.groups")
        return ()
    out = []
    for name, group in groups.items():
        columns = [f for col, f in obs.items() if under(col, f"observation/obs/{name}")]
        if not columns or any(not f.shape or f.shape[0] != len(group.indices) for f in columns):
            raise SpecError(f"groups[{name!r}]: expected the store's observation/obs/{name} columns with an axis of "
                            f"its {len(group.indices)} agents, got {[(c, f.shape) for c, f in obs.items()]}; pass "
                            "the groups of the env that built the store's spec")
        out.append((name, tuple(int(i) for i in group.indices)))
    every = sorted(i for _, indices in out for i in indices)
    if every != list(range(num_agents)):
        raise SpecError(f"groups: expected the agent indices 0..{num_agents - 1} once each, got {every}")
    return tuple(out)


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


def split_groups(batch: Transition, groups: Mapping[str, AgentGroup], *,
                 team_keys: Sequence[str] = TEAM_KEYS) -> dict[str, Transition]:
    """Each group's part of a synchronised batch, by group name, in the one-group layout: ``obs``,
    ``action_mask``, ``action``, ``reward``, ``discount``, ``active``, ``terminated`` and ``truncated`` of its
    agents ``[B, A_g, ...]``; the ``state`` (``team_keys``) as it is; extras keyed by group name take that
    group's entry, extras leaves whose second axis has the team's size take its agents, others stay whole.
    A team of one group gives the batch itself. :func:`flatten_agents` takes each part further."""
    if len(groups) <= 1:
        return {name: batch for name in groups}
    num_agents = np.asarray(batch.observation["active"]).shape[1]
    out = {}
    for name, group in groups.items():
        idx = np.asarray(group.indices)

        def obs_part(o: Mapping[str, Any], name: str = name, idx: np.ndarray = idx) -> dict[str, Any]:
            part: dict[str, Any] = {}
            for key, value in o.items():
                if key in GROUPED_KEYS:
                    if name in value:
                        part[key] = value[name]
                elif key in team_keys:
                    part[key] = value
                else:
                    part[key] = _map(lambda x, idx=idx: np.asarray(x)[:, idx], value)
            return part

        def extra(x: Any, idx: np.ndarray = idx) -> Any:
            arr = np.asarray(x)
            return arr[:, idx] if arr.ndim >= 2 and arr.shape[1] == num_agents else arr

        extras = batch.extras
        if isinstance(extras, Mapping) and set(extras) == set(groups):
            extras = extras[name]
        elif extras is not None:
            extras = _map(extra, extras)
        out[name] = Transition(observation=obs_part(batch.observation), action=batch.action[name],
                               reward=np.asarray(batch.reward)[:, idx], discount=np.asarray(batch.discount)[:, idx],
                               next_observation=obs_part(batch.next_observation), extras=extras)
    return out


def split_agents(batch: Transition, groups: Mapping[str, AgentGroup], *,
                 team_keys: Sequence[str] = TEAM_KEYS) -> list[Transition]:
    """One transition batch per agent, in the team's order (``possible_agents``), each leaf ``[B, ...]``:
    HARL's per-agent layout, synchronised (item ``b`` is the same joint step for every agent). Each
    agent's ``observation["active"]`` says whether it acted at ``t`` (HARL's ``valid_transitions``); its
    ``discount`` is ``g^j`` to its own next observation, 0 after its termination or when it did not act."""
    num_agents = sum(len(group.indices) for group in groups.values())
    out: list[Transition | None] = [None] * num_agents
    for name, part in split_groups(batch, groups, team_keys=team_keys).items():
        for pos, index in enumerate(groups[name].indices):
            def take(x: Any, pos: int = pos) -> Any:
                return np.asarray(x)[:, pos]

            def obs_part(o: Mapping[str, Any], take: Any = take) -> dict[str, Any]:
                return {key: value if key in team_keys else _map(take, value) for key, value in o.items()}

            def extra(x: Any, take: Any = take, size: int = len(groups[name].indices)) -> Any:
                arr = np.asarray(x)
                return take(arr) if arr.ndim >= 2 and arr.shape[1] == size else arr

            out[index] = Transition(observation=obs_part(part.observation), action=_map(take, part.action),
                                    reward=take(part.reward), discount=take(part.discount),
                                    next_observation=obs_part(part.next_observation),
                                    extras=None if part.extras is None else _map(extra, part.extras))
    return [t for t in out if t is not None]


def _map(fn: Any, tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_map(fn, v) for v in tree)
    return fn(tree)
