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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow import specs as _specs
from rlflow.envs.kinds import make_envs
from rlflow.specs import Field, Spec, SpecError
from rlflow.types import TimeStep, step_spec

__all__ = ["AECEnvironment", "Turn"]


@dataclass
class Turn:
    """Whose turn it is in each env.

    Attributes:
        observation: the acting agents' observations, each leaf ``[E, ...]`` (as the store's spec nests them).
        agents: ``[E]`` int64: the acting agent's index in ``possible_agents``.
        lanes: ``[E]`` int64: the acting agent's lane (``e * A + agent``).
        episode_returns: ``(env, agent, return)`` of each agent whose episode ended since the last turn.
    """

    observation: Any
    agents: np.ndarray
    lanes: np.ndarray
    episode_returns: list[tuple[int, int, float]]


class AECEnvironment:
    """``E`` PettingZoo AEC envs writing one lane per (env, agent) (see the module docstring).

    Args:
        envs: AEC envs (or functions making them) with the same ``possible_agents`` and spaces.
        adder: an ``NStepTransition`` on a store with ``E * A`` lanes and this wrapper's :attr:`spec`
            (``None``: collect nothing, e.g. for evaluation).
        seed: the first reset's seed (env ``e`` gets ``seed + e``; later games ``seed + e + E * game``).
    """

    def __init__(self, envs: Sequence[Any | Callable[[], Any]], adder: Any = None, *, seed: int | None = None) -> None:
        self._envs = make_envs(envs, "aec", "AECEnvironment")
        agents = list(self._envs[0].possible_agents)
        for i, env in enumerate(self._envs):
            if list(env.possible_agents) != agents:
                raise ValueError(f"envs[{i}]: expected possible_agents {agents}, got {list(env.possible_agents)}")
        self.possible_agents = agents
        self.num_agents = len(agents)
        obs_space = self._envs[0].observation_space(agents[0])
        act_space = self._envs[0].action_space(agents[0])
        for env in self._envs:
            for agent in agents:
                if env.observation_space(agent) != obs_space or env.action_space(agent) != act_space:
                    raise SpecError(f"agent {agent!r}: expected the spaces of {agents[0]!r} ({obs_space}, "
                                    f"{act_space}), got ({env.observation_space(agent)}, {env.action_space(agent)})")
        from gymnasium import spaces

        self._masked = isinstance(obs_space, spaces.Dict) and set(obs_space.spaces) == {"observation", "action_mask"}
        if self._masked:
            self._observation_spec: Spec = {"observation": _specs.from_space(obs_space["observation"]),
                                            "action_mask": Field(obs_space["action_mask"].shape, np.bool_)}
        else:
            self._observation_spec = _specs.from_space(obs_space)
        self._action_spec = _specs.from_space(act_space)
        self.single_action_space = act_space
        self._obs_flat = _specs.flatten_spec({"observation": self._observation_spec})
        self._action_flat = _specs.flatten_spec({"action": self._action_spec})
        if adder is not None and not (hasattr(adder, "add_steps") and hasattr(adder, "add_first")):
            raise TypeError(f"adder: expected an NStepTransition (it writes one agent's transition at a time with "
                            f"add_steps), got {type(adder).__name__}")
        if adder is not None and adder.num_lanes != self.num_lanes:
            raise ValueError(f"the adder's store has {adder.num_lanes} lanes: expected one per (env, agent), "
                             f"{self.num_envs} x {self.num_agents} = {self.num_lanes}")
        self.adder = adder
        self._seed = seed
        self._base_seed: int | None = None
        self._games = np.zeros(len(self._envs), np.int64)  # games started per env
        n = self.num_lanes
        self._open = np.zeros(n, np.bool_)  # the lane's agent acted and waits for the outcome (its next turn)
        self._action: list[Any] = [None] * n  # that turn's action
        self._return = np.zeros(n, np.float64)  # the episode's rewards so far, per lane
        self._current: Turn | None = None

    # ------------------------------------------------------------------ properties
    @property
    def num_envs(self) -> int:
        return len(self._envs)

    @property
    def num_lanes(self) -> int:
        """``E * A``: one lane per (env, agent)."""
        return self.num_envs * self.num_agents

    @property
    def envs(self) -> list[Any]:
        return self._envs

    @property
    def observation_spec(self) -> Spec:
        return self._observation_spec

    @property
    def action_spec(self) -> Spec:
        return self._action_spec

    @property
    def spec(self) -> dict[str, Spec]:
        """The columns of a step row of one agent's lane."""
        return step_spec(self._observation_spec, self._action_spec)

    # ------------------------------------------------------------------ stepping
    def reset(self, seed: int | None = None) -> Turn:
        """Start a game in every env; the episodes in progress are abandoned (``adder.reset()``)."""
        if seed is None:
            seed, self._seed = self._seed, None
        if self.adder is not None:
            self.adder.reset()  # abandon every lane's episode, also those of agents still to act
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
        """Each env's acting agent takes its action (``actions[e]``); returns the next turn."""
        if self._current is None:
            raise RuntimeError("step() before reset(): expected a call to reset() first")
        arr = np.asarray(actions)
        if arr.shape[:1] != (self.num_envs,):
            raise SpecError(f"actions: expected one action per env, a leading axis of {self.num_envs}, got shape "
                            f"{arr.shape}")
        try:
            _specs.validate(self._action_flat, {"action": arr}, (self.num_envs,))
        except SpecError as exc:
            raise SpecError(f"actions do not fit the action space {self.single_action_space}: {exc}") from None
        ended: list[tuple[int, int, float]] = []
        agents = []
        for e, env in enumerate(self._envs):
            lane = int(self._current.lanes[e])
            action = arr[e].item() if arr[e].ndim == 0 else arr[e]
            self._action[lane] = np.array(arr[e], copy=True)  # written at the agent's next turn
            self._open[lane] = True
            env.step(action)
            agents.append(self._advance(e, ended))
        self._current = self._turn(agents, ended)
        return self._current

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
            lane = e * a + i
            obs, reward, terminated, truncated, _ = env.last()
            done = bool(terminated) or bool(truncated)
            if self._open[lane]:
                self._return[lane] += float(reward)
                if self.adder is not None:
                    self.adder.add_steps(lane, self._action[lane][None], np.array([reward], np.float32),
                                         self._batched(obs), terminated=bool(terminated),
                                         truncated=bool(truncated) and not terminated)
                self._open[lane] = False
                if done:
                    ended.append((e, i, float(self._return[lane])))
                    self._return[lane] = 0.0
            elif not done and self.adder is not None:  # the agent's first turn of this game
                first = self._batched(obs)
                self.adder.add_first(TimeStep(first, np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool),
                                              np.ones(1, bool), np.zeros(1, bool)), lanes=[lane])
            if done:
                env.step(None)
                continue
            return i

    def _batched(self, obs: Any) -> Any:
        """One agent's observation as the store nests it, with a leading axis of 1."""
        if self._masked:
            obs = {"observation": obs["observation"], "action_mask": np.asarray(obs["action_mask"]).astype(np.bool_)}
        return _specs.unflatten({"observation": self._observation_spec}, {
            name: np.asarray(v, self._obs_flat[name].dtype)[None]
            for name, v in _specs.flatten_data({"observation": self._observation_spec}, {"observation": obs}).items()
        })["observation"]

    def _turn(self, agents: list[int], ended: list[tuple[int, int, float]]) -> Turn:
        obs = [self._batched(env.observe(env.agent_selection)) for env in self._envs]
        stacked = _stack(obs)
        idx = np.array(agents, np.int64)
        return Turn(stacked, idx, np.arange(self.num_envs) * self.num_agents + idx, ended)

    def close(self) -> None:
        for env in self._envs:
            env.close()


def _stack(rows: list[Any]) -> Any:
    if isinstance(rows[0], dict):
        return {k: _stack([r[k] for r in rows]) for k in rows[0]}
    if isinstance(rows[0], tuple):
        return tuple(_stack([r[i] for r in rows]) for i in range(len(rows[0])))
    return np.concatenate(rows)
