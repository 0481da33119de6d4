"""A custom Learner on prioritized replay: importance weights in, new priorities out.

The learner weights its TD loss with ``sample.weights`` and returns ``|TD error|`` as the new priorities
of the sampled items; ``rlflow.run`` hands them to ``Table.update_priorities`` (items evicted meanwhile
are skipped). Double DQN on CartPole, 3-step returns.

    python examples/per_learner.py             # 30,000 env steps
"""

import argparse

import numpy as np
import torch
from torch import nn

import rlflow
from rlflow import adders, envs
from rlflow.replay import Fifo, Prioritized, SampleToInsertRatio, StepStore, Table

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30_000)
steps = parser.parse_args().steps
torch.manual_seed(0)

env = envs.make("CartPole-v1", num_envs=4, seed=0)
store = StepStore(env.spec, capacity=10_000, lanes=env.num_envs)
table = Table(store, sampler=Prioritized(alpha=0.6, beta=0.4, seed=0), remover=Fifo(),
              rate_limiter=SampleToInsertRatio(samples_per_insert=16, min_size_to_sample=500, error_buffer=300))
adder = adders.NStepTransition(store, [table], n=3, discount=0.99)


def net():
    return nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))


class EpsilonGreedy(rlflow.Policy):
    def __init__(self, q):
        self.q, self.t, self.rng = q, 0, np.random.default_rng(0)

    def act(self, obs, state, *, evaluation=False):
        self.t += 0 if evaluation else len(obs)
        eps = 0.0 if evaluation else max(0.05, 1 - self.t / (0.2 * steps))
        with torch.no_grad():
            greedy = self.q(torch.as_tensor(obs)).argmax(1).numpy()
        return np.where(self.rng.random(len(obs)) < eps, self.rng.integers(0, 2, len(obs)), greedy), None, state


class PERLearner(rlflow.Learner):
    def __init__(self):
        self.q, self.target = net(), net()
        self.target.load_state_dict(self.q.state_dict())
        self.opt, self.updates = torch.optim.Adam(self.q.parameters(), lr=1e-3), 0

    def step(self, sample):
        b, w = sample.to_torch().data, torch.as_tensor(sample.weights)
        with torch.no_grad():  # double Q: the online network picks, the target network rates
            best = self.q(b.next_observation).argmax(1, keepdim=True)
            y = b.reward + b.discount * self.target(b.next_observation).gather(1, best)[:, 0]
        td = self.q(b.observation).gather(1, b.action[:, None])[:, 0] - y
        loss = (w * nn.functional.smooth_l1_loss(td, torch.zeros_like(td), reduction="none")).mean()
        self.opt.zero_grad(), loss.backward(), self.opt.step()
        self.updates += 1
        if self.updates % 250 == 0:
            self.target.load_state_dict(self.q.state_dict())
        return rlflow.LearnerUpdate(metrics={"loss": loss.item(), "mean_weight": w.mean().item()},
                                    priorities=td.abs().detach().numpy() + 1e-3)

    def get_params(self):
        return self.q


learner = PERLearner()
result = rlflow.run(env, EpsilonGreedy(learner.q), learner, adder, table, steps=steps, batch_size=64,
                    eval_env=envs.make("CartPole-v1", num_envs=None), eval_every=steps // 3, seed=0)
print(f"final evaluation: {result.final_evaluation:.1f} after {result.env_steps} env steps, "
      f"{result.learner_steps} learner steps; priorities updated after each; last metrics {result.learner_metrics}")
