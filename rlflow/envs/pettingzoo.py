"""PettingZoo parallel environments as a stream of batched TimeSteps: one lane per env, an agent axis.

:class:`ParallelEnvironment` steps ``E`` PettingZoo ``ParallelEnv`` s as one batch. Every per-agent
value gets an agent axis ordered by ``possible_agents`` (``A`` agents), so a lane's step row holds the
whole team and sampling is synchronised across agents::

    env = ParallelEnvironment([simple_spread_v3.parallel_env(N=3) for _ in range(4)], seed=0)
    ts = env.reset()                        # ts.observation["obs"]: [4, 3, 18]
    ts = env.step(actions)                  # actions [4, 3]; ts.reward [4, 3] float32

``ts.observation`` is a dict (its spec is :attr:`ParallelEnvironment.observation_spec`):

========================  ==============================================================================
key                       ``[E, A, ...]`` unless noted
========================  ==============================================================================
``obs``                   each agent's observation; zeros for agents not in the env
``active``                bool: the agent acts from this observation (it is in ``env.agents`` and not done)
``terminated``            bool: the agent's last action ended it for good (its death step)
``truncated``             bool: the agent's last action ended it by a cut (a time limit): it bootstraps
``action_mask``           (when the env has masks) bool ``[E, A, n]``: the legal actions; all False for
                          agents that do not act
``state``                 (when the env has ``state()``) ``[E, ...]``: the global state, for centralised
                          critics
========================  ==============================================================================

An agent's terminated/truncated flags arrive *with* the observation its last action led to, the way
PettingZoo returns them, and that observation (its true final one) is kept: a dying agent's death
step is an ordinary stored step (active, its action and reward), the next row holds its final
observation with ``terminated`` (or ``truncated``) set and ``active`` False, and from then on the
agent is inactive, its observation, action and reward zero. Rewards are read from what ``step``
returns, not from ``env.agents``, so the last step of an episode (after which ``env.agents`` is
empty) keeps every reward and flag; a reward the env gives an agent that did not act in that step
belongs to no action of it and is not stored. An agent that leaves ``env.agents`` without a
terminated or truncated flag is an error (PettingZoo's API has every agent leave through one).

A lane's episode ends (``last``) when no agent remains: ``env.agents`` is empty or every agent that
acted is done. It ends ``terminated`` when none of those agents was truncated (nothing to bootstrap),
``truncated`` otherwise. The env is reset in the same call (gymnasium's ``SAME_STEP`` form): that
lane's ``observation`` starts the next episode and ``final_observation`` holds the ended one's final
observation (with the agents' flags), as in :mod:`rlflow.types`.

Actions come as ``[E, A, ...]`` arrays in the spec of one agent's action space with an agent axis;
the actions of agents that are not active are ignored.

Agents whose spaces differ (a speaker and a listener; predators and prey) form **groups**
(:func:`rlflow.envs.make_groups`, :attr:`ParallelEnvironment.groups`): agents sharing their observation and
action spaces, each group with an agent axis of its own. In a team of several groups, ``obs`` and
``action_mask`` hold one entry per group, ``{name: [E, A_g, ...]}`` (``action_mask`` only for groups
with masks), and actions come as ``{name: [E, A_g, ...]}``; ``active``, ``terminated``, ``truncated``
and the rewards keep one entry per agent of the team, ``[E, A]`` in ``possible_agents`` order (group
``g``'s agents at ``env.groups[g].indices``). Nothing is padded: a row costs the sum of the agents' own
fields. A team of one group has the layout above.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlflow import specs as _specs
from rlflow.envs import state as env_state
from rlflow.envs.groups import make_groups
from rlflow.envs.kinds import make_envs
from rlflow.specs import AgentGroup, Field, Spec, SpecError
from rlflow.types import TimeStep, step_spec

__all__ = ["ParallelEnvironment"]

_MASK_KEYS = ("observation", "action_mask")


@dataclass(frozen=True)
class _GroupLayout:
    """Where one group's per-agent values live in a step row: its column paths and one agent's specs."""

    group: AgentGroup
    obs_spec: Spec  # one agent's observation (without its action mask)
    act_spec: Spec  # one agent's action
    mask_in_obs: bool  # the agent observation space is Dict(observation, action_mask)
    mask_shape: tuple[int, ...] | None  # one agent's action mask, or None without masks
    obs_key: str  # "obs", or "obs/<group>" when the team has several groups
    mask_key: str  # "action_mask" or "action_mask/<group>"
    act_key: str  # "" or "<group>"


def _layout(group: AgentGroup, action_mask: str | None, nested: bool) -> _GroupLayout:
    from gymnasium import spaces

    obs_space, act_space = group.observation_space, group.action_space
    in_obs = isinstance(obs_space, spaces.Dict) and set(obs_space.spaces) == set(_MASK_KEYS)
    where = f" (group {group.name!r})" if nested else ""
    if action_mask == "observation" and not in_obs:
        raise ValueError(f"action_mask='observation': expected an agent observation space Dict with keys "
                         f"{list(_MASK_KEYS)}, got {obs_space}{where}")
    mask_in_obs = in_obs and action_mask in ("auto", "observation")
    mask_shape: tuple[int, ...] | None = None
    if mask_in_obs:
        mask_shape = tuple(obs_space["action_mask"].shape)
    elif action_mask == "info":
        if isinstance(act_space, spaces.Discrete):
            mask_shape = (int(act_space.n),)
        elif isinstance(act_space, spaces.MultiDiscrete) and act_space.nvec.ndim == 1:
            mask_shape = (int(act_space.nvec.sum()),)
        elif not nested:  # in a team of several groups, only the groups with discrete actions have masks
            raise ValueError(f"action_mask='info': expected a Discrete or MultiDiscrete action space, got "
                             f"{act_space}{where}")
    suffix = f"/{group.name}" if nested else ""
    group = replace(group, observation_space=obs_space["observation"] if mask_in_obs else obs_space)
    return _GroupLayout(group, _specs.from_space(group.observation_space), _specs.from_space(act_space), mask_in_obs,
                        mask_shape, "obs" + suffix, "action_mask" + suffix, group.name if nested else "")


def _under(name: str, key: str) -> bool:
    return not key or name == key or name.startswith(key + "/")


class ParallelEnvironment:
    """``E`` PettingZoo parallel envs as one batch of lanes with an agent axis (see the module docstring).

    Args:
        envs: ``ParallelEnv`` instances, or functions making them (one lane each); every env has the same
            ``possible_agents`` and spaces.
        seed: the seed of the first :meth:`reset` when that call gives none (env ``i`` gets ``seed + i``).
        action_mask: where legal-action masks come from: ``"observation"`` (an agent observation space
            that is a ``Dict`` with ``"observation"`` and ``"action_mask"``, as PettingZoo's classic games
            have), ``"info"`` (``info[agent]["action_mask"]``, one bool per action of a ``Discrete``
            space, per choice of each head of a ``MultiDiscrete`` one), ``"auto"`` (``"observation"``
            when the space has that form, else none) or ``None``.
        state: store the env's global ``state()`` (``"auto"``: when the env has a ``state_space``).
        groups: which agents share an agent axis, ``{name: [agent, ...]}`` (see :func:`rlflow.envs.make_groups`;
            by default: one group when every agent has the same spaces, else one per name prefix).
    """

    def __init__(self, envs: Sequence[Any | Callable[[], Any]], *, seed: int | None = None,
                 action_mask: str | None = "auto", state: bool | str = "auto",
                 groups: Mapping[str, Sequence[str]] | None = None) -> None:
        self._envs = make_envs(envs, "parallel", "ParallelEnvironment")
        first = self._envs[0]
        agents = list(first.possible_agents)
        for i, env in enumerate(self._envs):
            if list(env.possible_agents) != agents:
                raise ValueError(f"envs[{i}]: expected possible_agents {agents}, got {list(env.possible_agents)}")
        self.possible_agents = agents
        self.num_agents = len(agents)
        for e, env in enumerate(self._envs[1:], 1):
            for agent in agents:
                for kind in ("observation_space", "action_space"):
                    if getattr(env, kind)(agent) != getattr(first, kind)(agent):
                        raise SpecError(f"envs[{e}]: agent {agent!r}'s {kind.replace('_', ' ')} is "
                                        f"{getattr(env, kind)(agent)}, envs[0]'s is {getattr(first, kind)(agent)}; "
                                        "expected every env built the same way")
        if action_mask not in ("auto", "observation", "info", None):
            raise ValueError(f"action_mask: expected 'auto', 'observation', 'info' or None, got {action_mask!r}")
        self._mask_from_info = action_mask == "info"
        self._groups = make_groups(agents, first.observation_space, first.action_space, groups)
        nested = len(self._groups) > 1
        self._layouts = [_layout(g, action_mask, nested) for g in self._groups]
        if action_mask == "info" and all(layout.mask_shape is None for layout in self._layouts):
            raise ValueError(f"action_mask='info': expected a Discrete or MultiDiscrete action space in some group, "
                             f"got {[str(layout.group.action_space) for layout in self._layouts]}")
        self._where = {agent: (layout, pos) for layout in self._layouts
                       for pos, agent in enumerate(layout.group.agents)}
        self._use_state = (state == "auto" and getattr(first, "state_space", None) is not None) or state is True
        if state not in ("auto", True, False):
            raise ValueError(f"state: expected 'auto', True or False, got {state!r}")
        if self._use_state and getattr(first, "state_space", None) is None:
            raise ValueError("state=True: the env has no state_space")
        self._seed = seed
        self._needs_reset = True
        a = self.num_agents

        def by_group(spec_of: Callable[[_GroupLayout], Spec | None]) -> Spec | None:
            parts = {lay.group.name: spec_of(lay) for lay in self._layouts}
            present = {name: spec for name, spec in parts.items() if spec is not None}
            if not present:
                return None
            return present if nested else next(iter(present.values()))

        obs: dict[str, Spec] = {
            "obs": by_group(lambda lay: _specs.add_agent_axis(lay.obs_spec, len(lay.group.agents))),  # type: ignore[dict-item]
            "active": Field((a,), np.bool_),
            "terminated": Field((a,), np.bool_),
            "truncated": Field((a,), np.bool_),
        }
        masks = by_group(lambda lay: None if lay.mask_shape is None else Field((len(lay.group.agents),
                                                                                *lay.mask_shape), np.bool_))
        if masks is not None:
            obs["action_mask"] = masks
        if self._use_state:
            obs["state"] = _specs.from_space(self._envs[0].state_space)
        self._observation_spec = obs
        self._action_spec: Spec = by_group(  # type: ignore[assignment]
            lambda lay: _specs.add_agent_axis(lay.act_spec, len(lay.group.agents)))
        self._obs_flat = _specs.flatten_spec(obs)
        self._act_flat = _specs.flatten_spec(self._action_spec)

    # ------------------------------------------------------------------ properties
    @property
    def envs(self) -> list[Any]:
        """The wrapped envs, one per lane."""
        return self._envs

    @property
    def num_envs(self) -> int:
        """The number of lanes ``E``."""
        return len(self._envs)

    @property
    def groups(self) -> dict[str, AgentGroup]:
        """The team's agent groups by name (one for a team whose agents share their spaces)."""
        return {layout.group.name: layout.group for layout in self._layouts}

    @property
    def single_agent_observation_space(self) -> Any:
        """Every agent's observation space (without its action mask), for a team of one group."""
        return self._one_group("single_agent_observation_space").group.observation_space

    @property
    def single_agent_action_space(self) -> Any:
        """Every agent's action space, for a team of one group."""
        return self._one_group("single_agent_action_space").group.action_space

    @property
    def single_action_space(self) -> Any:
        """One lane's actions as a gymnasium space: each group's agent action space batched over its agent
        axis (a ``Dict`` by group name when the team has several groups)."""
        from gymnasium import spaces
        from gymnasium.vector.utils import batch_space

        parts = {lay.group.name: batch_space(lay.group.action_space, len(lay.group.agents)) for lay in self._layouts}
        return spaces.Dict(parts) if len(parts) > 1 else next(iter(parts.values()))

    @property
    def observation_spec(self) -> dict[str, Spec]:
        """One lane's observation dict (see the module docstring)."""
        return self._observation_spec

    @property
    def action_spec(self) -> Spec:
        """One lane's actions: an agent's action spec with a leading agent axis."""
        return self._action_spec

    @property
    def reward_spec(self) -> Field:
        """One lane's rewards: float32 ``[A]``, one per agent."""
        return Field((self.num_agents,), np.float32)

    @property
    def spec(self) -> dict[str, Spec]:
        """The columns of a step row, without extras (per-agent rewards)."""
        return step_spec(self._observation_spec, self._action_spec, reward=self.reward_spec)

    def step_spec(self, extras: Spec | None = None) -> dict[str, Spec]:
        """The columns of a step row with the user's ``extras`` (log-probs, values, RNN state, ...)."""
        return step_spec(self._observation_spec, self._action_spec, extras, reward=self.reward_spec)

    # ------------------------------------------------------------------ stepping
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> TimeStep:
        """Reset every lane: ``first=True``, rewards 0, every agent's flags False."""
        if seed is None:
            seed, self._seed = self._seed, None
        n = self.num_envs
        obs = _specs.zeros(self._obs_flat, (n,))
        infos = []
        for e, env in enumerate(self._envs):
            o, info = env.reset(seed=None if seed is None else seed + e, options=options)
            self._fill_obs(obs, e, env, o, info, None)
            infos.append(info)
        self._needs_reset = False
        return TimeStep(self._nest(obs), np.zeros((n, self.num_agents), np.float32), np.zeros(n, np.bool_),
                        np.zeros(n, np.bool_), np.ones(n, np.bool_), np.zeros(n, np.bool_), None, infos)

    def step(self, actions: Any) -> TimeStep:
        """Take each lane's agents' actions (``[E, A, ...]``) and report what happened."""
        if self._needs_reset:
            raise RuntimeError("step() before reset(): expected a call to reset() first")
        n, a = self.num_envs, self.num_agents
        flat_actions = self._check_actions(actions)
        obs = _specs.zeros(self._obs_flat, (n,))
        final: dict[str, np.ndarray] | None = None
        reward = np.zeros((n, a), np.float32)
        terminated = np.zeros(n, np.bool_)
        truncated = np.zeros(n, np.bool_)
        infos: list[Any] = []
        for e, env in enumerate(self._envs):
            acting = list(env.agents)
            act = {agent: self._agent_action(flat_actions, e, agent) for agent in acting}
            o, r, term, trunc, info = env.step(act)
            for agent in acting:  # rewards of agents that did not act belong to no action of theirs
                reward[e, self._index(agent)] = r.get(agent, 0.0)
            done = {agent for agent in acting if term.get(agent, False) or trunc.get(agent, False)}
            gone = [agent for agent in acting if agent not in env.agents and agent not in done]
            if gone:
                raise SpecError(f"env {e}: agents {gone} left env.agents without a terminated or truncated flag; "
                                "expected every agent to leave through one (PettingZoo's parallel API)")
            ended = not env.agents or all(agent in done for agent in acting)
            if ended:
                if final is None:
                    final = _specs.zeros(self._obs_flat, (n,))
                self._fill_obs(final, e, env, o, info, (term, trunc), alive=())
                terminated[e] = not any(trunc.get(agent, False) for agent in acting)
                truncated[e] = not terminated[e]
                o, info_reset = env.reset(options=None)
                self._fill_obs(obs, e, env, o, info_reset, None)
                infos.append({**info, "reset_info": info_reset})
            else:
                self._fill_obs(obs, e, env, o, info, (term, trunc))
                infos.append(info)
        last = terminated | truncated
        return TimeStep(self._nest(obs), reward, terminated, truncated, last.copy(), last,
                        None if final is None else self._nest(final), infos)

    # ------------------------------------------------------------------ helpers
    def _one_group(self, what: str) -> _GroupLayout:
        if len(self._layouts) > 1:
            raise AttributeError(f"{what}: the agents of this team have different spaces (groups "
                                 f"{list(self.groups)}); use env.groups[name].observation_space / .action_space")
        return self._layouts[0]

    def _index(self, agent: Any) -> int:
        try:
            return self.possible_agents.index(agent)
        except ValueError:
            raise ValueError(f"the env returned agent {agent!r}, not one of possible_agents "
                             f"{self.possible_agents}") from None

    def _fill_obs(self, out: dict[str, np.ndarray], e: int, env: Any, observations: Mapping[Any, Any],
                  info: Mapping[Any, Any], flags: tuple[Mapping[Any, bool], Mapping[Any, bool]] | None,
                  alive: Any = None) -> None:
        """Write lane ``e``'s observation dict into the flat columns ``out``."""
        live = set(env.agents) if alive is None else set(alive)
        for agent, value in observations.items():
            i = self._index(agent)
            layout, pos = self._where[agent]
            if layout.mask_in_obs:
                mask, value = value["action_mask"], value["observation"]
            elif self._mask_from_info and layout.mask_shape is not None:
                mask = (info.get(agent) or {}).get("action_mask") if isinstance(info, Mapping) else None
                if mask is None and agent in live and not (flags and (flags[0].get(agent) or flags[1].get(agent))):
                    raise SpecError(f"action_mask='info': expected info[{agent!r}]['action_mask'] for the acting "
                                    f"agent {agent!r}, got info keys {sorted(map(str, (info.get(agent) or {})))}")
            else:
                mask = None
            done = flags is not None and (flags[0].get(agent, False) or flags[1].get(agent, False))
            if flags is not None:
                out["terminated"][e, i] = bool(flags[0].get(agent, False))
                out["truncated"][e, i] = bool(flags[1].get(agent, False))
            is_active = agent in live and not done
            out["active"][e, i] = is_active
            for name, v in _specs.flatten_data(layout.obs_spec, value, layout.obs_key).items():
                out[name][e, pos] = v
            if mask is not None:
                self._put_mask(out, e, agent, mask, is_active)
        if self._use_state:
            for name, v in _specs.flatten_data(self._observation_spec["state"], env.state(), "state").items():
                out[name][e] = v

    def _put_mask(self, out: dict[str, np.ndarray], e: int, agent: Any, mask: Any, active: bool) -> None:
        layout, pos = self._where[agent]
        if isinstance(mask, tuple | list) and mask and np.ndim(mask[0]) == 1:  # one mask per head (gymnasium's form)
            mask = np.concatenate([np.asarray(m) for m in mask])
        mask = np.asarray(mask)
        if mask.shape != layout.mask_shape:
            raise SpecError(f"action mask of agent {agent!r}: expected shape {layout.mask_shape}, got {mask.shape}")
        if active:
            out[layout.mask_key][e, pos] = mask.astype(np.bool_)

    def _nest(self, flat: dict[str, np.ndarray]) -> dict[str, Any]:
        return _specs.unflatten(self._observation_spec, flat)

    def _check_actions(self, actions: Any) -> dict[str, np.ndarray]:
        n = self.num_envs
        flat = _specs.flatten_data(self._action_spec, actions)
        out = {}
        for name, value in flat.items():
            arr = np.asarray(value)
            field = self._act_flat[name]
            if arr.shape != (n, *field.shape):
                raise SpecError(f"actions{'' if name == '' else '/' + name}: expected shape {(n, *field.shape)} "
                                f"(lanes, agents, ...), got {arr.shape}")
            out[name] = arr
        return out

    def _agent_action(self, flat: dict[str, np.ndarray], e: int, agent: Any) -> Any:
        self._index(agent)  # an agent the env made up raises, naming possible_agents
        layout, pos = self._where[agent]
        leaves = {name: value[e, pos] for name, value in flat.items() if _under(name, layout.act_key)}
        return _specs.unflatten(layout.act_spec, {k: (v.item() if v.ndim == 0 else v) for k, v in leaves.items()},
                                layout.act_key)

    # ------------------------------------------------------------------ lifetime
    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """Every env's state as plain data (:mod:`rlflow.envs.state`) and the wrapper's own (the seed of a
        first reset not yet made), for :meth:`load_state_dict` on envs built the same way. Raises
        :class:`~rlflow.envs.state.EnvStateError` when an env holds an object that is not plain data (e.g.
        MPE's ``World``)."""
        return {"envs": [env_state.capture(env, f"envs[{e}]") for e, env in enumerate(self._envs)],
                "needs_reset": self._needs_reset, "seed": self._seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output on envs built as the saved ones were (and not reset
        since). Raises ``ValueError``, changing nothing, when they were built otherwise."""
        saved = state["envs"]
        if len(saved) != self.num_envs:
            raise ValueError(f"env state: expected the state of {self.num_envs} envs, got {len(saved)}; build the "
                             "envs as the checkpointed run did")
        for e, (env, env_saved) in enumerate(zip(self._envs, saved, strict=True)):
            env_state.restore(env, env_saved, f"envs[{e}]", check_only=True)
        for e, (env, env_saved) in enumerate(zip(self._envs, saved, strict=True)):
            env_state.restore(env, env_saved, f"envs[{e}]")
        self._needs_reset = bool(state["needs_reset"])
        self._seed = state["seed"]

    def close(self) -> None:
        for env in self._envs:
            env.close()

    def __enter__(self) -> ParallelEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ParallelEnvironment({self._envs[0]}, num_envs={self.num_envs}, agents={self.possible_agents})"
