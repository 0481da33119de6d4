"""PPO on rlflow (discrete actions): clipped surrogate, GAE with terminated and truncated kept apart.

    python -m baselines.ppo                                  # CartPole-v1, 8 envs, 100k env steps

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

import numpy as np
import torch
import tyro
from torch import nn

import rlflow
from baselines import RunArgs, train
from baselines.td3 import mlp
from rlflow import adders, envs, specs
from rlflow.minibatches import feedforward
from rlflow.replay import Fifo, Queue, StepStore, Table
from rlflow.returns import gae


@dataclass
class Args(RunArgs):
    env_id: str = "CartPole-v1"
    total_steps: int = 100_000
    num_envs: int = 8
    n_steps: int = 32  # actions per lane per rollout
    learning_rate: float = 1e-3  # falls linearly to 0 over the run
    gamma: float = 0.98
    gae_lambda: float = 0.8
    n_epochs: int = 20
    minibatch_size: int = 256
    clip_range: float = 0.2  # falls linearly to 0 over the run
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: tuple[int, ...] = (64, 64)
    eval_every: int = 20_000
    logdir: str = "runs/ppo"

    @property
    def batch_size(self) -> int:  # rollouts per learner step: one per lane
        return self.num_envs


class ActorCritic(nn.Module):
    """Separate policy (logits) and value MLPs, as SB3's default for PPO."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.pi = mlp([obs_dim, *hidden, n_actions])
        self.v = mlp([obs_dim, *hidden, 1])

    def forward(self, obs: torch.Tensor) -> tuple[torch.distributions.Categorical, torch.Tensor]:
        obs = obs.flatten(1).float()
        return torch.distributions.Categorical(logits=self.pi(obs)), self.v(obs).squeeze(-1)


class SamplingPolicy(rlflow.Policy):
    """Samples from the policy head and stores each action's log-probability and value as extras."""

    def __init__(self, net: ActorCritic) -> None:
        self.net = net

    def act(self, observation, state, *, evaluation=False):
        with torch.inference_mode():
            dist, value = self.net(torch.as_tensor(observation))
            action = dist.probs.argmax(dim=1) if evaluation else dist.sample()
            extras = {"log_prob": dist.log_prob(action).numpy(), "value": value.numpy()}
        return action.numpy(), extras, state

    def set_params(self, params):
        self.net = params  # the learner's network itself (one process: no copy, no lag)

    def state_dict(self):
        return {"torch_rng": torch.get_rng_state()}


def rollout_targets(net: ActorCritic, rows: dict, mask: np.ndarray, gamma: float,
                    lam: float) -> dict[str, torch.Tensor]:
    """Per step of ``E`` rollouts of ``T + 1`` rows: which steps are actions, their advantages and returns.

    Step ``t`` (rows ``0 .. T - 1``) is an action unless row ``t`` is a final-observation row (``last``)
    or padding. Its next value is ``V(row t + 1)``: within an episode that row is the next observation,
    and after a truncation it is the true final observation; after a termination GAE uses 0. Steps that
    are not actions get reward 0 and cut the recursion. Returns time-major ``[T, E]`` tensors.
    """
    obs = torch.as_tensor(rows["observation"])
    e, t1 = mask.shape
    with torch.no_grad():
        _, values = net(obs.reshape(e * t1, *obs.shape[2:]))
    values = values.reshape(e, t1)
    valid = torch.as_tensor(~rows["last"][:, :-1] & mask[:, :-1] & mask[:, 1:])
    reward = torch.where(valid, torch.as_tensor(rows["reward"][:, :-1]), 0.0)
    terminated = torch.as_tensor(rows["terminated"][:, :-1]) & valid
    truncated = torch.as_tensor(rows["truncated"][:, :-1]) | ~valid
    adv, ret = gae(reward.T, values[:, :-1].T, values[:, 1:].T, terminated.T, truncated.T, gamma, lam)
    return {"valid": valid.T, "advantages": adv, "returns": ret}


