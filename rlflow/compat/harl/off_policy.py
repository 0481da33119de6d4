"""HARL's off-policy replay buffers (``harl.common.buffers``) on rlflow's store, for heterogeneous agents.

A HARL user switches by changing one import::

    # from harl.common.buffers.off_policy_buffer_ep import OffPolicyBufferEP
    from rlflow.compat.harl import OffPolicyBufferEP

    buffer = OffPolicyBufferEP(args, share_obs_space, num_agents, obs_spaces, act_spaces)
    buffer.insert(data)          # HARL's tuple, one transition per rollout thread
    (sp_share_obs, sp_obs, sp_actions, sp_available_actions, sp_reward, sp_done, sp_valid_transitions,
     sp_term, sp_next_share_obs, sp_next_obs, sp_next_available_actions, sp_gamma) = buffer.sample()

``args`` holds ``buffer_size``, ``batch_size``, ``n_step``, ``n_rollout_threads`` and ``gamma``; each agent
has its own observation and action space. ``insert`` takes HARL's tuple ``(share_obs, obs, actions,
available_actions, reward, done, valid_transitions, term, next_share_obs, next_obs,
next_available_actions)`` with HARL's shapes (``OffPolicyBufferEP``: the state, reward, done and term one
per thread; ``OffPolicyBufferFP``: one per thread and agent) and ``sample`` returns HARL's tuple with
HARL's shapes. Underneath, each thread is a lane of a :class:`~rlflow.ReplayBuffer` on multi-agent rows
(every agent a group of its own, with its own shapes): each observation is stored once (HARL stores
``obs`` and ``next_obs``, and the state twice), and n-step windows are rlflow's.

What differs from HARL (``docs/harl.md`` lists them, each tested):

- a window's rewards and ends: EP windows stop at the thread's ``done``, FP windows at each agent's own
  ``done``, as HARL's; but a window is sampled only once its ``n_step`` transitions are in (or its episode
  ended), where HARL also samples the newest steps of each thread with a shortened window;
- ``sp_gamma`` is ``gamma ** k`` for a window of ``k`` transitions that bootstraps, and 0 for one that
  ends in termination (HARL gives ``gamma ** k`` there too; its learners multiply it by ``1 - sp_term``);
- a draw is uniform with replacement (HARL draws without replacement, ``torch.randperm``); the sample is
  seeded with ``seed=``;
- ``buffer_size`` counts stored rows: a thread's episode of ``T`` transitions takes ``T + 1`` rows;
- ``obs`` of a thread must continue from its last ``next_obs`` unless that transition was ``done``
  (HARL's runners insert that way): an episode restarted without ``done`` is closed as truncated at its
  last ``next_obs``, and nothing is lost;
- ``sp_obs``, ``sp_actions``, ``sp_available_actions`` and ``sp_next_obs`` are arrays ``[n_agents, B,
  ...]`` when every agent's part has one shape, and lists of per-agent arrays ``[B, ...]`` when they
  differ (where HARL's ``np.array`` of them fails); an agent without a Discrete action space has None
  in ``sp_available_actions`` (HARL leaves them all out unless agent 0's space is Discrete);
- bad input raises a ``ValueError`` naming the part, and the buffer is unchanged (HARL broadcasts or
  stores what it is given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlflow.buffer import ReplayBuffer
from rlflow.compat.harl.shapes import act_dim, obs_shape
from rlflow.replay.table import RateLimitTimeout
from rlflow.specs import AgentGroup, Field

__all__ = ["OffPolicyBufferEP", "OffPolicyBufferFP"]

_f32 = np.float32


def _per_agent(parts: list[Any]) -> Any:
    """Per-agent arrays as one ``[n_agents, B, ...]`` array when their shapes agree (HARL's ``np.array``), else
    the list (agents with different shapes: index it by agent, as HARL's learners do)."""
    if all(p is not None for p in parts) and len({p.shape for p in parts}) == 1:
        return np.stack(parts)
    return parts


class _OffPolicyBuffer:
    """The part EP and FP share: the rows, ``insert`` and ``sample`` (see the module docstring)."""

    per_agent_state = False  # FP: a state, reward, done and term per agent

    def __init__(self, args: Mapping[str, Any], share_obs_space: Any, num_agents: int, obs_spaces: Sequence[Any],
                 act_spaces: Sequence[Any], *, seed: int | None = None) -> None:
        missing = [k for k in ("buffer_size", "batch_size", "n_step", "n_rollout_threads", "gamma") if k not in args]
        if missing:
            raise ValueError(f"args: expected the keys buffer_size, batch_size, n_step, n_rollout_threads and gamma; "
                             f"missing {missing}")
        self.buffer_size, self.batch_size = int(args["buffer_size"]), int(args["batch_size"])
        self.n_step, self.n_rollout_threads = int(args["n_step"]), int(args["n_rollout_threads"])
        self.gamma = float(args["gamma"])
        self.num_agents = a = int(num_agents)
        if len(obs_spaces) != a or len(act_spaces) != a:
            raise ValueError(f"obs_spaces and act_spaces: expected one per agent ({a}), got {len(obs_spaces)} and "
                             f"{len(act_spaces)}")
        self.act_spaces = list(act_spaces)
        self.share_obs_shape = obs_shape(share_obs_space)
        self.obs_shapes = [obs_shape(s) for s in obs_spaces]
        self.act_dims = [act_dim(s) for s in act_spaces]
        self.discrete = [type(s).__name__ == "Discrete" for s in act_spaces]
        self._names = [f"agent_{i}" for i in range(a)]
        state = Field((a, *self.share_obs_shape) if self.per_agent_state else self.share_obs_shape, _f32)
        observation: dict[str, Any] = {
            "obs": {name: Field((1, *shape), _f32) for name, shape in zip(self._names, self.obs_shapes, strict=True)},
            "active": Field((a,), np.bool_), "terminated": Field((a,), np.bool_), "truncated": Field((a,), np.bool_),
            # EP: the team's state, read at the window's end; FP: each agent's, read at its own end
            ("share_obs" if self.per_agent_state else "state"): state}
        masks = {name: Field((1, int(s.n)), np.bool_) for name, s, d in zip(self._names, act_spaces, self.discrete,
                                                                            strict=True) if d}
        if masks:
            observation["action_mask"] = masks
        action = {name: Field((1, d), _f32) for name, d in zip(self._names, self.act_dims, strict=True)}
        groups = {name: AgentGroup(name, (name,), (i,)) for i, name in enumerate(self._names)}
        self._buffer = ReplayBuffer(observation, action, self.buffer_size, n_step=self.n_step, discount=self.gamma,
                                    num_envs=self.n_rollout_threads, extras={"valid": Field((a,), _f32)},
                                    reward=Field((a,), _f32), groups=groups, seed=seed)
        self._flags = np.zeros((2, self.n_rollout_threads, a), np.bool_)  # each thread's last done, term per agent
        self._inserted = 0

    # ------------------------------------------------------------------ HARL's interface
    @property
    def cur_size(self) -> int:
        """Transitions that can be sampled now (HARL's current occupied size)."""
        return self._buffer.table.size

    def insert(self, data: Sequence[Any]) -> None:
        """Insert one transition per rollout thread: HARL's tuple (see the module docstring)."""
        if len(data) != 11:
            raise ValueError(f"data: expected HARL's tuple of 11 (share_obs, obs, actions, available_actions, reward, "
                             f"done, valid_transitions, term, next_share_obs, next_obs, next_available_actions), got "
                             f"{len(data)} parts")
        (share_obs, obs, actions, available, reward, done, valid, term, next_share_obs, next_obs,
         next_available) = data
        n, a = self.n_rollout_threads, self.num_agents
        team = (n, a, 1) if self.per_agent_state else (n, 1)
        reward, done, term = (self._array(x, team, name) for x, name in ((reward, "reward"), (done, "done"),
                                                                        (term, "term")))
        done, term = done.astype(bool).reshape(n, -1), term.astype(bool).reshape(n, -1)
        done, term = np.broadcast_to(done, (n, a)), np.broadcast_to(term, (n, a))  # EP: the thread's, every agent's
        ended: np.ndarray = np.asarray(done.all(axis=1))  # a thread's episode ends when every agent is done
        valid = np.stack([self._array(v, (n, 1), f"valid_transitions[{i}]")[:, 0]
                          for i, v in enumerate(self._agents(valid, "valid_transitions"))], axis=1)
        before = self._observation(share_obs, obs, available, "", self._flags[0], self._flags[1])
        after = self._observation(next_share_obs, next_obs, next_available, "next_", done & ~term, term)
        act = {name: self._array(x, (n, d), f"actions[{i}]").reshape(n, 1, d) for i, (name, x, d) in enumerate(
            zip(self._names, self._agents(actions, "actions"), self.act_dims, strict=True))}
        rewards = np.broadcast_to(reward.reshape(n, -1), (n, a))
        terminated = ended & term.all(axis=1)
        self._buffer.add(before, act, rewards, after, terminated, ended & ~terminated, {"valid": valid})
        self._flags[0] = np.where(ended[:, None], False, done & ~term)
        self._flags[1] = np.where(ended[:, None], False, term)
        self._inserted += n

    def sample(self) -> tuple[Any, ...]:
        """``batch_size`` transitions in HARL's layout (see :class:`OffPolicyBufferEP`, :class:`OffPolicyBufferFP`)."""
        try:
            s = self._buffer.sample(self.batch_size)
        except RateLimitTimeout as exc:
            raise RateLimitTimeout(f"sample: no transition can be sampled yet ({self._inserted} inserted; a window "
                                   f"is sampled once its n_step = {self.n_step} transitions are in or its episode "
                                   "ended)") from exc
        batch = s.data
        b, a = self.batch_size, self.num_agents

        def agents(part: Mapping[str, Any], key: str) -> Any:
            return _per_agent([np.asarray(part[key][name])[:, 0] for name in self._names])

        def masks(part: Mapping[str, Any]) -> Any:
            if not any(self.discrete):  # HARL: None unless the action spaces are Discrete
                return None
            return _per_agent([np.asarray(part["action_mask"][name])[:, 0].astype(_f32) if name in part["action_mask"]
                               else None for name in self._names])

        term = np.asarray(batch.next_observation["terminated"])  # [B, A]: each agent's at its window's end
        done = term | np.asarray(batch.next_observation["truncated"])
        gamma = np.asarray(batch.discount, np.float64)  # g^k, 0 after a termination
        reward = np.asarray(batch.reward, np.float64)
        valid = np.asarray(batch.extras["valid"]).T[:, :, None]
        if self.per_agent_state:  # FP: (n_agents * batch_size, ...), agent-major
            share = np.concatenate(np.asarray(batch.observation["share_obs"]).transpose(1, 0, 2), axis=0)
            next_share = np.concatenate(np.asarray(batch.next_observation["share_obs"]).transpose(1, 0, 2), axis=0)
            sp_reward, sp_done, sp_term, sp_gamma = (x.T.reshape(a * b, 1) for x in (reward, done, term, gamma))
        else:
            share, next_share = batch.observation["state"], batch.next_observation["state"]
            sp_reward, sp_done, sp_term, sp_gamma = (x[:, :1] for x in (reward, done, term, gamma))
        actions = _per_agent([np.asarray(batch.action[name])[:, 0] for name in self._names])
        return (share, agents(batch.observation, "obs"), actions, masks(batch.observation), sp_reward, sp_done,
                valid, sp_term, next_share, agents(batch.next_observation, "obs"), masks(batch.next_observation),
                sp_gamma)

    def get_mean_rewards(self) -> float:
        """The mean of the stored rewards (HARL's ``get_mean_rewards``)."""
        return float(np.mean(self._buffer.store.flat_columns()["reward"]))

    # ------------------------------------------------------------------ checks
    def _agents(self, values: Any, name: str) -> list[Any]:
        if values is None or len(values) != self.num_agents:
            got = "None" if values is None else f"{len(values)}"
            raise ValueError(f"{name}: expected one array per agent ({self.num_agents}), got {got}")
        return list(values)

    def _array(self, value: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
        arr = np.asarray(value)
        if arr.shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {arr.shape}")
        return arr

    def _observation(self, share: Any, obs: Any, available: Any, prefix: str, truncated: np.ndarray,
                     terminated: np.ndarray) -> dict[str, Any]:
        """One side of the transitions as multi-agent rows: every agent active (HARL's valid_transitions ride
        as an extra), its flags those of the transition that led to it."""
        n, a = self.n_rollout_threads, self.num_agents
        state_shape = (n, a, *self.share_obs_shape) if self.per_agent_state else (n, *self.share_obs_shape)
        out: dict[str, Any] = {
            "obs": {name: self._array(x, (n, *shape), f"{prefix}obs[{i}]")[:, None] for i, (name, x, shape) in
                    enumerate(zip(self._names, self._agents(obs, f"{prefix}obs"), self.obs_shapes, strict=True))},
            "active": np.ones((n, a), np.bool_), "terminated": terminated, "truncated": truncated,
            ("share_obs" if self.per_agent_state else "state"): self._array(share, state_shape, f"{prefix}share_obs")}
        if any(self.discrete):
            given = self._agents(available, f"{prefix}available_actions")
            out["action_mask"] = {
                name: self._array(given[i], (n, int(self.act_spaces[i].n)), f"{prefix}available_actions[{i}]")[
                    :, None].astype(np.bool_) for i, name in enumerate(self._names) if self.discrete[i]}
        return out


class OffPolicyBufferEP(_OffPolicyBuffer):
    """HARL's off-policy buffer with an environment-provided (EP) state: one state, reward, done and term per
    thread. ``sample()`` returns ``sp_share_obs [B, *dim]``, ``sp_obs``, ``sp_actions``,
    ``sp_available_actions`` (Discrete action spaces; else None) and ``sp_next_obs`` ``[n_agents, B, *dim]``,
    ``sp_reward``, ``sp_done``, ``sp_term`` and ``sp_gamma`` ``[B, 1]``, ``sp_valid_transitions``
    ``[n_agents, B, 1]``, ``sp_next_share_obs [B, *dim]`` (see the module docstring for what differs)."""


class OffPolicyBufferFP(_OffPolicyBuffer):
    """HARL's off-policy buffer with a feature-pruned (FP) state: a state, reward, done and term per thread and
    agent, each agent's n-step window stopping at its own ``done``. ``sample()`` returns HARL's FP shapes:
    ``sp_share_obs``, ``sp_next_share_obs`` ``[n_agents * B, *dim]`` and ``sp_reward``, ``sp_done``,
    ``sp_term``, ``sp_gamma`` ``[n_agents * B, 1]`` (agent-major), the per-agent parts as in
    :class:`OffPolicyBufferEP`."""

    per_agent_state = True
