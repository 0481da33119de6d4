"""DQN on CartPole-v1 in one short file: a Q-network, an epsilon-greedy policy, a learner and ``rlflow.run``,
in about 60 lines of code (not counting blank lines, comments and docstrings). The full baseline, with
options and logging, is baselines/dqn.py.

    python examples/dqn_minimal.py                 # 50,000 env steps, a few minutes
    python examples/dqn_minimal.py --steps 1500    # a quick check that it runs
"""

import argparse

import numpy as np
import torch
from torch import nn

import rlflow
from rlflow import adders, envs
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform


def q_network() -> nn.Sequential:
    """CartPole's 4 observation values in, one Q-value per action (2) out."""
    return nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))


class EpsilonGreedy(rlflow.Policy):
    """A random action with probability epsilon, which falls from 1 to 0.04 over the first 16% of the
    run's steps; the greedy action otherwise, and always in evaluation."""

    def __init__(self, q: nn.Module, total_steps: int) -> None:
        self.q = q
        self.decay_steps = 0.16 * total_steps
        self.steps = 0
        self.rng = np.random.default_rng(0)

    def act(self, observation, state, *, evaluation=False):
        epsilon = 0.0
        if not evaluation:
            self.steps += 1
            epsilon = max(0.04, 1 - self.steps / self.decay_steps)
        with torch.no_grad():
            greedy = self.q(torch.as_tensor(observation)).argmax(1).numpy()
        explore = self.rng.random(len(observation)) < epsilon
        random = self.rng.integers(0, 2, len(observation))
        return np.where(explore, random, greedy), None, state


class DQNLearner(rlflow.Learner):
    """Huber loss of ``Q(s, a)`` against ``r + discount * max_a Q_target(s', a)`` (the sample's discount is
    gamma, or 0 after termination); the target network copies the online one every 128 steps."""

    def __init__(self, q: nn.Module) -> None:
        self.q = q
        self.target = q_network()
        self.target.load_state_dict(q.state_dict())
        self.optimizer = torch.optim.Adam(q.parameters(), lr=2.3e-3)
        self.steps = 0

    def step(self, sample):
        batch = sample.to_torch().data  # a Transition of [64, ...] tensors
        with torch.no_grad():
            y = batch.reward + batch.discount * self.target(batch.next_observation).max(1).values
        q_taken = self.q(batch.observation).gather(1, batch.action[:, None])[:, 0]
        loss = nn.functional.smooth_l1_loss(q_taken, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        if self.steps % 128 == 0:
            self.target.load_state_dict(self.q.state_dict())
        return {"loss": loss.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50_000)
    steps = parser.parse_args().steps
    torch.manual_seed(0)

    # The data: every step stored once, one transition item per action, 32 samples per stored transition.
    env = envs.make("CartPole-v1", num_envs=None, seed=0)
    store = StepStore(env.spec, capacity=50_000)
    limiter = SampleToInsertRatio(samples_per_insert=32, min_size_to_sample=1_000, error_buffer=200)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=limiter)
    adder = adders.NStepTransition(store, [table], n=1, discount=0.99)

    # The algorithm: the policy acts with the network the learner trains.
    learner = DQNLearner(q_network())
    policy = EpsilonGreedy(learner.q, steps)
    eval_env = envs.make("CartPole-v1", num_envs=None)
    result = rlflow.run(env, policy, learner, adder, table, steps=steps, batch_size=64, eval_env=eval_env,
                        eval_every=steps // 3, seed=0)
    print(f"done after {result.env_steps} env steps, {result.learner_steps} learner steps")


if __name__ == "__main__":
    main()
