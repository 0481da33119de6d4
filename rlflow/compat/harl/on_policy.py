"""HARL's on-policy buffers (``harl.common.buffers.on_policy_*``): its arrays and calls, on rlflow's returns and
minibatches.

HARL keeps an on-policy rollout in arrays ``[episode_length (+ 1), n_rollout_threads, ...]`` that its
runners read and write directly (``actor_buffer[i].obs[0] = ...``), so these classes keep HARL's arrays
as attributes, with HARL's names, shapes and dtypes. One :class:`OnPolicyActorBuffer` per agent (each
with its own observation and action space), and one critic buffer: :class:`OnPolicyCriticBufferEP` (one
state per thread) or :class:`OnPolicyCriticBufferFP` (one per thread and agent).

- ``insert`` writes step ``step`` as HARL does (observations, masks and RNN states at ``step + 1``) and
  checks every part's shape first (HARL broadcasts); ``after_update`` carries the last step over.
- ``compute_returns(next_value, value_normalizer)`` gives HARL's returns in all four of its cases
  (``use_gae`` x ``use_proper_time_limits``), through :func:`rlflow.returns.gae`: a step whose
  ``bad_masks`` says truncation gets advantage 0 and return ``V(s_t)`` (HARL keeps no final observation to
  bootstrap from), a ``masks`` of 0 ends the episode; without ``use_proper_time_limits`` every end is a
  termination. A value normaliser (:class:`rlflow.returns.ValueNormalizer`, or HARL's ``ValueNorm``:
  anything with ``denormalize``) denormalises the values where HARL does.
- The generators yield HARL's tuples and shapes, their indices drawn by :mod:`rlflow.minibatches` from a
  seeded numpy generator (``seed=``; HARL draws with ``torch.randperm``): the feed-forward one shuffles
  single steps; the naive recurrent one whole threads (``[T * N, ...]``, time-major, with each thread's
  first RNN state); the chunked one chunks of ``data_chunk_length`` steps of one thread (``[L * N, ...]``,
  time-major, with each chunk's first RNN state). Minibatches hold ``batch // num_mini_batch`` steps,
  threads or chunks each, the rest left out, as HARL's; an FP critic's threads and agents are its lanes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any

import numpy as np

from rlflow import minibatches, returns
from rlflow.compat.harl.shapes import act_dim, obs_shape

__all__ = ["OnPolicyActorBuffer", "OnPolicyCriticBufferEP", "OnPolicyCriticBufferFP"]

_f32 = np.float32


def _args(args: Mapping[str, Any], keys: tuple[str, ...], who: str) -> None:
    missing = [k for k in keys if k not in args]
    if missing:
        raise ValueError(f"{who} args: expected the keys {list(keys)}; missing {missing}")


def _write(parts: list[tuple[np.ndarray, int, Any, str]]) -> None:
    """``array[index] = value`` for each part, after checking every value's shape (HARL would broadcast): a
    part of the wrong shape raises a ``ValueError`` naming it, and nothing is written."""
    for array, _, value, name in parts:
        if np.shape(value) != array.shape[1:]:
            raise ValueError(f"{name}: expected shape {array.shape[1:]}, got {np.shape(value)}")
    for array, index, value, _ in parts:
        array[index] = np.asarray(value)


class _Rollout:
    """The generators HARL's buffers share, over arrays ``[T (+ 1), lanes, ...]``."""

    episode_length: int
    _rng: np.random.Generator

    def _batches(self, kind: str, lanes: int, parts: dict[str, np.ndarray | None], rnn: np.ndarray,
                 num_mini_batch: int | None, mini_batch_size: int | None = None,
                 chunk: int | None = None) -> Iterator[tuple[dict[str, np.ndarray | None], np.ndarray]]:
        """Minibatches of ``parts`` (each ``[T (+ 1), lanes, ...]``; None stays None) and their RNN states."""
        T = self.episode_length
        if kind == "feed_forward":
            total = T * lanes
            if mini_batch_size is None:
                if num_mini_batch is None or not 1 <= num_mini_batch <= total:
                    raise ValueError(f"num_mini_batch: expected 1 to {total} (steps x lanes), got {num_mini_batch}")
                mini_batch_size = total // num_mini_batch
            elif num_mini_batch is None:  # as many full minibatches as fit
                num_mini_batch = total // mini_batch_size
            batches = minibatches.feedforward_batches((parts, rnn), T, lanes, minibatch_size=mini_batch_size,
                                                      rng=self._rng)
            yield from islice(batches, num_mini_batch)
        elif kind == "naive":
            if num_mini_batch is None or not 1 <= num_mini_batch <= lanes:
                raise ValueError(f"num_mini_batch: expected 1 to the {lanes} lanes, got {num_mini_batch}")
            per = lanes // num_mini_batch
            order = self._rng.permutation(lanes)
            for i in range(num_mini_batch):
                e = order[i * per:(i + 1) * per]
                yield ({k: None if v is None else v[:T, e].reshape(T * per, *v.shape[2:]) for k, v in parts.items()},
                       rnn[0, e])
        else:
            if chunk is None or T % chunk:
                raise ValueError(f"data_chunk_length: expected a divisor of episode_length {T}, got {chunk}")
            chunks = lanes * (T // chunk)
            if chunks < 2 or num_mini_batch is None or not 1 <= num_mini_batch <= chunks:
                raise ValueError(f"num_mini_batch: expected 1 to the {chunks} chunks (at least 2), "
                                 f"got {num_mini_batch}")
            per = chunks // num_mini_batch
            order = self._rng.permutation(chunks)
            for i in range(num_mini_batch):
                c = order[i * per:(i + 1) * per]
                t0, e0 = (c % (T // chunk)) * chunk, c // (T // chunk)
                t = t0[None, :] + np.arange(chunk)[:, None]  # [L, N]: time-major, as HARL flattens
                e = np.broadcast_to(e0, t.shape)
                yield ({k: None if v is None else v[t, e].reshape(chunk * per, *v.shape[2:])
                        for k, v in parts.items()}, rnn[t0, e0])


class OnPolicyActorBuffer(_Rollout):
    """One agent's rollout, HARL's ``OnPolicyActorBuffer`` (see the module docstring).

    Arrays (float32): ``obs [T + 1, n, *obs_shape]``, ``rnn_states [T + 1, n, recurrent_n, hidden]``,
    ``available_actions [T + 1, n, n_actions]`` (Discrete spaces; else None), ``actions`` and
    ``action_log_probs [T, n, act_dim]``, ``masks`` and ``active_masks [T + 1, n, 1]``; ``factor``
    (HAPPO's, set by :meth:`update_factor`) or None; ``step``.
    """

    def __init__(self, args: Mapping[str, Any], obs_space: Any, act_space: Any, *, seed: int | None = None) -> None:
        _args(args, ("episode_length", "n_rollout_threads", "hidden_sizes", "recurrent_n"), "OnPolicyActorBuffer")
        T, n = self.episode_length, self.n_rollout_threads = int(args["episode_length"]), int(args["n_rollout_threads"])
        self.hidden_sizes = list(args["hidden_sizes"])
        self.rnn_hidden_size = int(self.hidden_sizes[-1])
        self.recurrent_n = int(args["recurrent_n"])
        self.obs = np.zeros((T + 1, n, *obs_shape(obs_space)), _f32)
        self.rnn_states = np.zeros((T + 1, n, self.recurrent_n, self.rnn_hidden_size), _f32)
        discrete = type(act_space).__name__ == "Discrete"
        self.available_actions = np.ones((T + 1, n, int(act_space.n)), _f32) if discrete else None
        width = act_dim(act_space)
        self.actions = np.zeros((T, n, width), _f32)
        self.action_log_probs = np.zeros((T, n, width), _f32)
        self.masks = np.ones((T + 1, n, 1), _f32)
        self.active_masks = np.ones_like(self.masks)
        self.factor: np.ndarray | None = None
        self.step = 0
        self._rng = np.random.default_rng(seed)

    def update_factor(self, factor: Any) -> None:
        """Keep HAPPO's factor ``[T, n, 1]`` for the generators."""
        self.factor = np.array(factor, copy=True)

    def insert(self, obs: Any, rnn_states: Any, actions: Any, action_log_probs: Any, masks: Any,
               active_masks: Any = None, available_actions: Any = None) -> None:
        """Write step ``step`` (its outcome at ``step + 1``) and advance; a part of the wrong shape raises a
        ``ValueError`` naming it, before anything is written."""
        s = self.step
        checks = [(self.obs, s + 1, obs, "obs"), (self.rnn_states, s + 1, rnn_states, "rnn_states"),
                  (self.actions, s, actions, "actions"),
                  (self.action_log_probs, s, action_log_probs, "action_log_probs"), (self.masks, s + 1, masks, "masks")]
        if active_masks is not None:
            checks.append((self.active_masks, s + 1, active_masks, "active_masks"))
        if available_actions is not None:
            if self.available_actions is None:
                raise ValueError("available_actions: this agent's action space is not Discrete; expected None")
            checks.append((self.available_actions, s + 1, available_actions, "available_actions"))
        _write(checks)
        self.step = (s + 1) % self.episode_length

    def after_update(self) -> None:
        """Carry the last step's observation, RNN state and masks over to step 0."""
        for array in (self.obs, self.rnn_states, self.masks, self.active_masks, self.available_actions):
            if array is not None:
                array[0] = array[-1]

    def _parts(self, advantages: Any) -> dict[str, np.ndarray | None]:
        adv = None if advantages is None else np.asarray(advantages, _f32)
        if adv is not None and adv.shape[:2] != (self.episode_length, self.n_rollout_threads):
            raise ValueError(f"advantages: expected shape ({self.episode_length}, {self.n_rollout_threads}, 1), got "
                             f"{adv.shape}")
        return {"obs": self.obs, "actions": self.actions, "masks": self.masks, "active_masks": self.active_masks,
                "action_log_probs": self.action_log_probs, "advantages": adv,
                "available_actions": self.available_actions, "factor": self.factor}

    def _yield(self, batches: Iterator[tuple[dict[str, Any], np.ndarray]]) -> Iterator[tuple]:
        for b, rnn in batches:
            out = (b["obs"], rnn, b["actions"], b["masks"], b["active_masks"], b["action_log_probs"], b["advantages"],
                   b["available_actions"])
            yield out if self.factor is None else (*out, b["factor"])

    def feed_forward_generator_actor(self, advantages: Any, actor_num_mini_batch: int | None = None,
                                     mini_batch_size: int | None = None) -> Iterator[tuple]:
        """Shuffled single steps: ``(obs, rnn_states, actions, masks, active_masks, old_action_log_probs,
        adv_targ, available_actions[, factor])``, each ``[mini_batch_size, ...]``."""
        parts = self._parts(advantages)
        return self._yield(self._batches("feed_forward", self.n_rollout_threads, parts, self.rnn_states,
                                         actor_num_mini_batch, mini_batch_size))

    def naive_recurrent_generator_actor(self, advantages: Any, actor_num_mini_batch: int) -> Iterator[tuple]:
        """Whole threads: the tuple of :meth:`feed_forward_generator_actor`, each ``[T * N, ...]`` time-major,
        ``rnn_states [N, recurrent_n, hidden]`` (each thread's first)."""
        parts = self._parts(advantages)
        return self._yield(self._batches("naive", self.n_rollout_threads, parts, self.rnn_states,
                                         actor_num_mini_batch))

    def recurrent_generator_actor(self, advantages: Any, actor_num_mini_batch: int,
                                  data_chunk_length: int) -> Iterator[tuple]:
        """Chunks of ``L = data_chunk_length`` steps: the tuple of :meth:`feed_forward_generator_actor`, each
        ``[L * N, ...]`` time-major, ``rnn_states [N, recurrent_n, hidden]`` (each chunk's first)."""
        parts = self._parts(advantages)
        return self._yield(self._batches("chunks", self.n_rollout_threads, parts, self.rnn_states,
                                         actor_num_mini_batch, chunk=data_chunk_length))


class OnPolicyCriticBufferEP(_Rollout):
    """The critic's rollout with an environment-provided (EP) state, HARL's ``OnPolicyCriticBufferEP``.

    Arrays (float32): ``share_obs [T + 1, n, *dim]``, ``rnn_states_critic [T + 1, n, recurrent_n, hidden]``,
    ``value_preds`` and ``returns [T + 1, n, 1]``, ``rewards [T, n, 1]``, ``masks`` and ``bad_masks
    [T + 1, n, 1]`` (``masks[t + 1] = 0``: the episode ended after step ``t``; ``bad_masks[t + 1] = 0``: by
    truncation); ``step``.
    """

    agent_axis = False  # FP: an agent axis after the threads

    def __init__(self, args: Mapping[str, Any], share_obs_space: Any, num_agents: int | None = None, *,
                 seed: int | None = None) -> None:
        keys = ("episode_length", "n_rollout_threads", "hidden_sizes", "recurrent_n", "gamma", "gae_lambda",
                "use_gae", "use_proper_time_limits")
        _args(args, keys, type(self).__name__)
        T, n = self.episode_length, self.n_rollout_threads = int(args["episode_length"]), int(args["n_rollout_threads"])
        self.hidden_sizes = list(args["hidden_sizes"])
        self.rnn_hidden_size = int(self.hidden_sizes[-1])
        self.recurrent_n = int(args["recurrent_n"])
        self.gamma, self.gae_lambda = float(args["gamma"]), float(args["gae_lambda"])
        self.use_gae, self.use_proper_time_limits = bool(args["use_gae"]), bool(args["use_proper_time_limits"])
        lanes = (n, int(num_agents)) if self.agent_axis and num_agents is not None else (n,)
        if self.agent_axis and num_agents is None:
            raise ValueError("OnPolicyCriticBufferFP: expected num_agents")
        self.share_obs = np.zeros((T + 1, *lanes, *obs_shape(share_obs_space)), _f32)
        self.rnn_states_critic = np.zeros((T + 1, *lanes, self.recurrent_n, self.rnn_hidden_size), _f32)
        self.value_preds = np.zeros((T + 1, *lanes, 1), _f32)
        self.returns = np.zeros_like(self.value_preds)
        self.rewards = np.zeros((T, *lanes, 1), _f32)
        self.masks = np.ones((T + 1, *lanes, 1), _f32)
        self.bad_masks = np.ones_like(self.masks)
        self.step = 0
        self._rng = np.random.default_rng(seed)

    def insert(self, share_obs: Any, rnn_states_critic: Any, value_preds: Any, rewards: Any, masks: Any,
               bad_masks: Any) -> None:
        """Write step ``step`` (its outcome at ``step + 1``) and advance; a part of the wrong shape raises a
        ``ValueError`` naming it, before anything is written."""
        s = self.step
        checks = [(self.share_obs, s + 1, share_obs, "share_obs"),
                  (self.rnn_states_critic, s + 1, rnn_states_critic, "rnn_states_critic"),
                  (self.value_preds, s, value_preds, "value_preds"), (self.rewards, s, rewards, "rewards"),
                  (self.masks, s + 1, masks, "masks"), (self.bad_masks, s + 1, bad_masks, "bad_masks")]
        _write(checks)
        self.step = (s + 1) % self.episode_length

    def after_update(self) -> None:
        """Carry the last step's state, RNN state and masks over to step 0."""
        for array in (self.share_obs, self.rnn_states_critic, self.masks, self.bad_masks):
            array[0] = array[-1]

    def get_mean_rewards(self) -> float:
        """The mean reward of the rollout."""
        return float(np.mean(self.rewards))

    def compute_returns(self, next_value: Any, value_normalizer: Any = None) -> None:
        """HARL's returns into ``self.returns[:-1]`` (see the module docstring); with GAE ``value_preds[-1]``
        becomes ``next_value``, without it ``returns[-1]`` does, as HARL's."""
        nv = np.asarray(next_value, _f32)
        if nv.shape != self.value_preds.shape[1:]:
            raise ValueError(f"next_value: expected shape {self.value_preds.shape[1:]}, got {nv.shape}")
        ended = self.masks[1:] == 0  # the episode ended after step t
        cut = (self.bad_masks[1:] == 0) if self.use_proper_time_limits else np.zeros_like(ended)
        if self.use_gae:
            self.value_preds[-1] = nv
            values = self.value_preds if value_normalizer is None else np.asarray(
                value_normalizer.denormalize(self.value_preds), _f32)
            lam = self.gae_lambda
        else:  # the discounted returns: lambda 1, bootstrapped from next_value as given
            self.returns[-1] = nv
            values = self.value_preds.copy()
            if value_normalizer is not None and self.use_proper_time_limits:
                values = np.asarray(value_normalizer.denormalize(values), _f32)
            values[-1] = nv
            lam = 1.0
        v, following = values[:-1], values[1:]
        # A truncated step gets advantage 0 (return V(s_t)): its reward stands in as V(s_t) with nothing after it.
        rewards = np.where(cut, v, self.rewards)
        _, rets = returns.gae(rewards, v, following, ended | cut, np.zeros_like(ended), self.gamma, lam)
        self.returns[:-1] = rets

    def _lanes(self) -> tuple[int, dict[str, np.ndarray | None], np.ndarray]:
        """The arrays with threads (and agents) as one lane axis."""
        lanes, axes = int(np.prod(self.rewards.shape[1:-1])), self.rewards.ndim - 2  # threads (and agents)

        def flat(a: np.ndarray) -> np.ndarray:
            return a.reshape(a.shape[0], lanes, *a.shape[1 + axes:])

        parts: dict[str, np.ndarray | None] = {"share_obs": flat(self.share_obs), "value_preds": flat(self.value_preds),
                                               "returns": flat(self.returns), "masks": flat(self.masks)}
        return lanes, parts, flat(self.rnn_states_critic)

    def _yield(self, batches: Iterator[tuple[dict[str, Any], np.ndarray]]) -> Iterator[tuple]:
        for b, rnn in batches:
            yield b["share_obs"], rnn, b["value_preds"], b["returns"], b["masks"]

    def feed_forward_generator_critic(self, critic_num_mini_batch: int | None = None,
                                      mini_batch_size: int | None = None) -> Iterator[tuple]:
        """Shuffled single steps: ``(share_obs, rnn_states_critic, value_preds, returns, masks)``."""
        lanes, parts, rnn = self._lanes()
        return self._yield(self._batches("feed_forward", lanes, parts, rnn, critic_num_mini_batch, mini_batch_size))

    def naive_recurrent_generator_critic(self, critic_num_mini_batch: int) -> Iterator[tuple]:
        """Whole threads (FP: thread-agent streams), ``[T * N, ...]`` time-major, with their first RNN states."""
        lanes, parts, rnn = self._lanes()
        return self._yield(self._batches("naive", lanes, parts, rnn, critic_num_mini_batch))

    def recurrent_generator_critic(self, critic_num_mini_batch: int, data_chunk_length: int) -> Iterator[tuple]:
        """Chunks of ``L`` steps of one stream, ``[L * N, ...]`` time-major, with their first RNN states."""
        lanes, parts, rnn = self._lanes()
        return self._yield(self._batches("chunks", lanes, parts, rnn, critic_num_mini_batch,
                                         chunk=data_chunk_length))


class OnPolicyCriticBufferFP(OnPolicyCriticBufferEP):
    """The critic's rollout with a feature-pruned (FP) state, HARL's ``OnPolicyCriticBufferFP``
    ``(args, share_obs_space, num_agents)``: the arrays of :class:`OnPolicyCriticBufferEP` with an agent axis
    after the threads (``share_obs [T + 1, n, num_agents, *dim]``, ``rewards [T, n, num_agents, 1]``, ...);
    the generators treat each (thread, agent) as a stream, thread-major."""

    agent_axis = True
