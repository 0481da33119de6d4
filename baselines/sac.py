"""SAC on rlflow: a tanh-squashed Gaussian policy, twin critics, and an automatically tuned entropy weight.

    python -m baselines.sac                                  # Pendulum-v1, 20k env steps

rlflow does the data (env wrapper, a one-step transition adder, a uniform table under a
SampleToInsertRatio rate limiter, the loop); this file is the algorithm. Hyperparameters default to RL
Baselines3 Zoo's Pendulum-v1 SAC (learning rate 1e-3 and SB3's SAC defaults: one gradient step of 256
per env step after 100 steps, gamma 0.99, tau 0.005, target entropy -dim(A), networks of 256 and 256).
The MLP and the twin ``Q(s, a)`` critics are ``baselines/_nets.py``'s, shared with TD3.

With ``--num-actors N`` (``pip install "rlflow[ray]"``) N actor processes act, one env each, with their own
seeds and an N-th of the random start each, and take the learner's actor every ``--sync-period`` env steps;
the replay is in a replay server and the learner here (``rlflow.distributed``; ``--address auto`` joins a
running Ray cluster).
"""

from __future__ import annotations

import copy
import math
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

LOG_STD_MIN = -20.0  # the actor's log standard deviations are clamped to [LOG_STD_MIN, LOG_STD_MAX]
LOG_STD_MAX = 2.0


@dataclass
class Args(RunArgs, ActorArgs, VideoArgs):
    env_id: str = "Pendulum-v1"  # a Gymnasium env with Box actions
    total_steps: int = 20_000  # env steps of the run (over all actors with --num-actors)
    learning_rate: float = 1e-3  # Adam's learning rate of the actor, the critics and the entropy weight
    buffer_size: int = 1_000_000  # replay capacity in transitions (at most total_steps + 16 are used)
    batch_size: int = 256  # transitions per learner step
    gamma: float = 0.99  # discount per env step
    tau: float = 0.005  # each learner step moves the target critics this share of the way to the online ones
    learning_starts: int = 100  # random actions (and no learning) before this many steps
    samples_per_insert: float = 256.0  # batch_size * gradient steps per env step
    train_freq: int = 0  # env steps between bursts of learner steps, as SB3 trains (0: the steps spread evenly)
    hidden: tuple[int, ...] = (256, 256)  # sizes of the hidden layers of the actor and of each critic
    eval_every: int = 5_000  # env steps between evaluations (0: only at the end)
    logdir: str = "runs/sac"  # directory of the run's logs, checkpoints, saved learners and learning curve


