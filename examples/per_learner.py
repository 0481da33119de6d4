"""A custom Learner on prioritized replay: it weights its TD loss with the sample's importance weights and
returns ``|TD error|`` as the sampled items' new priorities (double DQN on CartPole-v1, 3-step returns).

    python examples/per_learner.py                 # 30,000 env steps
    python examples/per_learner.py --steps 1200    # a quick check that it runs
"""

import argparse

import torch
from torch import nn

import rlflow
from rlflow import adders, envs, policies
from rlflow.replay import Fifo, Prioritized, SampleToInsertRatio, StepStore, Table


def q_network() -> nn.Sequential:
    """CartPole's 4 observation values in, one Q-value per action (2) out."""
    return nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))


class PERLearner(rlflow.Learner):
    """Double DQN with an importance-weighted Huber loss; new priorities ``|TD error| + 0.001``. The loop
    hands them to ``Table.update_priorities`` (items evicted meanwhile are skipped)."""

    def __init__(self) -> None:
        self.q = q_network()
        self.target = q_network()
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-3)
        self.updates = 0

    def step(self, sample):
        batch = sample.to_torch().data
        weights = torch.as_tensor(sample.weights)  # importance weights: they undo the prioritized sampling's bias
        with torch.no_grad():  # double Q: the online network picks the next action, the target network rates it
            best = self.q(batch.next_observation).argmax(1, keepdim=True)
            y = batch.reward + batch.discount * self.target(batch.next_observation).gather(1, best)[:, 0]
        td = self.q(batch.observation).gather(1, batch.action[:, None])[:, 0] - y
        loss = (weights * nn.functional.smooth_l1_loss(td, torch.zeros_like(td), reduction="none")).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        if self.updates % 250 == 0:
            self.target.load_state_dict(self.q.state_dict())
        priorities = td.abs().detach().numpy() + 1e-3
        return rlflow.LearnerUpdate(metrics={"loss": loss.item(), "mean_weight": weights.mean().item()},
                                    priorities=priorities)

    def get_params(self):
        return self.q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30_000)
    steps = parser.parse_args().steps
    torch.manual_seed(0)

    # A prioritized table (priority exponent alpha 0.6, importance-weight exponent beta 0.4) of 3-step
    # transitions from 4 envs.
    env = envs.make("CartPole-v1", num_envs=4, seed=0)
    store = StepStore(env.spec, capacity=10_000, lanes=env.num_envs)
    limiter = SampleToInsertRatio(samples_per_insert=16, min_size_to_sample=500, error_buffer=300)
    table = Table(store, sampler=Prioritized(alpha=0.6, beta=0.4, seed=0), remover=Fifo(), rate_limiter=limiter)
    adder = adders.NStepTransition(store, [table], n=3, discount=0.99)

    learner = PERLearner()
    policy = policies.EpsilonGreedy(learner.q, 2, decay_steps=int(0.2 * steps), seed=0)  # epsilon 1 -> 0.05
    eval_env = envs.make("CartPole-v1", num_envs=None)
    result = rlflow.run(env, policy, learner, adder, table, steps=steps, batch_size=64, eval_env=eval_env,
                        eval_every=steps // 3, seed=0)
    print(f"done after {result.env_steps} env steps, {result.learner_steps} learner steps; priorities updated "
          f"after each; last metrics {result.learner_metrics}")


if __name__ == "__main__":
    main()
