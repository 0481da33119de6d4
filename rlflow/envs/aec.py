"""PettingZoo AEC (turn-based) environments: one lane per (env, agent), a transition per turn.

:class:`AECEnvironment` steps ``E`` PettingZoo AEC envs. Agent ``i`` of env ``e`` is lane
``e * A + i`` (``A`` agents, ordered by ``possible_agents``) of an adder's store, and each lane is an
ordinary single-agent stream: an agent's transition runs from the observation it acted on to the
observation at its next turn, or to its final ``None`` turn when it is done, with the rewards given
to it during the other agents' turns summed onto it (PettingZoo's accumulated reward, ``env.last()``).
Termination and truncation are the agent's own. So a win decided by the other player's move still
lands on the loser's last transition, as a terminal reward::

    env = AECEnvironment([tictactoe_v3.env() for _ in range(8)], adder, seed=0)
    turn = env.reset()                       # turn.observation: the acting agent of each env, [8, ...]
    while ...:
        actions = policy(turn.observation)   # one action per env: its acting agent's
        turn = env.step(actions)             # closed transitions go to the adder as they close

The wrapper writes through an :class:`~rlflow.adders.NStepTransition` (or
:class:`~rlflow.adders.MultiAgentTransition`'s parent class): ``add_first`` on an agent's first turn,
``add_steps`` with one step when a transition closes, so n-step returns span an agent's own turns. An
agent that is done before it ever acted writes nothing; a finished game resets in place with the next
seed.

The store's spec is :attr:`AECEnvironment.spec`: one agent's observation (its ``"observation"`` part
and, for PettingZoo's ``Dict(observation, action_mask)`` spaces, an ``"action_mask"`` beside it) and
action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow import specs as _specs
from rlflow.envs.groups import make_groups
from rlflow.envs.kinds import make_envs
from rlflow.specs import AgentGroup, Field, Spec, SpecError
from rlflow.types import TimeStep, step_spec

__all__ = ["AECEnvironment", "Turn"]


@dataclass
class Turn:
    """Whose turn it is in each env.

    Attributes:
        observation: the acting agents' observations, each leaf ``[E, ...]`` (as the store's spec nests them).
        agents: ``[E]`` int64: the acting agent's index in ``possible_agents``.
        lanes: ``[E]`` int64: the acting agent's lane (``e * A + agent``; in a team of several groups, its
            lane in its group's store, ``e * A_g +`` its position in the group).
        episode_returns: ``(env, agent, return)`` of each agent whose episode ended since the last turn.
        groups: in a team of several groups, ``[E]``: the acting agent's group name; ``observation`` is then
            a dict by group name, each ``[E, ...]`` with the rows of the envs where that group acts (zeros
            elsewhere). None for a team of one group.
    """

    observation: Any
    agents: np.ndarray
    lanes: np.ndarray
    episode_returns: list[tuple[int, int, float]]
    groups: np.ndarray | None = None


class _GroupSpecs:
    """One agent group's observation and action specs, and its observations as its store nests them."""

    def __init__(self, group: AgentGroup) -> None:
        from gymnasium import spaces

        obs_space = group.observation_space
        self.masked = isinstance(obs_space, spaces.Dict) and set(obs_space.spaces) == {"observation", "action_mask"}
        if self.masked:
            self.observation_spec: Spec = {"observation": _specs.from_space(obs_space["observation"]),
                                           "action_mask": Field(obs_space["action_mask"].shape, np.bool_)}
        else:
            self.observation_spec = _specs.from_space(obs_space)
        self.group = group
        self.action_spec = _specs.from_space(group.action_space)
        self.obs_flat = _specs.flatten_spec({"observation": self.observation_spec})
        self.action_flat = _specs.flatten_spec({"action": self.action_spec})

    def batched(self, obs: Any) -> Any:
        """One agent's observation as the store nests it, with a leading axis of 1."""
        if self.masked:
            obs = {"observation": obs["observation"], "action_mask": np.asarray(obs["action_mask"]).astype(np.bool_)}
        return _specs.unflatten({"observation": self.observation_spec}, {
            name: np.asarray(v, self.obs_flat[name].dtype)[None]
            for name, v in _specs.flatten_data({"observation": self.observation_spec}, {"observation": obs}).items()
        })["observation"]

    def zeros(self) -> Any:
        """An observation of zeros with a leading axis of 1 (the rows of envs where another group acts)."""
        flat = _specs.zeros(self.obs_flat, (1,))
        return _specs.unflatten({"observation": self.observation_spec}, flat)["observation"]