class GaussianActor(nn.Module):
    """``a = centre + half_width * tanh(u)``, ``u ~ N(mean(s), std(s))``; log-probabilities corrected for tanh."""

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.body = mlp([obs_dim, *hidden], nn.ReLU()) if hidden else nn.Identity()
        width = hidden[-1] if hidden else obs_dim
        self.mean = nn.Linear(width, len(low))
        self.log_std = nn.Linear(width, len(low))
        self.register_buffer("centre", torch.as_tensor((high + low) / 2, dtype=torch.float32))
        self.register_buffer("half_width", torch.as_tensor((high - low) / 2, dtype=torch.float32))

    def forward(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The action for standard-normal ``noise`` and its log-probability (summed over action dims)."""
        x = self.body(obs.float())
        mean = self.mean(x)
        log_std = self.log_std(x).clamp(LOG_STD_MIN, LOG_STD_MAX)
        u = mean + log_std.exp() * noise
        squashed = torch.tanh(u)
        log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
                    - torch.log(self.half_width * (1 - squashed.pow(2)) + 1e-6)).sum(dim=1)
        return self.centre + self.half_width * squashed, log_prob

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.body(obs.float())
        return self.centre + self.half_width * torch.tanh(self.mean(x))


def critic_loss(critics: tuple[Critic, Critic], targets: tuple[Critic, Critic], actor: GaussianActor, alpha: float,
                batch: rlflow.replay.Transition, noise: torch.Tensor) -> torch.Tensor:
    """``sum_i mean (Q_i(s, a) - y)^2``, ``y = r + discount * (min_i Q'_i(s', a') - alpha log pi(a'|s'))``,
    ``a'`` the actor's action at ``s'`` for standard-normal ``noise``."""
    with torch.no_grad():
        next_action, next_log_prob = actor(batch.next_observation, noise)
        next_q = torch.min(targets[0](batch.next_observation, next_action),
                           targets[1](batch.next_observation, next_action))
        y = batch.reward + batch.discount * (next_q - alpha * next_log_prob)
    return sum(F.mse_loss(q(batch.observation, batch.action), y) for q in critics)


def actor_loss(actor: GaussianActor, critics: tuple[Critic, Critic], alpha: float, observation: torch.Tensor,
               noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean(alpha log pi(a|s) - min_i Q_i(s, a))`` for ``a`` the actor's action; also the log-probabilities."""
    action, log_prob = actor(observation, noise)
    q = torch.min(critics[0](observation, action), critics[1](observation, action))
    return (alpha * log_prob - q).mean(), log_prob


class SACLearner(rlflow.Learner):
    """SAC on the device of ``actor`` and ``critics``, where each sample is copied."""

    def __init__(self, actor: GaussianActor, critics: tuple[Critic, Critic], args: Args) -> None:
        self.actor = actor
        self.critics = critics
        self.args = args
        self.device = device_of(actor)
        self.critic_targets = tuple(copy.deepcopy(c) for c in critics)
        self.log_alpha = torch.zeros(1, device=self.device, requires_grad=True)
        self.target_entropy = -float(len(actor.centre))
        self.actor_opt = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
        self.critic_opt = torch.optim.Adam([p for c in critics for p in c.parameters()], lr=args.learning_rate,
                                           fused=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=args.learning_rate, fused=True)
        self.generator = torch.Generator().manual_seed(args.seed)

    def step(self, sample):
        batch = to_device(sample.data, self.device)
        alpha = self.log_alpha.exp().item()
        # the noise drawn on the CPU (a generator whose state loads on any machine), then moved to the device
        noise = torch.randn(batch.action.shape, generator=self.generator).to(self.device)
        c_loss = critic_loss(self.critics, self.critic_targets, self.actor, alpha, batch, noise)
        self.critic_opt.zero_grad()
        c_loss.backward()
        self.critic_opt.step()
        noise = torch.randn(batch.action.shape, generator=self.generator).to(self.device)
        a_loss, log_prob = actor_loss(self.actor, self.critics, alpha, batch.observation, noise)
        self.actor_opt.zero_grad()
        a_loss.backward()
        self.actor_opt.step()
        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()
        with torch.no_grad():
            for net, target in zip(self.critics, self.critic_targets, strict=True):
                for p_target, p in zip(target.parameters(), net.parameters(), strict=True):
                    p_target.lerp_(p, self.args.tau)
        return {"critic_loss": c_loss.item(), "actor_loss": a_loss.item(), "alpha": alpha}

    def get_params(self):  # the actor itself; a CPU copy for actor processes when it is on a GPU
        return policy_network(self.actor, self.args.num_actors)

    def state_dict(self):
        return {"actor": self.actor.state_dict(), "critics": [c.state_dict() for c in self.critics],
                "critic_targets": [c.state_dict() for c in self.critic_targets], "log_alpha": self.log_alpha.detach(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "alpha_opt": self.alpha_opt.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state):
        self.actor.load_state_dict(state["actor"])
        for c, s in zip(self.critics, state["critics"], strict=True):
            c.load_state_dict(s)
        for c, s in zip(self.critic_targets, state["critic_targets"], strict=True):
            c.load_state_dict(s)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.generator.set_state(state["generator"])


class StochasticPolicy(RandomStartPolicy):
    """After the random start, samples of the actor; its mean action in evaluation."""

    def choose(self, observation, evaluation):
        device = device_of(self.actor)  # the observations (and the noise) to the actor's device, the actions back
        obs = torch.as_tensor(observation, device=device)
        with torch.inference_mode():
            if evaluation:
                return self.actor.greedy(obs).cpu().numpy()
            noise = torch.as_tensor(self.rng.standard_normal((len(obs), len(self.low))), dtype=torch.float32,
                                    device=device)
            return self.actor(obs, noise)[0].cpu().numpy()


def main(args: Args) -> rlflow.RunResult:
    device = torch_device(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    capacity = min(args.buffer_size, args.total_steps + 16)  # rows the run can fill
    env, eval_env, low, high, obs_dim, act_dim, adder, table = continuous_replay(args, capacity)

    actor = GaussianActor(obs_dim, low, high, args.hidden).to(device)
    critics = (Critic(obs_dim, act_dim, args.hidden).to(device), Critic(obs_dim, act_dim, args.hidden).to(device))
    learner = SACLearner(actor, critics, args)
    policy = StochasticPolicy(actor, low, high, args)
    if not args.num_actors:
        return train("SAC", args, env, eval_env, policy, learner, adder, table, bursts=args.train_freq > 0)
    # Actor processes on Ray, one env each, acting on the CPU with copies of the learner's actor.
    parts = ActorParts(args, None, lambda a, i: StochasticPolicy(GaussianActor(obs_dim, low, high, a.hidden), low,
                                                                 high, a))
    return train("SAC", args, env, eval_env, policy, learner, adder, table, actors=(parts.env, parts.policy))


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> Args:
    """SAC's settings from the command line ``argv`` (default: the process's), on top of the preset of the
    env ``--env-id`` names (``baselines/presets/sac.yaml``) or of a run's ``--config``."""
    return parse(Args, "sac", argv, prog=prog,
                 hint="--learning-rate, --gamma, --tau, --learning-starts, --samples-per-insert, --hidden, "
                      "--total-steps")


if __name__ == "__main__":
    main(parse_args())
