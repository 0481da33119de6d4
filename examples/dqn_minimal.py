"""DQN on CartPole-v1 in 33 lines of code (blank lines, comments and docstrings not counted; tests/test_examples.py
counts them): the learner (15 of them) is the algorithm; rlflow gives the env, the replay, the epsilon-greedy
policy and the loop. It solves CartPole-v1 (a greedy evaluation of 500, the most an episode
pays) within 50,000 env steps; the full baseline, with options and logging, is baselines/dqn.py.

    python examples/dqn_minimal.py                       # seed 0, 50,000 env steps, about a minute
    python examples/dqn_minimal.py --seed 1 --steps 1500  # another seed; a quick check that it runs
"""

import copy

import torch
import tyro
from torch import nn

import rlflow
from rlflow import adders, envs, policies
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform


class DQN(rlflow.Learner):
    """Huber loss of Q(s, a) against r + discount * max_a' Q_target(s', a') (the sample's discount is 0.99, or 0
    after termination); the target network copies the online one every 128 steps."""

    def __init__(self, q: nn.Module) -> None:
        self.q, self.target, self.steps = q, copy.deepcopy(q).requires_grad_(False), 0
        self.optimizer = torch.optim.Adam(q.parameters(), lr=2.3e-3)

    def step(self, sample):
        batch = sample.to_torch().data  # a Transition of [64, ...] tensors
        y = batch.reward + batch.discount * self.target(batch.next_observation).max(1).values
        loss = nn.functional.smooth_l1_loss(self.q(batch.observation).gather(1, batch.action[:, None])[:, 0], y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        if self.steps % 128 == 0:
            self.target.load_state_dict(self.q.state_dict())
        return {"loss": loss.item()}


def main(seed: int = 0, steps: int = 50_000) -> None:
    torch.manual_seed(seed)
    env, eval_env = envs.make("CartPole-v1", seed=seed), envs.make("CartPole-v1")
    # Every step stored once; one transition item per action, 32 samples drawn per stored transition
    store = StepStore(env.spec, capacity=50_000)
    table = Table(store, sampler=Uniform(seed=seed), remover=Fifo(), rate_limiter=SampleToInsertRatio(32, 1_000, 200))
    q = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    # The policy acts with the network the learner trains: epsilon falls from 1 to 0.04 over 16% of the steps
    policy = policies.EpsilonGreedy(q, 2, decay_steps=int(0.16 * steps), end=0.04, seed=seed)
    rlflow.run(env, policy, DQN(q), adders.NStepTransition(store, [table]), table, steps=steps, batch_size=64,
               eval_env=eval_env, eval_every=steps // 5, seed=seed)  # prints each evaluation


if __name__ == "__main__":
    tyro.cli(main)
