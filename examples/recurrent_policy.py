"""A recurrent policy with the sequence adder: DRQN (a GRU Q-network) on CartPole.

The policy is a GRU whose state rlflow's actor restarts at every episode start; each step stores the
state the action was taken from (an extra), so the learner can start every sampled sequence from it.
A ``Sequence`` adder writes overlapping windows of 10 rows (period 5) that never cross an episode's end;
the learner unrolls the GRU over each window and regresses Q on ``r + gamma * max Q_target(next row)``
(0 after termination; after a time limit the next row is the stored final observation) on the masked
steps.

    python examples/recurrent_policy.py        # 40,000 env steps
"""

import argparse

import numpy as np
import torch
from torch import nn

import rlflow
from rlflow import adders, envs, specs
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40_000)
steps = parser.parse_args().steps
torch.manual_seed(0)
H, LENGTH = 64, 10

env = envs.make("CartPole-v1", num_envs=4, seed=0)
store = StepStore(env.step_spec({"h": specs.Field((H,), np.float32)}), capacity=10_000, lanes=env.num_envs)
table = Table(store, sampler=Uniform(seed=0), remover=Fifo(),
              rate_limiter=SampleToInsertRatio(samples_per_insert=40, min_size_to_sample=100, error_buffer=500))
adder = adders.Sequence(store, [table], length=LENGTH, period=5, end_behavior="zero_pad")


class DRQN(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.gru, self.out = nn.Linear(4, H), nn.GRUCell(H, H), nn.Linear(H, 2)

    def forward(self, obs, h):  # one step: obs [N, 4], h [N, H] -> Q [N, 2], h'
        h = self.gru(torch.relu(self.inp(torch.as_tensor(obs))), h)
        return self.out(h), h

    def unroll(self, obs, h):  # obs [B, L, 4] from the state h [B, H] -> Q [B, L, 2]
        qs = []
        for t in range(obs.shape[1]):
            q, h = self(obs[:, t], h)
            qs.append(q)
        return torch.stack(qs, 1)


class RecurrentEpsilonGreedy(rlflow.Policy):
    def __init__(self, q):
        self.q, self.t, self.rng = q, 0, np.random.default_rng(0)

    def initial_state(self, batch_size):
        return torch.zeros(batch_size, H)

    def act(self, obs, h, *, evaluation=False):
        self.t += 0 if evaluation else len(obs)
        eps = 0.0 if evaluation else max(0.05, 1 - self.t / (0.3 * steps))
        with torch.no_grad():
            q, h_next = self.q(obs, h)
        greedy = q.argmax(1).numpy()
        actions = np.where(self.rng.random(len(obs)) < eps, self.rng.integers(0, 2, len(obs)), greedy)
        return actions, {"h": h.numpy()}, h_next  # store the state the action was taken from


class DRQNLearner(rlflow.Learner):
    def __init__(self):
        self.q, self.target = DRQN(), DRQN()
        self.target.load_state_dict(self.q.state_dict())
        self.opt, self.updates = torch.optim.Adam(self.q.parameters(), lr=1e-3), 0

    def step(self, sample):
        d, mask = sample.to_torch().data, torch.as_tensor(sample.mask)  # each leaf [B, LENGTH, ...]
        h0 = d["extras"]["h"][:, 0]  # the stored state at each window's first row
        q = self.q.unroll(d["observation"], h0)
        with torch.no_grad():
            q_next = self.target.unroll(d["observation"], h0)[:, 1:].max(-1).values
            y = d["reward"][:, :-1] + 0.99 * torch.where(d["terminated"][:, :-1], 0.0, q_next)
        valid = mask[:, :-1] & mask[:, 1:] & ~d["last"][:, :-1]  # steps whose next row is in the window
        chosen = q[:, :-1].gather(-1, d["action"][:, :-1, None])[..., 0]
        loss = nn.functional.smooth_l1_loss(chosen[valid], y[valid])
        self.opt.zero_grad(), loss.backward(), self.opt.step()
        self.updates += 1
        if self.updates % 250 == 0:
            self.target.load_state_dict(self.q.state_dict())
        return {"loss": loss.item(), "steps": valid.sum().item()}

    def get_params(self):
        return self.q


learner = DRQNLearner()
result = rlflow.run(env, RecurrentEpsilonGreedy(learner.q), learner, adder, table, steps=steps, batch_size=32,
                    eval_env=envs.make("CartPole-v1", num_envs=None), eval_every=steps // 4, seed=0)
print(f"final evaluation: {result.final_evaluation:.1f} after {result.env_steps} env steps (a GRU policy), "
      f"{result.learner_steps} learner steps on sequences of {LENGTH} rows")
