"""Rainbow-style DQN on LunarLander-v3 in 82 lines of code (counted as dqn_minimal.py's are): four of Rainbow's
six parts (a distributional C51 network with dueling heads, double Q, 3-step returns) and a soft target network,
on rlflow's parts (the store, a table, the n-step adder, the epsilon-greedy policy, the loop and its evaluations);
the network, C51's projection and the learner are this file. Its greedy evaluations at 100,000 env steps (10
episodes each, run with OMP_NUM_THREADS=1) are 233.4, 265.8 and 229.8 on seeds 0, 1 and 2 (target: >= 200, the
return LunarLander calls solved, on every seed; benchmarks/RESULTS.md, 2026-11-26). At the same steps and with
the same RL Baselines3 Zoo settings, Stable-Baselines3's DQN ends at a median of 117.7 and rlflow's DQN baseline
at 157.4 (baselines/README.md's learning table).

    pip install "rlflow[box2d]"                         # LunarLander needs Box2D
    python examples/rainbow.py                          # seed 0, 100,000 env steps
    python examples/rainbow.py --seed 1 --steps 2000    # another seed; a quick check that it runs
"""

import copy
from dataclasses import dataclass

import torch
import tyro
from torch import nn

import rlflow
from rlflow import adders, envs, policies
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform


@dataclass
class Args:
    """RL Baselines3 Zoo's DQN settings for LunarLander where DQN has them (learning rate, batch, replay size, one
    learner step per env step, epsilon falling to 0.1 over 12% of the run); Rainbow's own parts around them."""

    seed: int = 0
    env_id: str = "LunarLander-v3"
    steps: int = 100_000  # env steps
    n: int = 3  # rewards summed per transition
    gamma: float = 0.99
    atoms: int = 51  # points of the return distribution's support
    v_min: float = -100.0  # the support's ends
    v_max: float = 100.0
    hidden: int = 256
    lr: float = 6.3e-4
    batch_size: int = 128
    samples_per_insert: float = 128.0  # samples drawn per stored transition: one learner step per env step
    learning_starts: int = 1_000  # transitions stored before the first learner step
    tau: float = 0.005  # the target network's step towards the online one, every learner step
    exploration_fraction: float = 0.12  # of the steps over which epsilon falls from 1 to end_epsilon
    end_epsilon: float = 0.1
    capacity: int = 50_000  # transitions the store keeps


class DuelingC51(nn.Module):
    """Observation -> per action, logits over ``atoms`` returns from v_min to v_max (value + advantage - mean
    advantage); ``forward`` gives the expected returns (the Q-values the policy acts on)."""

    def __init__(self, observation_size: int, actions: int, args: Args) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_size, args.hidden), nn.ReLU(),
                                  nn.Linear(args.hidden, args.hidden), nn.ReLU())
        self.value, self.advantage = nn.Linear(args.hidden, args.atoms), nn.Linear(args.hidden, actions * args.atoms)
        self.register_buffer("support", torch.linspace(args.v_min, args.v_max, args.atoms))

    def logits(self, observation: torch.Tensor) -> torch.Tensor:  # [B, actions, atoms]
        h = self.body(observation)
        advantage = self.advantage(h).view(len(h), -1, self.support.numel())
        return self.value(h)[:, None] + advantage - advantage.mean(1, keepdim=True)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:  # [B, actions]
        return (self.logits(observation).softmax(-1) * self.support).sum(-1)


def project(probabilities: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, support: torch.Tensor):
    """The distribution of reward + discount * Z (Z on ``support`` with ``probabilities``), put back on the support:
    each shifted atom's mass goes to its two neighbours in proportion to closeness (C51's projection)."""
    shifted = (reward[:, None] + discount[:, None] * support).clamp(support[0], support[-1])
    position = (shifted - support[0]) / (support[1] - support[0])  # fractional index into the support
    low = position.floor().long().clamp(max=len(support) - 2)
    upper_share = position - low
    target = torch.zeros_like(probabilities)
    target.scatter_add_(1, low, probabilities * (1 - upper_share))
    return target.scatter_add_(1, low + 1, probabilities * upper_share)


class Rainbow(rlflow.Learner):
    """Cross-entropy of the online network's return distribution for (s, a) against the projected target
    distribution at s' (its action a* chosen by the online network, its probabilities from the target network)."""

    def __init__(self, q: DuelingC51, args: Args) -> None:
        self.q, self.target, self.args = q, copy.deepcopy(q).requires_grad_(False), args
        self.optimizer = torch.optim.Adam(q.parameters(), lr=args.lr, eps=0.01 / args.batch_size)

    def step(self, sample):
        batch, rows = sample.to_torch().data, torch.arange(self.args.batch_size)
        with torch.no_grad():
            best = self.q(batch.next_observation).argmax(1)
            next_probabilities = self.target.logits(batch.next_observation)[rows, best].softmax(-1)
            target = project(next_probabilities, batch.reward, batch.discount, self.q.support)
        log_probabilities = self.q.logits(batch.observation)[rows, batch.action].log_softmax(-1)
        loss = -(target * log_probabilities).sum(-1).mean()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), 10.0)
        self.optimizer.step()
        for t, p in zip(self.target.parameters(), self.q.parameters(), strict=True):
            t.lerp_(p.detach(), self.args.tau)
        return {"loss": loss.item()}


def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    env, eval_env = envs.make(args.env_id, seed=args.seed), envs.make(args.env_id)
    observation_size, actions = env.spec["observation"].shape[-1], int(env.single_action_space.n)
    store = StepStore(env.spec, capacity=args.capacity)
    limiter = SampleToInsertRatio(args.samples_per_insert, args.learning_starts, 2 * args.batch_size)
    table = Table(store, sampler=Uniform(seed=args.seed), remover=Fifo(), rate_limiter=limiter)
    adder = adders.NStepTransition(store, [table], n=args.n, discount=args.gamma)
    q = DuelingC51(observation_size, actions, args)
    policy = policies.EpsilonGreedy(q, actions, decay_steps=int(args.exploration_fraction * args.steps),
                                    end=args.end_epsilon, seed=args.seed)
    rlflow.run(env, policy, Rainbow(q, args), adder, table, steps=args.steps, batch_size=args.batch_size,
               eval_env=eval_env, eval_every=args.steps // 10, seed=args.seed)  # prints each evaluation


if __name__ == "__main__":
    main(tyro.cli(Args))
