"""HATD3 on rlflow: agents with their own spaces and actors, updated one after another in a random order.

    python -m baselines.hatd3                                # MPE simple_speaker_listener, continuous, 20 envs

rlflow does the data: PettingZoo parallel envs whose agents differ (the speaker sees 3 numbers and says 3,
the listener sees 11 and moves with 5) as lanes with one group per kind of agent
(:class:`rlflow.envs.ParallelEnvironment`'s groups: each with its own shapes, nothing padded), a
``MultiAgentTransition`` adder (one-step transitions of the whole team), a uniform table under a
samples-per-insert ratio, and the loop. This file is the algorithm, HARL's HATD3 (Zhong et al., 2024):
each agent a deterministic actor on its own observation; twin centralised critics ``Q(state, every
agent's action)`` trained on the team reward with target policy smoothing; every ``policy_delay``
critic updates, the actors are updated one after another in a random order, each agent's actor
ascending ``Q`` with the actions of the agents updated before it taken from their new actors (HARL's
sequential update, whose monotonic improvement the heterogeneous-agent theory rests on); then the
targets move ``tau`` of the way. Hyperparameters are HARL's tuned ones for simple_speaker_listener
(continuous): batches of 1,000 transitions, one update per step of the 20 envs, i.e. per 20 transitions
stored (HARL trains ``update_per_train * train_interval`` = 50 times every 50 steps), 10,000 random steps
first, exploration noise 0.1 and smoothing noise 0.2 (clipped at 0.5) of the action range's half-width,
actor learning rate 5e-4, critic 1e-3, networks of 128 and 128.

Episode returns in the logs are team returns (the sum over agents; both agents get the same reward here).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import rlflow
from baselines import RunArgs, to_device, torch_device, train
from baselines._mpe import report, scenario
from baselines._nets import Critic, device_of, mlp
from baselines._presets import parse
from rlflow import adders
from rlflow.envs import ParallelEnvironment
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform


@dataclass
class Args(RunArgs):
    env_id: str = "simple_speaker_listener_v4"  # an mpe2 scenario, with continuous actions
    max_cycles: int = 25  # steps per episode (mpe2's max_cycles)
    total_steps: int = 5_000_000  # joint env steps, over all envs
    num_envs: int = 20  # parallel MPE envs (HARL's n_rollout_threads)
    buffer_size: int = 1_000_000  # replay capacity in joint steps, over all envs
    batch_size: int = 1_000  # joint transitions per learner step
    samples_per_insert: float = 50.0  # transitions sampled per stored one: batch_size / num_envs, one update per step
    learning_starts: int = 10_000  # joint steps of uniformly random actions, and no learning, first
    actor_lr: float = 5e-4  # Adam's learning rate of each actor
    critic_lr: float = 1e-3  # Adam's learning rate of the twin critics
    gamma: float = 0.99  # discount per env step
    tau: float = 0.005  # each actor update moves the target networks this share of the way
    exploration_noise: float = 0.1  # Gaussian std of the acting noise, in units of the action range's half-width
    policy_noise: float = 0.2  # target policy smoothing noise, same units
    noise_clip: float = 0.5  # the smoothing noise is clipped to +- this, same units
    policy_delay: int = 2  # critic updates per round of actor updates
    fixed_order: bool = False  # update the actors in the team's order instead of a random one each round
    hidden: tuple[int, ...] = (128, 128)  # hidden layers of each actor and each critic
    eval_every: int = 250_000  # joint env steps between evaluations (0: only at the end)
    logdir: str = "runs/hatd3"  # directory of the run's logs, checkpoints, saved learners and learning curve


def make_env(args: Args, num_envs: int, seed: int | None) -> ParallelEnvironment:
    """``num_envs`` mpe2 ``args.env_id`` envs with continuous actions, ``args.max_cycles`` steps long."""
    module = scenario(args.env_id)
    return ParallelEnvironment([module.parallel_env(max_cycles=args.max_cycles, continuous_actions=True)
                                for _ in range(num_envs)], seed=seed)


class Actor(nn.Module):
    """One agent's deterministic policy: an MLP of its observation, tanh, scaled to its action box."""

    def __init__(self, obs_dim: int, space: Any, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *hidden, int(np.prod(space.shape))], nn.Tanh())
        low, high = torch.as_tensor(space.low, dtype=torch.float32), torch.as_tensor(space.high, dtype=torch.float32)
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.register_buffer("scale", (high - low) / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.low + self.scale * (self.net(obs.float()) + 1)

    def noisy(self, action: torch.Tensor, std: float, clip: float | None = None) -> torch.Tensor:
        """``action`` plus Gaussian noise of ``std`` half-widths (clipped at ``clip`` half-widths), in the box."""
        noise = torch.randn_like(action) * std * self.scale
        if clip is not None:
            noise = torch.maximum(torch.minimum(noise, clip * self.scale), -clip * self.scale)
        return torch.maximum(torch.minimum(action + noise, self.high), self.low)


class Team(nn.Module):
    """Every agent's actor, in the team's order, and where its observations and actions sit in a row."""

    def __init__(self, env: ParallelEnvironment, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.places = [(name, pos) for name, group in env.groups.items() for pos in range(len(group.agents))]
        self.grouped = len(env.groups) > 1  # one group (agents alike): observations and actions are not by name
        self.actors = nn.ModuleList(Actor(int(np.prod(g.observation_space.shape)), g.action_space, hidden)
                                    for g in env.groups.values() for _ in g.agents)

    def part(self, values: Any, i: int) -> Any:
        """Agent ``i``'s slice ``[B, ...]`` of a row part laid out by group (``{group: [B, A_g, ...]}``)."""
        name, pos = self.places[i]
        return (values[name] if self.grouped else values)[:, pos]

    def act(self, obs: Any) -> list[torch.Tensor]:
        """Each agent's action ``[B, act_dim]`` from the observations ``[B, A_g, ...]`` of its group."""
        return [actor(self.part(obs, i)) for i, actor in enumerate(self.actors)]

    def by_group(self, actions: list[torch.Tensor]) -> Any:
        """Per-agent actions as the env takes them: ``{group: [B, A_g, act_dim]}`` (one group: the array)."""
        out: dict[str, list[torch.Tensor]] = {}
        for (name, _), action in zip(self.places, actions, strict=True):
            out.setdefault(name, []).append(action)
        grouped = {name: torch.stack(parts, dim=1) for name, parts in out.items()}
        return grouped if self.grouped else next(iter(grouped.values()))


class HATD3Learner(rlflow.Learner):
    """Twin centralised critics on the team reward, then the actors one after another (see the module docstring)."""

    def __init__(self, team: Team, state_dim: int, args: Args) -> None:
        self.team, self.args = team, args
        self.target = copy.deepcopy(team)
        act_dim = sum(int(a.scale.numel()) for a in team.actors)
        self.q1, self.q2 = Critic(state_dim, act_dim, args.hidden), Critic(state_dim, act_dim, args.hidden)
        self.q1.to(device_of(team)), self.q2.to(device_of(team))
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.critic_opt = torch.optim.Adam([*self.q1.parameters(), *self.q2.parameters()], lr=args.critic_lr)
        self.actor_opts = [torch.optim.Adam(a.parameters(), lr=args.actor_lr) for a in team.actors]
        self.rng = np.random.default_rng(args.seed)
        self.steps = 0

    def step(self, sample):
        device = device_of(self.team)
        b = sample.data
        obs, nxt = to_device(b.observation["obs"], device), to_device(b.next_observation["obs"], device)
        state = torch.as_tensor(b.observation["state"], device=device)
        next_state = torch.as_tensor(b.next_observation["state"], device=device)
        taken = torch.cat([self.team.part(to_device(b.action, device), i).float()
                           for i in range(len(self.team.actors))], dim=1)
        reward = torch.as_tensor(b.reward, device=device).mean(dim=1)  # the team reward (every agent's, here)
        discount = torch.as_tensor(b.discount, device=device).max(dim=1).values  # 0 once the whole team ended
        with torch.no_grad():  # target policy smoothing: each target actor's action, noisy and clipped
            smoothed = [a.noisy(x, self.args.policy_noise, self.args.noise_clip)
                        for a, x in zip(self.target.actors, self.target.act(nxt), strict=True)]
            joint = torch.cat(smoothed, dim=1)
            y = reward + discount * torch.min(self.q1_target(next_state, joint), self.q2_target(next_state, joint))
        critic_loss = F.mse_loss(self.q1(state, taken), y) + F.mse_loss(self.q2(state, taken), y)
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()
        self.steps += 1
        metrics = {"critic_loss": critic_loss.item(), "q": float(y.mean())}
        if self.steps % self.args.policy_delay == 0:
            metrics["actor_loss"] = self.update_actors(obs, state)
        return metrics

    def update_actors(self, obs: Any, state: torch.Tensor) -> float:
        """HARL's sequential update: in a random order, each actor ascends ``Q1`` with the others' actions from
        their current actors (those updated before it: their new ones); then every target moves ``tau``."""
        with torch.no_grad():
            actions = self.team.act(obs)
        order = range(len(actions)) if self.args.fixed_order else self.rng.permutation(len(actions))
        for i in order:
            actor = self.team.actors[i]
            actions[i] = actor(self.team.part(obs, i))
            loss = -self.q1(state, torch.cat(actions, dim=1)).mean()
            self.actor_opts[i].zero_grad()
            loss.backward()
            self.actor_opts[i].step()
            with torch.no_grad():
                actions[i] = actor(self.team.part(obs, i))
        with torch.no_grad():
            for net, target in ((self.team, self.target), (self.q1, self.q1_target), (self.q2, self.q2_target)):
                for p, tp in zip(net.parameters(), target.parameters(), strict=True):
                    tp.lerp_(p, self.args.tau)
        return loss.item()

    def get_params(self):
        return self.team

    def state_dict(self):
        return {"team": self.team.state_dict(), "target": self.target.state_dict(), "q1": self.q1.state_dict(),
                "q2": self.q2.state_dict(), "q1_target": self.q1_target.state_dict(),
                "q2_target": self.q2_target.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "actor_opts": [o.state_dict() for o in self.actor_opts], "rng": self.rng.bit_generator.state,
                "steps": self.steps}

    def load_state_dict(self, state):
        for name in ("team", "target", "q1", "q2", "q1_target", "q2_target", "critic_opt"):
            getattr(self, name).load_state_dict(state[name])
        for opt, saved in zip(self.actor_opts, state["actor_opts"], strict=True):
            opt.load_state_dict(saved)
        self.rng.bit_generator.state = state["rng"]
        self.steps = state["steps"]


class TeamPolicy(rlflow.Policy):
    """Every agent's actor with Gaussian exploration noise (none in evaluation); uniformly random actions for
    the first ``learning_starts`` steps."""

    def __init__(self, team: Team, args: Args) -> None:
        self.team, self.args = team, args
        self.steps = 0
        self.rng = np.random.default_rng(args.seed)

    def act(self, observation, state, *, evaluation=False):
        device = device_of(self.team)
        with torch.inference_mode():
            actions = self.team.act(to_device(observation["obs"], device))
            if not evaluation:
                if self.steps < self.args.learning_starts:  # uniform over each agent's box
                    actions = [a.low + (a.high - a.low) * torch.as_tensor(self.rng.random(x.shape), device=device,
                                                                         dtype=torch.float32)
                               for a, x in zip(self.team.actors, actions, strict=True)]
                else:
                    actions = [a.noisy(x, self.args.exploration_noise)
                               for a, x in zip(self.team.actors, actions, strict=True)]
                self.steps += len(observation["active"])
            grouped = self.team.by_group(actions)
        if isinstance(grouped, dict):
            return {k: v.cpu().numpy() for k, v in grouped.items()}, None, state
        return grouped.cpu().numpy(), None, state

    def set_params(self, params):
        self.team = params

    def state_dict(self):
        return {"steps": self.steps, "rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state):
        self.steps = state["steps"]
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])


def main(args: Args) -> rlflow.RunResult:
    device = torch_device(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = make_env(args, args.num_envs, args.seed)
    eval_env = make_env(args, 1, None)

    # Data: the team's steps stored once (each group with its own shapes), one-step transitions of the whole
    # team sampled uniformly, batch_size / samples_per_insert joint steps per learner step.
    store = StepStore(env.spec, capacity=args.buffer_size // args.num_envs, lanes=args.num_envs)
    window = args.batch_size + args.num_envs * args.samples_per_insert
    limiter = SampleToInsertRatio(args.samples_per_insert, max(args.learning_starts, args.batch_size),
                                  error_buffer=max(window, 2 * args.batch_size))
    table = Table(store, sampler=Uniform(seed=args.seed), remover=Fifo(), rate_limiter=limiter)
    adder = adders.MultiAgentTransition(store, [table], n=1, discount=args.gamma, groups=env.groups)

    team = Team(env, args.hidden).to(device)
    state_dim = int(np.prod(env.observation_spec["state"].shape))
    result = train("HATD3", args, env, eval_env, TeamPolicy(team, args), HATD3Learner(team, state_dim, args),
                   adder, table)
    report(result.final_evaluation, env.num_agents, args.env_id, args.max_cycles)
    return result


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> Args:
    """HATD3's settings from the command line ``argv`` (default: the process's), on top of the preset of the
    env ``--env-id`` names (``baselines/presets/hatd3.yaml``) or of a run's ``--config``."""
    return parse(Args, "hatd3", argv, prog=prog,
                 hint="--num-envs, --batch-size, --samples-per-insert, --actor-lr, --critic-lr, --exploration-noise, "
                      "--total-steps")


if __name__ == "__main__":
    main(parse_args())
