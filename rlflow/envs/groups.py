"""Agent groups: which agents of a team share one agent axis.

Agents whose observation and action spaces are equal can be stored side by side, ``[A_g, ...]``; agents
that differ cannot without padding. :func:`make_groups` splits a team into
:class:`~rlflow.specs.AgentGroup` s:

- ``groups=None`` (the default): one group when every agent has the same spaces; otherwise, when every
  agent's name has the form ``prefix_suffix``, one group per prefix (the name up to its last ``_``:
  ``adversary_0`` and ``adversary_1`` are ``"adversary"``, as BenchMARL groups MPE's agents) if the agents
  of each prefix share their spaces; otherwise one group per distinct pair of spaces, named ``group_0``,
  ``group_1``, ... in the order their first agents appear.
- ``groups={"name": [agents...], ...}``: the user's groups; every agent in exactly one, each group's
  agents sharing their spaces.

Within a group the agents keep the team's order (``possible_agents``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlflow.specs import AgentGroup, SpecError

__all__ = ["make_groups"]


def make_groups(agents: Sequence[str], observation_space: Callable[[str], Any], action_space: Callable[[str], Any],
                groups: Mapping[str, Sequence[str]] | None = None) -> list[AgentGroup]:
    """The team ``agents`` split into groups of shared spaces.

    ``observation_space`` and ``action_space`` give an agent's spaces (a PettingZoo env's methods);
    ``groups=None`` (the default) forms the groups: one when every agent has the same spaces; otherwise,
    when every agent's name has the form ``prefix_suffix``, one per prefix (``adversary_0`` and
    ``adversary_1`` are ``"adversary"``, as BenchMARL groups MPE's agents) if the agents of each prefix share
    their spaces; otherwise one per distinct pair of spaces, named ``group_0``, ``group_1``, ... in the order
    their first agents appear. ``groups={"name": [agent, ...]}`` gives them: every agent in exactly one
    group, each group's agents sharing their spaces; anything else raises :class:`~rlflow.specs.SpecError`
    naming the agent. Within a group the agents keep the team's order."""
    agents = list(agents)
    spaces = {agent: (observation_space(agent), action_space(agent)) for agent in agents}
    if groups is not None:
        return _given(agents, spaces, groups)
    if all(spaces[agent] == spaces[agents[0]] for agent in agents):
        return [_group(_prefix(agents[0]) if len({_prefix(a) for a in agents}) == 1 else "agents", agents, agents,
                       spaces)]
    by_prefix: dict[str, list[str]] = {}
    for agent in agents:
        by_prefix.setdefault(_prefix(agent), []).append(agent)
    named = all("_" in str(agent).strip("_") for agent in agents)
    if named and all(all(spaces[a] == spaces[members[0]] for a in members) for members in by_prefix.values()):
        return [_group(name, members, agents, spaces) for name, members in by_prefix.items()]
    kinds: list[tuple[Any, list[str]]] = []
    for agent in agents:
        for kind, members in kinds:
            if spaces[agent] == kind:
                members.append(agent)
                break
        else:
            kinds.append((spaces[agent], [agent]))
    return [_group(f"group_{i}", members, agents, spaces) for i, (_, members) in enumerate(kinds)]


def _given(agents: list[str], spaces: dict[str, tuple[Any, Any]],
           groups: Mapping[str, Sequence[str]]) -> list[AgentGroup]:
    seen: dict[str, str] = {}
    for name, members in groups.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise SpecError(f"groups: expected names that are non-empty strings without '/', got {name!r}")
        if not members:
            raise SpecError(f"groups[{name!r}]: expected at least one agent, got none")
        for agent in members:
            if agent not in spaces:
                raise SpecError(f"groups[{name!r}]: agent {agent!r} is not one of possible_agents {agents}")
            if agent in seen:
                raise SpecError(f"groups: agent {agent!r} is in both {seen[agent]!r} and {name!r}; expected each "
                                "agent in one group")
            seen[agent] = name
            if spaces[agent] != spaces[members[0]]:
                raise SpecError(f"groups[{name!r}]: agent {agent!r} has the spaces {spaces[agent]}, agent "
                                f"{members[0]!r} has {spaces[members[0]]}; a group's agents share one observation "
                                "space and one action space (put them in separate groups)")
    missing = [agent for agent in agents if agent not in seen]
    if missing:
        raise SpecError(f"groups: agents {missing} are in no group; expected every agent of {agents} in one")
    return [_group(name, sorted(members, key=agents.index), agents, spaces) for name, members in groups.items()]


def _group(name: str, members: Sequence[str], agents: list[str], spaces: dict[str, tuple[Any, Any]]) -> AgentGroup:
    obs, act = spaces[members[0]]
    return AgentGroup(name, tuple(members), tuple(agents.index(a) for a in members), obs, act)


def _prefix(agent: str) -> str:
    head, sep, _ = str(agent).rpartition("_")
    return head if sep and head else str(agent)