class AECEnvironment:
    """``E`` PettingZoo AEC envs writing one lane per (env, agent) (see the module docstring).

    Args:
        envs: AEC envs (or functions making them) with the same ``possible_agents`` and spaces.
        adder: an ``NStepTransition`` on a store with ``E * A`` lanes and this wrapper's :attr:`spec`
            (``None``: collect nothing, e.g. for evaluation).
        seed: the first reset's seed (env ``e`` gets ``seed + e``; later games ``seed + e + E * game``).
    """

    def __init__(self, envs: Sequence[Any | Callable[[], Any]], adder: Any = None, *, seed: int | None = None,
                 groups: Mapping[str, Sequence[str]] | None = None) -> None:
        self._envs = make_envs(envs, "aec", "AECEnvironment")
        first = self._envs[0]
        agents = list(first.possible_agents)
        for i, env in enumerate(self._envs):
            if list(env.possible_agents) != agents:
                raise ValueError(f"envs[{i}]: expected possible_agents {agents}, got {list(env.possible_agents)}")
            for agent in agents:
                if (env.observation_space(agent), env.action_space(agent)) != (first.observation_space(agent),
                                                                               first.action_space(agent)):
                    raise SpecError(f"envs[{i}]: agent {agent!r} has the spaces ({env.observation_space(agent)}, "
                                    f"{env.action_space(agent)}), envs[0]'s has ({first.observation_space(agent)}, "
                                    f"{first.action_space(agent)}); expected every env built the same way")
        self.possible_agents = agents
        self.num_agents = len(agents)
        self._groups = [_GroupSpecs(g) for g in make_groups(agents, first.observation_space, first.action_space,
                                                             groups)]
        self._group_of = {agent: (k, pos) for k, g in enumerate(self._groups) for pos, agent in
                          enumerate(g.group.agents)}
        self.adders = self._check_adders(adder)
        self._seed = seed
        self._base_seed: int | None = None
        self._games = np.zeros(len(self._envs), np.int64)  # games started per env
        n = self.num_envs * self.num_agents
        self._open = np.zeros(n, np.bool_)  # the (env, agent) acted and waits for the outcome (its next turn)
        self._action: list[Any] = [None] * n  # that turn's action
        self._return = np.zeros(n, np.float64)  # the episode's rewards so far, per (env, agent)
        self._current: Turn | None = None

    def _check_adders(self, adder: Any) -> list[Any]:
        """One adder per group (None: collect nothing), each on a store of one lane per (env, group agent)."""
        if len(self._groups) > 1 and adder is not None:
            if not isinstance(adder, Mapping) or set(adder) != set(self.groups):
                got = list(adder) if isinstance(adder, Mapping) else type(adder).__name__
                raise TypeError(f"adder: this team's agents form groups {list(self.groups)} with different spaces; "
                                f"expected a dict of one adder per group (each on a store of env.group_spec(name)), "
                                f"got {got}")
            found = [adder[g.group.name] for g in self._groups]
        else:
            found = [adder] * len(self._groups)  # one group, or None for every group
        for g, a in zip(self._groups, found, strict=True):
            if a is None:
                continue
            if not (hasattr(a, "add_steps") and hasattr(a, "add_first")):
                raise TypeError(f"adder: expected an NStepTransition (it writes one agent's transition at a time with "
                                f"add_steps), got {type(a).__name__}")
            lanes = self.num_envs * len(g.group.agents)
            if a.num_lanes != lanes:
                raise ValueError(f"the adder's store has {a.num_lanes} lanes: expected one per (env, agent), "
                                 f"{self.num_envs} x {len(g.group.agents)} = {lanes}")
        return found

    # ------------------------------------------------------------------ properties
    @property
    def num_envs(self) -> int:
        return len(self._envs)

    @property
    def num_lanes(self) -> int:
        """``E * A``: one lane per (env, agent) (a team of several groups: see :meth:`group_spec`)."""
        return self.num_envs * self.num_agents

    @property
    def envs(self) -> list[Any]:
        return self._envs

    @property
    def adder(self) -> Any:
        """The adder of a team of one group; a dict by group name for a team of several."""
        return self.adders[0] if len(self.adders) == 1 else dict(zip(self.groups, self.adders, strict=True))

    @property
    def groups(self) -> dict[str, AgentGroup]:
        """The team's agent groups by name (one for a team whose agents share their spaces)."""
        return {g.group.name: g.group for g in self._groups}

    @property
    def observation_spec(self) -> Spec:
        return self._one("observation_spec").observation_spec

    @property
    def action_spec(self) -> Spec:
        return self._one("action_spec").action_spec

    @property
    def single_action_space(self) -> Any:
        return self._one("single_action_space").group.action_space

    @property
    def spec(self) -> dict[str, Spec]:
        """The columns of a step row of one agent's lane (a team of one group)."""
        return self.group_spec(self._one("spec").group.name)

    def group_spec(self, name: str) -> dict[str, Spec]:
        """The columns of a step row of group ``name``'s lanes: its store has one lane per (env, agent of the
        group), agent ``pos`` of the group in env ``e`` writing lane ``e * A_g + pos``."""
        for g in self._groups:
            if g.group.name == name:
                return step_spec(g.observation_spec, g.action_spec)
        raise KeyError(f"group {name!r}: expected one of {list(self.groups)}")

    def _one(self, what: str) -> _GroupSpecs:
        if len(self._groups) > 1:
            raise AttributeError(f"{what}: the agents of this team have different spaces (groups {list(self.groups)});"
                                 " use env.group_spec(name) and env.groups[name]")
        return self._groups[0]

    # ------------------------------------------------------------------ stepping
    def reset(self, seed: int | None = None) -> Turn:
        """Start a game in every env; the episodes in progress are abandoned (``adder.reset()``)."""
        if seed is None:
            seed, self._seed = self._seed, None
        for adder in self.adders:
            if adder is not None:
                adder.reset()  # abandon every lane's episode, also those of agents still to act
        self._open[:] = False
        self._return[:] = 0.0
        ended: list[tuple[int, int, float]] = []
        for e, env in enumerate(self._envs):
            env.reset(seed=None if seed is None else seed + e)
        self._base_seed = seed
        self._games[:] = 1
        self._current = self._turn([self._advance(e, ended) for e in range(self.num_envs)], ended)
        return self._current

    def step(self, actions: Any) -> Turn:
        """Each env's acting agent takes its action: ``actions[e]``, or for a team of several groups
        ``actions[group][e]`` of the acting agent's group (``turn.groups[e]``); returns the next turn."""
        if self._current is None:
            raise RuntimeError("step() before reset(): expected a call to reset() first")
        per_group = self._check_actions(actions, self._current)
        ended: list[tuple[int, int, float]] = []
        agents = []
        a = self.num_agents
        for e, env in enumerate(self._envs):
            i = int(self._current.agents[e])
            arr = per_group[self._group_of[self.possible_agents[i]][0]][e]
            action = arr.item() if arr.ndim == 0 else arr
            self._action[e * a + i] = np.array(arr, copy=True)  # written at the agent's next turn
            self._open[e * a + i] = True
            env.step(action)
            agents.append(self._advance(e, ended))
        self._current = self._turn(agents, ended)
        return self._current

    def _check_actions(self, actions: Any, turn: Turn) -> list[np.ndarray]:
        """Each group's actions as an array ``[E, ...]``, those of the envs where it acts checked against its
        action space."""
        grouped = len(self._groups) > 1
        if grouped and (not isinstance(actions, Mapping) or set(actions) != set(self.groups)):
            got = sorted(actions) if isinstance(actions, Mapping) else type(actions).__name__
            raise SpecError(f"actions: this team's agents form groups {list(self.groups)}; expected a dict of "
                            f"[E, ...] actions per group, got {got}")
        acting_group = np.array([self._group_of[self.possible_agents[int(i)]][0] for i in turn.agents])
        out = []
        for k, g in enumerate(self._groups):
            arr = np.asarray(actions[g.group.name] if grouped else actions)
            where = f"actions[{g.group.name!r}]" if grouped else "actions"
            if arr.shape[:1] != (self.num_envs,):
                raise SpecError(f"{where}: expected one action per env, a leading axis of {self.num_envs}, got shape "
                                f"{arr.shape}")
            acting = np.flatnonzero(acting_group == k)
            try:
                _specs.validate(g.action_flat, {"action": arr[acting]}, (len(acting),))
            except SpecError as exc:
                raise SpecError(f"{where} do not fit the action space {g.group.action_space}: {exc}") from None
            out.append(arr)
        return out

    def _advance(self, e: int, ended: list[tuple[int, int, float]]) -> int:
        """Run env ``e`` to the next agent that must choose an action, closing the transitions of the
        agents met on the way (and their final ``None`` turns); restart a finished game."""
        env = self._envs[e]
        a = self.num_agents
        while True:
            if not env.agents:
                game = int(self._games[e])
                self._games[e] += 1
                seed = None if self._base_seed is None else self._base_seed + e + self.num_envs * game
                env.reset(seed=seed)
            agent = env.agent_selection
            i = self.possible_agents.index(agent)
            k, pos = self._group_of[agent]
            g, adder = self._groups[k], self.adders[k]
            slot, lane = e * a + i, e * len(g.group.agents) + pos  # this (env, agent); its lane in its group's store
            obs, reward, terminated, truncated, _ = env.last()
            done = bool(terminated) or bool(truncated)
            if self._open[slot]:
                self._return[slot] += float(reward)
                if adder is not None:
                    adder.add_steps(lane, self._action[slot][None], np.array([reward], np.float32),
                                    g.batched(obs), terminated=bool(terminated),
                                    truncated=bool(truncated) and not terminated)
                self._open[slot] = False
                if done:
                    ended.append((e, i, float(self._return[slot])))
                    self._return[slot] = 0.0
            elif not done and adder is not None:  # the agent's first turn of this game
                first = g.batched(obs)
                adder.add_first(TimeStep(first, np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool),
                                         np.ones(1, bool), np.zeros(1, bool)), lanes=[lane])
            if done:
                env.step(None)
                continue
            return i

    def _turn(self, agents: list[int], ended: list[tuple[int, int, float]]) -> Turn:
        idx = np.array(agents, np.int64)
        where = [self._group_of[self.possible_agents[i]] for i in agents]
        lanes = np.array([e * len(self._groups[k].group.agents) + pos for e, (k, pos) in enumerate(where)], np.int64)
        obs = [self._groups[k].batched(env.observe(env.agent_selection))
               for env, (k, _) in zip(self._envs, where, strict=True)]
        if len(self._groups) == 1:
            return Turn(_stack(obs), idx, lanes, ended)
        stacked = {}
        for k, g in enumerate(self._groups):  # a group's rows: the envs where one of its agents acts, zeros elsewhere
            stacked[g.group.name] = _stack([o if where[e][0] == k else g.zeros() for e, o in enumerate(obs)])
        return Turn(stacked, idx, lanes, ended, np.array([self._groups[k].group.name for k, _ in where]))

    def close(self) -> None:
        for env in self._envs:
            env.close()


def _stack(rows: list[Any]) -> Any:
    if isinstance(rows[0], dict):
        return {k: _stack([r[k] for r in rows]) for k in rows[0]}
    if isinstance(rows[0], tuple):
        return tuple(_stack([r[i] for r in rows]) for i in range(len(rows[0])))
    return np.concatenate(rows)
