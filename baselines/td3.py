"""TD3 on rlflow: twin critics, target policy smoothing, delayed actor updates.

    python -m baselines.td3                                  # Pendulum-v1, 20k env steps

rlflow does the data (env wrapper, a one-step transition adder, a uniform table under a
SampleToInsertRatio rate limiter, the loop); this file is the algorithm (the MLP and the ``Q(s, a)``
critic are ``baselines/_nets.py``'s, shared with SAC). Hyperparameters default to RL Baselines3 Zoo's
Pendulum-v1 TD3 (one gradient step of 256 per env step after 10,000 random steps,
gamma 0.98, Gaussian exploration noise of std 0.1 in action units, networks of 400 and 300 units).

With ``--num-actors N`` (``pip install "rlflow[ray]"``) N actor processes act, one env each, with their own
seeds and an N-th of the random start each, and take the learner's actor every ``--sync-period`` env steps;
the replay is in a replay server and the learner here (``rlflow.distributed``; ``--address auto`` joins a
running Ray cluster).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import rlflow
from baselines import (
    ActorArgs,
    ActorParts,
    RandomStartPolicy,
    RunArgs,
    VideoArgs,
    continuous_replay,
    policy_network,
    to_device,
    torch_device,
    train,
)
from baselines._nets import Critic, device_of, mlp
from baselines._presets import parse


@dataclass
class Args(RunArgs, ActorArgs, VideoArgs):
    env_id: str = "Pendulum-v1"  # a Gymnasium env with Box actions
    total_steps: int = 20_000  # env steps of the run (over all actors with --num-actors)
    learning_rate: float = 1e-3  # Adam's learning rate of the actor and the critics
    buffer_size: int = 200_000  # replay capacity in transitions
    batch_size: int = 256  # transitions per learner step
    gamma: float = 0.98  # discount per env step
    tau: float = 0.005  # each actor update (every policy_delay critic updates) moves the targets this far
    learning_starts: int = 10_000  # random actions (and no learning) before this many steps
    samples_per_insert: float = 256.0  # batch_size * gradient steps per env step
    train_freq: int = 0  # env steps between bursts of learner steps, as SB3 trains (0: the steps spread evenly)
    exploration_noise: float = 0.05  # Gaussian std, in units of the action range's half-width (2 on Pendulum)
    policy_noise: float = 0.2  # target policy smoothing noise, same units
    noise_clip: float = 0.5  # the target policy smoothing noise is clipped to +- this, same units
    policy_delay: int = 2  # critic updates per actor update
    hidden: tuple[int, ...] = (400, 300)  # sizes of the hidden layers of the actor and of each critic
    eval_every: int = 5_000  # env steps between evaluations (0: only at the end)
    logdir: str = "runs/td3"  # directory of the run's logs, checkpoints, saved learners and learning curve


class Actor(nn.Module):
    """A deterministic policy ``centre + half_width * tanh(mlp(s))`` inside the action box."""

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *hidden, len(low)], nn.Tanh())
        self.register_buffer("centre", torch.as_tensor((high + low) / 2, dtype=torch.float32))
        self.register_buffer("half_width", torch.as_tensor((high - low) / 2, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.centre + self.half_width * self.net(obs.float())


def critic_loss(critics: tuple[Critic, Critic], targets: tuple[Critic, Critic], actor_target: Actor,
                batch: rlflow.replay.Transition, noise: torch.Tensor) -> torch.Tensor:
    """``sum_i mean (Q_i(s, a) - y)^2`` with ``y = r + discount * min_i Q'_i(s', clip(mu'(s') + noise))``.

    ``noise`` is the clipped target-policy smoothing noise (already in action units); ``batch.discount``
    is ``gamma`` (0 after termination).
    """
    with torch.no_grad():
        low = actor_target.centre - actor_target.half_width
        high = actor_target.centre + actor_target.half_width
        next_action = torch.max(torch.min(actor_target(batch.next_observation) + noise, high), low)
        next_q = torch.min(targets[0](batch.next_observation, next_action),
                           targets[1](batch.next_observation, next_action))
        y = batch.reward + batch.discount * next_q
    return sum(F.mse_loss(q(batch.observation, batch.action), y) for q in critics)


def actor_loss(actor: Actor, critic: Critic, batch: rlflow.replay.Transition) -> torch.Tensor:
    """``-mean Q_1(s, mu(s))``."""
    return -critic(batch.observation, actor(batch.observation)).mean()


class TD3Learner(rlflow.Learner):
    """TD3 on the device of ``actor`` and ``critics``, where each sample is copied."""

    def __init__(self, actor: Actor, critics: tuple[Critic, Critic], args: Args) -> None:
        self.actor = actor
        self.critics = critics
        self.args = args
        self.device = device_of(actor)
        self.actor_target = copy.deepcopy(actor)
        self.critic_targets = tuple(copy.deepcopy(c) for c in critics)
        self.actor_opt = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
        self.critic_opt = torch.optim.Adam([p for c in critics for p in c.parameters()], lr=args.learning_rate,
                                           fused=True)
        self.steps = 0
        self.generator = torch.Generator().manual_seed(args.seed)

    def step(self, sample):
        batch = to_device(sample.data, self.device)
        half = self.actor.half_width
        # the noise drawn on the CPU (a generator whose state loads on any machine), then moved to the device
        noise = torch.randn(batch.action.shape, generator=self.generator).to(self.device)
        noise = noise * self.args.policy_noise * half
        noise = torch.max(torch.min(noise, self.args.noise_clip * half), -self.args.noise_clip * half)
        loss = critic_loss(self.critics, self.critic_targets, self.actor_target, batch, noise)
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        metrics = {"critic_loss": loss.item()}
        self.steps += 1
        if self.steps % self.args.policy_delay == 0:
            a_loss = actor_loss(self.actor, self.critics[0], batch)
            self.actor_opt.zero_grad()
            a_loss.backward()
            self.actor_opt.step()
            metrics["actor_loss"] = a_loss.item()
            # every target network moves tau of the way towards its online network
            online = [self.actor, *self.critics]
            targets = [self.actor_target, *self.critic_targets]
            with torch.no_grad():
                for net, target in zip(online, targets, strict=True):
                    for p_target, p in zip(target.parameters(), net.parameters(), strict=True):
                        p_target.lerp_(p, self.args.tau)
        return metrics

    def get_params(self):  # the actor itself; a CPU copy for actor processes when it is on a GPU
        return policy_network(self.actor, self.args.num_actors)

    def state_dict(self):
        return {"actor": self.actor.state_dict(), "actor_target": self.actor_target.state_dict(),
                "critics": [c.state_dict() for c in self.critics],
                "critic_targets": [c.state_dict() for c in self.critic_targets],
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "steps": self.steps, "generator": self.generator.get_state()}

    def load_state_dict(self, state):
        self.actor.load_state_dict(state["actor"])
        self.actor_target.load_state_dict(state["actor_target"])
        for c, s in zip(self.critics, state["critics"], strict=True):
            c.load_state_dict(s)
        for c, s in zip(self.critic_targets, state["critic_targets"], strict=True):
            c.load_state_dict(s)
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.steps = state["steps"]
        self.generator.set_state(state["generator"])


class GaussianExploration(RandomStartPolicy):
    """After the random start, the actor's action plus Gaussian noise (none in evaluation)."""

    def __init__(self, actor: Actor, low: np.ndarray, high: np.ndarray, args: Args) -> None:
        super().__init__(actor, low, high, args)
        self.sigma = args.exploration_noise * (high - low) / 2

    def choose(self, observation, evaluation):
        with torch.inference_mode():  # the observations to the actor's device, the actions back
            action = self.actor(torch.as_tensor(observation, device=device_of(self.actor))).cpu().numpy()
        return action if evaluation else action + self.rng.normal(0.0, self.sigma, action.shape)