def ppo_loss(net: ActorCritic, obs: torch.Tensor, actions: torch.Tensor, old_log_prob: torch.Tensor,
             advantages: torch.Tensor, returns: torch.Tensor, clip: float, ent_coef: float,
             vf_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """``-mean min(r A, clip(r, 1 - clip, 1 + clip) A) + vf_coef mean (V - R)^2 - ent_coef mean H``,
    ``r = exp(log pi(a|s) - old log pi(a|s))``; the advantages are normalised over the minibatch first."""
    dist, value = net(obs)
    ratio = torch.exp(dist.log_prob(actions) - old_log_prob)
    adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8) if len(advantages) > 1 else advantages
    policy_loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()
    value_loss = (value - returns).pow(2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
    return loss, {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(), "entropy": entropy.item()}


class PPOLearner(rlflow.Learner):
    def __init__(self, net: ActorCritic, args: Args) -> None:
        self.net, self.args = net, args
        self.optimizer = torch.optim.Adam(net.parameters(), lr=args.learning_rate, eps=1e-5)
        self.updates = 0
        self.total_updates = max(1, args.total_steps // (args.num_envs * args.n_steps))
        self.rng = np.random.default_rng(args.seed)

    def step(self, sample):
        rows, mask = sample.data, sample.mask
        targets = rollout_targets(self.net, rows, mask, self.args.gamma, self.args.gae_lambda)
        left = max(0.0, 1.0 - self.updates / self.total_updates)  # linear schedules, as the zoo's
        for group in self.optimizer.param_groups:
            group["lr"] = self.args.learning_rate * left
        clip = self.args.clip_range * left
        steps_t = {k: torch.as_tensor(np.ascontiguousarray(np.swapaxes(v[:, :-1], 0, 1)))
                   for k, v in (("obs", rows["observation"]), ("actions", rows["action"]),
                                ("old_log_prob", rows["extras"]["log_prob"]))}
        t, e = targets["valid"].shape
        metrics: dict[str, float] = {}
        for _ in range(self.args.n_epochs):
            for ti, ei in feedforward(t, e, minibatch_size=self.args.minibatch_size, rng=self.rng,
                                      mask=targets["valid"].numpy()):
                loss, metrics = ppo_loss(self.net, steps_t["obs"][ti, ei], steps_t["actions"][ti, ei],
                                         steps_t["old_log_prob"][ti, ei], targets["advantages"][ti, ei].float(),
                                         targets["returns"][ti, ei].float(), clip, self.args.ent_coef,
                                         self.args.vf_coef)
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), self.args.max_grad_norm)
                self.optimizer.step()
        self.updates += 1
        return {**metrics, "steps": float(targets["valid"].sum())}

    def get_params(self):
        return self.net

    def state_dict(self):
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        self.rng.bit_generator.state = state["rng"]


def main(args: Args) -> rlflow.RunResult:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = envs.make(args.env_id, num_envs=args.num_envs, seed=args.seed)
    eval_env = envs.make(args.env_id, num_envs=None)
    obs_dim, n_actions = int(np.prod(env.single_observation_space.shape)), int(env.single_action_space.n)

    # Rollouts: n_steps + 1 rows per lane every n_steps rows, in a queue the learner empties num_envs at a
    # time (room for a batch plus one env step's items, which the loop checks).
    extras = {"log_prob": specs.Field((), np.float32), "value": specs.Field((), np.float32)}
    store = StepStore(env.step_spec(extras), capacity=4 * (args.n_steps + 1), lanes=args.num_envs)
    adder_items = 3  # Sequence.max_items_per_step
    table = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, cross_episodes=True,
                  rate_limiter=Queue(args.num_envs * (1 + adder_items)))
    adder = adders.Sequence(store, [table], length=args.n_steps + 1, period=args.n_steps, end_behavior="continue")

    net = ActorCritic(obs_dim, n_actions, args.hidden)
    return train("PPO", args, env, eval_env, SamplingPolicy(net), PPOLearner(net, args), adder, table)


if __name__ == "__main__":
    main(tyro.cli(Args))
