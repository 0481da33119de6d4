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
the actions of agents that are not active are ignored. Agents must share one observation space and
one action space (the agent axis needs one shape); pad heterogeneous agents first (e.g. SuperSuit's
``pad_observations_v0`` / ``pad_action_space_v0``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlflow import env_state
from rlflow import specs as _specs
from rlflow.envs.kinds import make_envs
from rlflow.specs import Field, Spec, SpecError
from rlflow.types import TimeStep, step_spec

__all__ = ["ParallelEnvironment"]

_MASK_KEYS = ("observation", "action_mask")


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
    """

    def __init__(self, envs: Sequence[Any | Callable[[], Any]], *, seed: int | None = None,
                 action_mask: str | None = "auto", state: bool | str = "auto") -> None:
        self._envs = make_envs(envs, "parallel", "ParallelEnvironment")
        first = self._envs[0]
        agents = list(first.possible_agents)
        for i, env in enumerate(self._envs):
            if list(env.possible_agents) != agents:
                raise ValueError(f"envs[{i}]: expected possible_agents {agents}, got {list(env.possible_agents)}")
        self.possible_agents = agents
        self.num_agents = len(agents)
        obs_space = first.observation_space(agents[0])
        act_space = first.action_space(agents[0])
        for env in self._envs:
            for agent in agents:
                if env.observation_space(agent) != obs_space:
                    raise SpecError(f"agent {agent!r}: expected the observation space of {agents[0]!r} "
                                    f"({obs_space}), got {env.observation_space(agent)}; the agent axis needs one "
                                    "space (pad the observations first)")
                if env.action_space(agent) != act_space:
                    raise SpecError(f"agent {agent!r}: expected the action space of {agents[0]!r} "
                                    f"({act_space}), got {env.action_space(agent)}; the agent axis needs one "
                                    "space (pad the action spaces first)")
        from gymnasium import spaces

        in_obs = isinstance(obs_space, spaces.Dict) and set(obs_space.spaces) == set(_MASK_KEYS)
        if action_mask not in ("auto", "observation", "info", None):
            raise ValueError(f"action_mask: expected 'auto', 'observation', 'info' or None, got {action_mask!r}")
        if action_mask == "observation" and not in_obs:
            raise ValueError(f"action_mask='observation': expected an agent observation space Dict with keys "
                             f"{list(_MASK_KEYS)}, got {obs_space}")
        self._mask_in_obs = in_obs and action_mask in ("auto", "observation")
        self.single_agent_observation_space = obs_space["observation"] if self._mask_in_obs else obs_space
        self.single_agent_action_space = act_space
        self._mask_from_info = action_mask == "info"
        self._mask_shape: tuple[int, ...] | None = None
        if self._mask_in_obs:
            self._mask_shape = tuple(obs_space["action_mask"].shape)
        elif self._mask_from_info:
            if isinstance(act_space, spaces.Discrete):
                self._mask_shape = (int(act_space.n),)
            elif isinstance(act_space, spaces.MultiDiscrete) and act_space.nvec.ndim == 1:
                self._mask_shape = (int(act_space.nvec.sum()),)
            else:
                raise ValueError(f"action_mask='info': expected a Discrete or MultiDiscrete action space, got "
                                 f"{act_space}")
        self._use_state = (state == "auto" and getattr(first, "state_space", None) is not None) or state is True
        if state not in ("auto", True, False):
            raise ValueError(f"state: expected 'auto', True or False, got {state!r}")
        if self._use_state and getattr(first, "state_space", None) is None:
            raise ValueError("state=True: the env has no state_space")
        self._agent_obs_spec = _specs.from_space(self.single_agent_observation_space)
        self._agent_act_spec = _specs.from_space(act_space)
        self._seed = seed
        self._needs_reset = True
        a = self.num_agents
        obs: dict[str, Spec] = {
            "obs": _specs.add_agent_axis(self._agent_obs_spec, a),
            "active": Field((a,), np.bool_),
            "terminated": Field((a,), np.bool_),
            "truncated": Field((a,), np.bool_),
        }
        if self._mask_shape is not None:
            obs["action_mask"] = Field((a, *self._mask_shape), np.bool_)
        if self._use_state:
            obs["state"] = _specs.from_space(self._envs[0].state_space)
        self._observation_spec = obs
        self._action_spec = _specs.add_agent_axis(self._agent_act_spec, a)
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
    def single_action_space(self) -> Any:
        """One lane's actions as a gymnasium space: the agent action space batched over the agent axis."""
        from gymnasium.vector.utils import batch_space

        return batch_space(self.single_agent_action_space, self.num_agents)

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
            act = {agent: self._agent_action(flat_actions, e, self.possible_agents.index(agent)) for agent in acting}
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
            if self._mask_in_obs:
                mask, value = value["action_mask"], value["observation"]
            elif self._mask_from_info:
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
            for name, v in _specs.flatten_data(self._agent_obs_spec, value, "obs").items():
                out[name][e, i] = v
            if mask is not None:
                self._put_mask(out, e, i, mask, is_active)
        if self._use_state:
            for name, v in _specs.flatten_data(self._observation_spec["state"], env.state(), "state").items():
                out[name][e] = v

    def _put_mask(self, out: dict[str, np.ndarray], e: int, i: int, mask: Any, active: bool) -> None:
        if isinstance(mask, tuple | list) and mask and np.ndim(mask[0]) == 1:  # one mask per head (gymnasium's form)
            mask = np.concatenate([np.asarray(m) for m in mask])
        mask = np.asarray(mask)
        if mask.shape != self._mask_shape:
            raise SpecError(f"action mask of agent {self.possible_agents[i]!r}: expected shape {self._mask_shape}, "
                            f"got {mask.shape}")
        if active:
            out["action_mask"][e, i] = mask.astype(np.bool_)

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

    def _agent_action(self, flat: dict[str, np.ndarray], e: int, i: int) -> Any:
        leaves = {name: value[e, i] for name, value in flat.items()}
        if set(leaves) == {""}:
            value = leaves[""]
            return value.item() if value.ndim == 0 else value
        return _specs.unflatten(self._agent_act_spec, {k: (v.item() if v.ndim == 0 else v) for k, v in leaves.items()})

    # ------------------------------------------------------------------ lifetime
    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """Every env's state as plain data (:mod:`rlflow.env_state`) and the wrapper's own (the seed of a
        first reset not yet made), for :meth:`load_state_dict` on envs built the same way. Raises
        :class:`~rlflow.env_state.EnvStateError` when an env holds an object that is not plain data (e.g.
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