def main(args: Args) -> rlflow.RunResult:
    device = torch_device(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env, eval_env, low, high, obs_dim, act_dim, adder, table = continuous_replay(args, args.buffer_size)

    actor = Actor(obs_dim, low, high, args.hidden).to(device)
    critics = (Critic(obs_dim, act_dim, args.hidden).to(device), Critic(obs_dim, act_dim, args.hidden).to(device))
    learner = TD3Learner(actor, critics, args)
    policy = GaussianExploration(actor, low, high, args)

    if not args.num_actors:
        return train("TD3", args, env, eval_env, policy, learner, adder, table, bursts=args.train_freq > 0)
    # Actor processes on Ray, one env each, acting on the CPU with copies of the learner's actor.
    parts = ActorParts(args, None, lambda a, i: GaussianExploration(Actor(obs_dim, low, high, a.hidden), low, high, a))
    return train("TD3", args, env, eval_env, policy, learner, adder, table, actors=(parts.env, parts.policy))


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> Args:
    """TD3's settings from the command line ``argv`` (default: the process's), on top of the preset of the
    env ``--env-id`` names (``baselines/presets/td3.yaml``) or of a run's ``--config``."""
    return parse(Args, "td3", argv, prog=prog,
                 hint="--learning-rate, --gamma, --exploration-noise, --learning-starts, --samples-per-insert, "
                      "--hidden, --total-steps")


if __name__ == "__main__":
    main(parse_args())
