"""PPO on rlflow: clipped surrogate, GAE with terminated and truncated kept apart.

    python -m baselines.ppo                                  # CartPole-v1, 8 envs, 100k env steps
    python -m baselines.ppo --lstm 64 --value-norm           # an LSTM actor and critic, normalised values
    python -m baselines.ppo --env-id Pendulum-v1 --num-envs 4 --n-steps 1024 --gamma 0.9 --gae-lambda 0.95 \
        --n-epochs 10 --minibatch-size 64 --no-anneal --total-steps 200000    # continuous actions

Discrete action spaces get a categorical policy; Box action spaces a diagonal Gaussian (state-dependent
mean, state-independent log standard deviations), whose actions the env clips to its bounds
(``gymnasium.wrappers.ClipAction``) while the rollout keeps them as sampled, so that their
log-probabilities stay those of the policy.

rlflow does the data: a vector env, a ``Sequence`` adder writing each lane's rollout of ``n_steps``
actions as one item of ``n_steps + 1`` rows (the last row is the bootstrap observation and the next
rollout's first row; rollouts run on across episode ends, whose final-observation rows they include), a
FIFO queue table from which the learner takes ``num_envs`` rollouts at a time, and the loop. This file
is the algorithm: the actor-critic network, GAE on the rollouts (``rlflow.returns.gae``) and the PPO
epochs. Hyperparameters default to RL Baselines3 Zoo's CartPole-v1 PPO (8 envs, 32 steps, gamma 0.98,
lambda 0.8, 20 epochs of one 256-step minibatch, learning rate and clip range falling linearly from
1e-3 and 0.2 to 0, no entropy bonus).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.wrappers import ClipAction
from torch import nn

import rlflow
from baselines import (
    ActorArgs,
    ActorParts,
    RunArgs,
    VideoArgs,
    is_atari,
    make_env,
    make_eval_env,
    policy_network,
    rollout_queue,
    to_device,
    torch_device,
    train,
)
from baselines._nets import NatureCNN, categorical, device_of, mlp, ppo_terms, time_major, torso
from baselines._presets import parse
from rlflow import specs
from rlflow.minibatches import chunk_resets, feedforward_batches, recurrent_chunks, take
from rlflow.returns import ValueNormalizer, gae


@dataclass
class Args(RunArgs, ActorArgs, VideoArgs):
    env_id: str = "CartPole-v1"  # a Gymnasium env with discrete or Box actions
    total_steps: int = 100_000  # env steps of the run, over all envs (and actors)
    num_envs: int = 8  # envs in the vector env (with --num-actors: per actor); each update takes a rollout of each
    async_envs: bool = False  # step each env in a process of its own (gymnasium's AsyncVectorEnv): for slow envs
    n_steps: int = 32  # actions per lane per rollout
    learning_rate: float = 1e-3  # falls linearly to 0 over the run (unless --no-anneal)
    gamma: float = 0.98  # discount per env step
    gae_lambda: float = 0.8  # GAE's lambda (0: one-step TD advantages, 1: Monte Carlo ones)
    n_epochs: int = 20  # passes over each update's rollouts
    minibatch_size: int = 256  # env steps per minibatch (with --lstm: about, in whole chunks)
    clip_range: float = 0.2  # falls linearly to 0 over the run (unless --no-anneal)
    anneal: bool = True  # the learning rate and the clip range fall linearly to 0 over the run's updates
    ent_coef: float = 0.0  # weight of the entropy bonus in the loss
    clip_rewards: bool = False  # the loss sees each reward's sign (Atari's presets); logs the game's
    vf_coef: float = 0.5  # weight of the value loss in the loss
    max_grad_norm: float = 0.5  # the gradient's norm is clipped to this at every minibatch step
    hidden: tuple[int, ...] = (64, 64)  # sizes of the hidden layers of the policy MLP and of the value MLP
    value_norm: bool = False  # train the critic on normalised returns (rlflow.returns.ValueNormalizer)
    normalize_obs: bool = False  # the networks see observations standardised by running statistics (SB3's VecNormalize)
    normalize_reward: bool = False  # the learner scales rewards by a running std of discounted returns (VecNormalize)
    lstm: int = 0  # > 0: an LSTM of this size in front of the policy head and one in front of the value head
    chunk_length: int = 8  # steps per recurrent training chunk (with --lstm)
    eval_every: int = 20_000  # env steps between evaluations (0: only at the end)
    logdir: str = "runs/ppo"  # directory of the run's logs, checkpoints, saved learners and learning curve

    @property
    def batch_size(self) -> int:  # rollouts per learner step: one per lane (of every actor)
        return self.num_envs * max(1, self.num_actors)


class DiagGaussian(torch.distributions.Normal):
    """Independent Gaussians over the dimensions of an action vector: log-probabilities and entropies are
    summed over the last axis (one number per action, as a Categorical's); ``mode`` is the mean."""

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return super().log_prob(value).sum(-1)

    def entropy(self) -> torch.Tensor:
        return super().entropy().sum(-1)


CLIP = 10.0  # normalised observations and scaled rewards are clipped to +- this (SB3's VecNormalize default)


class ObsNorm(nn.Module):
    """``clip((obs - mean) / std, -10, 10)`` with ``mean`` and ``std`` as buffers (they travel with the network's
    state and its parameters to actor processes); the identity until :meth:`set` gives statistics."""

    def __init__(self, obs_dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(obs_dim))
        self.register_buffer("std", torch.ones(obs_dim))

    def set(self, stats: ValueNormalizer) -> None:
        """Take the running statistics of ``stats`` (its mean and floored variance)."""
        self.mean.copy_(torch.as_tensor(stats.mean))
        self.std.copy_(torch.as_tensor(np.sqrt(stats.var)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs - self.mean) / self.std).clamp(-CLIP, CLIP)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs, as SB3's default for PPO; with ``lstm > 0`` an LSTM cell in front of
    each (SB3's RecurrentPPO layout: one LSTM for the actor, one for the critic). Frame stacks (observations
    ``[k, 84, 84]``) first go through a torso both share, as SB3's and CleanRL's Atari PPO: the Nature DQN's
    convolutions and a layer of 512 ReLUs, orthogonally initialised (gain sqrt(2); the policy head's last
    layer 0.01, the value head's 1).

    Discrete actions: the policy head gives ``n_actions`` logits. ``continuous``: it gives the mean of an
    ``n_actions``-dimensional Gaussian whose log standard deviations are parameters of their own,
    independent of the state and starting at 0 (SB3's default). ``normalize_obs``: both see the observation
    through an :class:`ObsNorm` first.
    """

    def __init__(self, obs_shape: int | tuple[int, ...], n_actions: int, hidden: tuple[int, ...], lstm: int = 0,
                 continuous: bool = False, normalize_obs: bool = False) -> None:
        super().__init__()
        cnn, size = torso(obs_shape)
        pixels = isinstance(cnn, NatureCNN)
        if pixels and normalize_obs:
            raise ValueError("--normalize-obs standardises flat observations; frame stacks are scaled to [0, 1] by "
                             "the network: run without it")
        self.torso = nn.Sequential(cnn, nn.Linear(size, 512), nn.ReLU()) if pixels else None
        obs_dim = 512 if pixels else size
        self.obs_norm = ObsNorm(obs_dim) if normalize_obs else None
        self.lstm = lstm
        if lstm:
            self.pi_lstm = nn.LSTMCell(obs_dim, lstm)
            self.v_lstm = nn.LSTMCell(obs_dim, lstm)
        width = lstm or obs_dim
        self.pi = mlp([width, *hidden, n_actions])
        self.v = mlp([width, *hidden, 1])
        self.log_std = nn.Parameter(torch.zeros(n_actions)) if continuous else None
        if pixels:
            for module in self.modules():
                if isinstance(module, nn.Conv2d | nn.Linear):
                    nn.init.orthogonal_(module.weight, np.sqrt(2))
                    nn.init.zeros_(module.bias)
            nn.init.orthogonal_(self.pi[-1].weight, 0.01)
            nn.init.orthogonal_(self.v[-1].weight, 1.0)

    def distribution(self, head: torch.Tensor) -> Any:
        """The action distribution of the policy head's output ``head [..., n_actions]``."""
        if self.log_std is None:
            return categorical(head)
        return DiagGaussian(head, self.log_std.exp().expand_as(head), validate_args=False)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations ``[N, ...]`` as the flat float inputs ``[N, obs_dim]`` of the networks (normalised with
        ``normalize_obs``)."""
        if self.torso is not None:
            return self.torso(obs)
        x = obs.flatten(1).float()
        return x if self.obs_norm is None else self.obs_norm(x)

    def forward(self, obs: torch.Tensor) -> tuple[Any, torch.Tensor]:
        x = self.features(obs)
        return self.distribution(self.pi(x)), self.v(x).squeeze(-1)

    def step(self, obs: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[Any, torch.Tensor, tuple]:
        """One recurrent step: ``state = (h_pi, c_pi, h_v, c_v)``, each ``[N, lstm]``."""
        head, value, state = self._step(obs, state)
        return self.distribution(head), value, state

    def _step(self, obs: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        x = self.features(obs)
        h_pi, c_pi = self.pi_lstm(x, (state[0], state[1]))
        h_v, c_v = self.v_lstm(x, (state[2], state[3]))
        return self.pi(h_pi), self.v(h_v).squeeze(-1), (h_pi, c_pi, h_v, c_v)

    def unroll(self, obs: torch.Tensor, state: tuple[torch.Tensor, ...], resets: torch.Tensor
               ) -> tuple[Any, torch.Tensor]:
        """Sequences ``obs [B, L, ...]`` from ``state``, restarting at zero where ``resets [B, L]``:
        the action distributions ``[B, L]`` and values ``[B, L]``."""
        heads = []
        values = []
        for t in range(resets.shape[1]):
            keep = (~resets[:, t]).float()[:, None]
            head, v, state = self._step(obs[:, t], tuple(x * keep for x in state))
            heads.append(head)
            values.append(v)
        return self.distribution(torch.stack(heads, 1)), torch.stack(values, 1)


def rollout_targets(values: torch.Tensor, rows: dict, mask: Any, gamma: float,
                    lam: float) -> dict[str, torch.Tensor]:
    """Per step of ``E`` rollouts of ``T + 1`` rows: which steps are actions, their advantages and returns.

    ``values [E, T + 1]`` is ``V`` of every row (``rows`` and ``mask [E, T + 1]``: numpy arrays, or tensors on
    the device of ``values``). Step ``t`` (rows ``0 .. T - 1``) is an action unless row
    ``t`` is a final-observation row (``last``) or padding. Its next value is ``V(row t + 1)``: within an
    episode that row is the next observation, and after a truncation it is the true final observation;
    after a termination GAE uses 0. Steps that are not actions get reward 0 and cut the recursion.
    Returns time-major ``[T, E]`` tensors.
    """
    valid = torch.as_tensor(~rows["last"][:, :-1] & mask[:, :-1] & mask[:, 1:])
    reward = torch.where(valid, torch.as_tensor(rows["reward"][:, :-1]), 0.0)
    terminated = torch.as_tensor(rows["terminated"][:, :-1]) & valid
    truncated = torch.as_tensor(rows["truncated"][:, :-1]) | ~valid
    adv, ret = gae(reward.T, values[:, :-1].T, values[:, 1:].T, terminated.T, truncated.T, gamma, lam)
    return {"valid": valid.T, "advantages": adv, "returns": ret}


def scale_rewards(reward: np.ndarray, acted: np.ndarray, ended: np.ndarray, carry: np.ndarray,
                  stats: ValueNormalizer, gamma: float) -> np.ndarray:
    """SB3's VecNormalize reward scaling, on ``E`` rollouts of ``T`` steps (``reward [E, T + 1]`` as stored,
    ``acted`` and ``ended`` ``[E, T]``): each lane's running discounted return ``carry[e] = gamma * carry[e] +
    r`` over its action steps in time order, set to 0 after a step that ends an episode (terminated or
    truncated); ``stats`` takes every return of the rollouts, then every reward is divided by the returns'
    standard deviation and clipped to +-10. ``carry [E]`` holds the lanes' returns from one call to the next
    (updated in place). Returns the scaled ``[E, T + 1]`` rewards in ``reward``'s dtype."""
    returns = np.zeros(acted.shape)
    for t in range(acted.shape[1]):
        a = acted[:, t]
        carry[a] = carry[a] * gamma + reward[a, t]
        returns[a, t] = carry[a]
        carry[a & ended[:, t]] = 0.0
    stats.update(returns[acted])
    return np.clip(reward / np.sqrt(stats.var), -CLIP, CLIP).astype(reward.dtype)


def ppo_loss(net: ActorCritic, obs: torch.Tensor, actions: torch.Tensor, old_log_prob: torch.Tensor,
             advantages: torch.Tensor, returns: torch.Tensor, clip: float, ent_coef: float,
             vf_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's objective (``baselines/_nets.py``'s :func:`ppo_terms`) of the feed-forward network on a minibatch
    of steps."""
    dist, value = net(obs)
    return ppo_terms(dist, value, actions, old_log_prob, advantages, returns, clip, ent_coef, vf_coef)


class PPOLearner(rlflow.Learner):
    """PPO on the device of ``net``, where each update's rollouts are copied."""

    def __init__(self, net: ActorCritic, args: Args) -> None:
        self.net = net
        self.args = args
        self.device = device_of(net)
        self.optimizer = torch.optim.Adam(net.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
        self.updates = 0
        self.total_updates = max(1, args.total_steps // (args.batch_size * args.n_steps))
        self.rng = np.random.default_rng(args.seed)
        self.norm = ValueNormalizer() if args.value_norm else None
        # --normalize-obs: the statistics of every observation acted on (exact, SB3's epsilon as the floor)
        self.obs_stats = ValueNormalizer(net.obs_norm.mean.shape[0], beta=None, min_var=1e-8) \
            if net.obs_norm is not None else None
        # --normalize-reward: the statistics of the lanes' running discounted returns, and those returns
        self.return_stats = ValueNormalizer((), beta=None, min_var=1e-8) if args.normalize_reward else None
        self.return_carry = np.zeros(args.batch_size)

    def step(self, sample):
        rows = sample.data
        # A rollout with an action of parameters two or more updates old (one restored from a checkpoint, or
        # from an actor that started on older parameters) is dropped, and counted. One update old is what a
        # rollout's first action is: it completes the rollout before, whose update comes after it.
        acted = ~rows["last"][:, :-1] & sample.mask[:, :-1]
        if self.args.clip_rewards:
            rows = {**rows, "reward": np.sign(rows["reward"])}
        if self.return_stats is not None:  # every rollout's rewards go into its lane's return, stale or not
            carry = self.return_carry[sample.lanes]
            ended = (rows["terminated"][:, :-1] | rows["truncated"][:, :-1]) & acted
            rows = {**rows, "reward": scale_rewards(rows["reward"], acted, ended, carry, self.return_stats,
                                                    self.args.gamma)}
            self.return_carry[sample.lanes] = carry
        stale = ((rows["extras"]["version"][:, :-1] < self.updates - 1) & acted).any(axis=1)
        if stale.all():
            return {"stale_rollouts": float(stale.sum()), "steps": 0.0}
        mask = sample.mask & ~stale[:, None]
        raw_obs = rows["observation"][:, :-1][acted & ~stale[:, None]]  # the observations acted on, for the stats
        rows, mask = to_device((rows, mask), self.device)  # the rollouts as tensors on the learner's device
        obs = rows["observation"]
        e, t1 = mask.shape
        with torch.no_grad():
            if self.net.lstm:  # V of every row, the LSTM run from the state stored at the rollout's first row
                state0 = tuple(rows["extras"]["lstm"][:, 0, i] for i in range(4))
                _, values = self.net.unroll(obs, state0, rows["first"])
            else:
                values = self.net(obs.reshape(e * t1, *obs.shape[2:]))[1].reshape(e, t1)
            if self.norm is not None:
                values = self.norm.denormalize(values)
        targets = rollout_targets(values, rows, mask, self.args.gamma, self.args.gae_lambda)
        returns = targets["returns"].float()
        if self.norm is not None:
            self.norm.update(returns[targets["valid"]])
            returns = self.norm.normalize(returns)
        # linear schedules, as the zoo's for CartPole (constant with --no-anneal)
        left = max(0.0, 1.0 - self.updates / self.total_updates) if self.args.anneal else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.args.learning_rate * left
        clip = self.args.clip_range * left
        # the rollouts' action rows, time-major [T, E, ...]
        obs_t = time_major(rows["observation"])
        actions_t = time_major(rows["action"])
        old_log_prob_t = time_major(rows["extras"]["log_prob"])
        advantages = targets["advantages"].float()
        t, e = targets["valid"].shape
        if self.net.lstm:
            stored = time_major(rows["extras"]["lstm"])  # [T, E, 4, lstm]: the state each step started from
            first = time_major(rows["first"])
            # minibatches of about minibatch_size steps, each of one chunk at least
            chunks = e * ((t + self.args.chunk_length - 1) // self.args.chunk_length)
            num_minibatches = max(1, min(chunks, t * e // self.args.minibatch_size))
        metrics: dict[str, float] = {}
        valid = targets["valid"].cpu().numpy()  # the feed-forward minibatches' step mask, read once
        for _ in range(self.args.n_epochs):
            if self.net.lstm:  # chunks of chunk_length steps of one lane, from the stored states
                for c in recurrent_chunks(t, e, self.args.chunk_length, num_minibatches, rng=self.rng):
                    start = take(stored, c.start)  # [M, 4, lstm]
                    dist, value = self.net.unroll(take(obs_t, c.index), tuple(start[:, i] for i in range(4)),
                                                  chunk_resets(first, c))
                    loss, metrics = ppo_terms(dist, value, take(actions_t, c.index), take(old_log_prob_t, c.index),
                                              take(advantages, c.index), take(returns, c.index), clip,
                                              self.args.ent_coef, self.args.vf_coef,
                                              mask=take(targets["valid"], c.index) & to_device(c.mask, self.device))
                    self._apply(loss)
                continue
            rollout = (obs_t, actions_t, old_log_prob_t, advantages, returns)
            for mb_obs, mb_actions, mb_log_prob, mb_advantages, mb_returns in feedforward_batches(
                    rollout, t, e, minibatch_size=self.args.minibatch_size, rng=self.rng, mask=valid):
                loss, metrics = ppo_loss(self.net, mb_obs, mb_actions, mb_log_prob, mb_advantages, mb_returns, clip,
                                         self.args.ent_coef, self.args.vf_coef)
                self._apply(loss)
        if self.obs_stats is not None:  # after the epochs: they saw the statistics the rollouts were acted with
            self.obs_stats.update(raw_obs.reshape(len(raw_obs), -1))
            self.net.obs_norm.set(self.obs_stats)
        self.updates += 1
        return {**metrics, "steps": float(targets["valid"].sum()), "stale_rollouts": float(stale.sum())}

    def _apply(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), self.args.max_grad_norm)
        self.optimizer.step()

    def get_params(self):
        # the network (itself, or a CPU copy for actor processes when it is on a GPU) and its version (the updates
        # made), which the policy stores with each action
        return {"net": policy_network(self.net, self.args.num_actors), "version": self.updates}

    def state_dict(self):
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "rng": self.rng.bit_generator.state, "norm": self.norm.state_dict() if self.norm is not None else None,
                "obs_stats": None if self.obs_stats is None else self.obs_stats.state_dict(),
                "return_stats": None if self.return_stats is None else self.return_stats.state_dict(),
                "return_carry": self.return_carry.copy()}

    def load_state_dict(self, state):
        for name, flag in (("obs_stats", "--normalize-obs"), ("return_stats", "--normalize-reward")):
            if (getattr(self, name) is None) != (state.get(name) is None):
                raise ValueError(f"{flag}: the saved learner was trained {'with' if state.get(name) else 'without'} "
                                 f"it; run with the saved run's flags")
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        self.rng.bit_generator.state = state["rng"]
        if self.norm is not None:
            self.norm.load_state_dict(state["norm"])
        for name in ("obs_stats", "return_stats"):  # the network's ObsNorm buffers came with state["net"]
            if getattr(self, name) is not None:
                getattr(self, name).load_state_dict(state[name])
        self.return_carry[:] = state["return_carry"]


class SamplingPolicy(rlflow.Policy):
    """Samples from the policy head and stores each action's log-probability and value as extras, with the
    version of the parameters that chose it (and, with an LSTM, the state the step started from, where the
    learner's chunks start)."""

    def __init__(self, net: ActorCritic) -> None:
        self.net = net
        self.version = 0

    def initial_state(self, batch_size):  # on the network's device, where the state stays between steps
        if not self.net.lstm:
            return None
        return tuple(torch.zeros(batch_size, self.net.lstm, device=device_of(self.net)) for _ in range(4))

    def act(self, observation, state, *, evaluation=False):
        obs = torch.as_tensor(observation, device=device_of(self.net))  # to the network's device; results back
        with torch.inference_mode():
            if self.net.lstm:
                dist, value, new_state = self.net.step(obs, state)
            else:
                dist, value = self.net(obs)
            action = dist.mode if evaluation else dist.sample()  # the likeliest action, or the mean
            extras = {"log_prob": dist.log_prob(action).cpu().numpy(), "value": value.cpu().numpy(),
                      "version": np.full(len(observation), self.version, np.int64)}
        if self.net.lstm:
            extras["lstm"] = torch.stack(state, 1).cpu().numpy()  # [E, 4, lstm]
            state = new_state
        return action.cpu().numpy(), extras, state

    def set_params(self, params):
        self.net = params["net"]  # the learner's network itself (one process: no copy, no lag)
        self.version = params["version"]

    def state_dict(self):
        return {"torch_rng": torch.get_rng_state()}


def main(args: Args) -> rlflow.RunResult:
    device = torch_device(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    # Box actions (never an Atari game's): the env clips the Gaussian's actions to its bounds; the rollout keeps
    # them as sampled
    action_space = None
    if not is_atari(args.env_id):
        probe = gymnasium.make(args.env_id)
        action_space = probe.action_space
        probe.close()
    continuous = isinstance(action_space, gymnasium.spaces.Box)
    clip = [ClipAction] if continuous else []
    vectorization = {"vectorization_mode": "async"} if args.async_envs else {}
    env = make_env(args.env_id, args.num_envs, args.seed, **vectorization, **({"wrappers": clip} if clip else {}))
    eval_env = make_eval_env(args, *clip)
    n_actions = int(np.prod(env.single_action_space.shape)) if continuous else int(env.single_action_space.n)
    obs_shape = env.single_observation_space.shape

    # Rollouts of n_steps + 1 rows per lane in a queue the learner empties a rollout of every lane at a time.
    extras = {"log_prob": specs.Field((), np.float32), "value": specs.Field((), np.float32),
              "version": specs.Field((), np.int64)}
    if args.lstm:  # the LSTM states (h, c of the actor's and the critic's) each step started from
        extras["lstm"] = specs.Field((4, args.lstm), np.float32)
    _, table, adder = rollout_queue(env.step_spec(extras), args.num_envs, args.n_steps, args.num_actors)

    net = ActorCritic(obs_shape, n_actions, args.hidden, args.lstm, continuous, args.normalize_obs).to(device)
    policy, learner = SamplingPolicy(net), PPOLearner(net, args)
    if not args.num_actors:
        return train("PPO", args, env, eval_env, policy, learner, adder, table)

    # Synchronous rollouts: actor processes with their own envs (one row per lane per step: NEXT_STEP resets)
    # and networks on the CPU, each update waiting for a rollout of every lane acted by the parameters it updates.
    parts = ActorParts(args, args.num_envs, lambda a, i: SamplingPolicy(
        ActorCritic(obs_shape, n_actions, a.hidden, a.lstm, continuous, a.normalize_obs)), autoreset_mode="next_step",
        **vectorization, **({"wrappers": [ClipAction]} if continuous else {}))
    return train("PPO", args, env, eval_env, policy, learner, adder, table, actors=(parts.env, parts.policy),
                 on_policy=True)


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> Args:
    """PPO's settings from the command line ``argv`` (default: the process's), on top of the preset of the
    env ``--env-id`` names (``baselines/presets/ppo.yaml``) or of a run's ``--config``."""
    return parse(Args, "ppo", argv, prog=prog,
                 hint="--num-envs, --n-steps, --minibatch-size, --n-epochs, --gamma, --gae-lambda, --learning-rate, "
                      "--ent-coef, --total-steps")


if __name__ == "__main__":
    main(parse_args())
