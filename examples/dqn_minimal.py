"""DQN on CartPole in two dozen lines of rlflow: a Q-network, a policy, a learner, and rlflow.run.

The full baseline, with options and logging, is baselines/dqn.py.

    python examples/dqn_minimal.py             # 50,000 env steps, a few minutes
"""

import argparse

import numpy as np
import torch
from torch import nn

import rlflow
from rlflow import adders, envs
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50_000)
steps = parser.parse_args().steps
torch.manual_seed(0)

env = envs.make("CartPole-v1", num_envs=None, seed=0)
store = StepStore(env.spec, capacity=50_000)
table = Table(store, sampler=Uniform(seed=0), remover=Fifo(),
              rate_limiter=SampleToInsertRatio(samples_per_insert=32, min_size_to_sample=1_000, error_buffer=200))
adder = adders.NStepTransition(store, [table], n=1, discount=0.99)
q = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
target = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))


class Greedy(rlflow.Policy):  # epsilon-greedy, epsilon falling from 1 to 0.04 over the first 16% of steps
    t, rng = 0, np.random.default_rng(0)

    def act(self, obs, state, *, evaluation=False):
        self.t += 0 if evaluation else 1
        eps = 0.0 if evaluation else max(0.04, 1 - self.t / (0.16 * steps))
        with torch.no_grad():
            greedy = q(torch.as_tensor(obs)).argmax(1).numpy()
        return np.where(self.rng.random(len(obs)) < eps, self.rng.integers(0, 2, len(obs)), greedy), None, state


class Learner(rlflow.Learner):  # Huber TD loss; batch.discount is gamma, or 0 after termination
    opt, n = torch.optim.Adam(q.parameters(), lr=2.3e-3), 0

    def step(self, sample):
        b = sample.to_torch().data
        with torch.no_grad():
            y = b.reward + b.discount * target(b.next_observation).max(1).values
        loss = nn.functional.smooth_l1_loss(q(b.observation).gather(1, b.action[:, None])[:, 0], y)
        self.opt.zero_grad(), loss.backward(), self.opt.step()
        self.n += 1
        if self.n % 128 == 0:
            target.load_state_dict(q.state_dict())
        return {"loss": loss.item()}


result = rlflow.run(env, Greedy(), Learner(), adder, table, steps=steps, batch_size=64,
                    eval_env=envs.make("CartPole-v1", num_envs=None), eval_every=steps // 3, seed=0)
print(f"final evaluation: {result.final_evaluation:.1f} after {result.env_steps} env steps")
