"""A recurrent policy with the ``Sequence`` adder: DRQN (a GRU Q-network) on CartPole-v1, whose state
rlflow's actor restarts at every episode start and whose learner starts each sampled window of 10 rows
from the state stored with its first row.

    python examples/recurrent_policy.py                 # 40,000 env steps
    python examples/recurrent_policy.py --steps 1200    # a quick check that it runs
"""

import argparse

import numpy as np
import torch
from torch import nn

import rlflow
from rlflow import adders, envs, specs
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform

HIDDEN = 64  # the GRU's state size
LENGTH = 10  # rows per sampled window


class DRQN(nn.Module):
    """CartPole's observation -> a linear layer -> a GRU cell -> one Q-value per action."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, HIDDEN)
        self.gru = nn.GRUCell(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, 2)

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``obs [N, 4]`` and the state ``h [N, HIDDEN]`` -> ``Q [N, 2]`` and the next state."""
        h = self.gru(torch.relu(self.inp(torch.as_tensor(obs))), h)
        return self.out(h), h

    def unroll(self, obs: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Sequences ``obs [B, L, 4]`` from the states ``h [B, HIDDEN]`` -> ``Q [B, L, 2]``."""
        qs = []
        for t in range(obs.shape[1]):
            q, h = self(obs[:, t], h)
            qs.append(q)
        return torch.stack(qs, 1)


class RecurrentEpsilonGreedy(rlflow.Policy):
    """Epsilon-greedy on the GRU's Q-values (epsilon falls from 1 to 0.05 over the first 30% of the run's
    steps; 0 in evaluation). Its state is the GRU's; each step stores the state it started from as the
    extra ``h``."""

    def __init__(self, q: DRQN, total_steps: int) -> None:
        self.q = q
        self.decay_steps = 0.3 * total_steps
        self.steps = 0
        self.rng = np.random.default_rng(0)

    def initial_state(self, batch_size):
        return torch.zeros(batch_size, HIDDEN)

    def act(self, observation, h, *, evaluation=False):
        epsilon = 0.0
        if not evaluation:
            self.steps += len(observation)
            epsilon = max(0.05, 1 - self.steps / self.decay_steps)
        with torch.no_grad():
            q, h_next = self.q(observation, h)
        greedy = q.argmax(1).numpy()
        explore = self.rng.random(len(observation)) < epsilon
        random = self.rng.integers(0, 2, len(observation))
        actions = np.where(explore, random, greedy)
        return actions, {"h": h.numpy()}, h_next


class DRQNLearner(rlflow.Learner):
    """Unrolls the GRU over each window from its stored first state and regresses Q on ``r + gamma * max
    Q_target(next row)`` (0 after termination; after a time limit the next row is the stored final
    observation) on the steps whose next row is in the window."""

    def __init__(self) -> None:
        self.q = DRQN()
        self.target = DRQN()
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-3)
        self.updates = 0

    def step(self, sample):
        rows = sample.to_torch().data  # each leaf [B, LENGTH, ...]
        mask = torch.as_tensor(sample.mask)  # [B, LENGTH]: False on the padding after an episode's end
        h0 = rows["extras"]["h"][:, 0]  # the stored state at each window's first row
        q = self.q.unroll(rows["observation"], h0)
        with torch.no_grad():
            q_next = self.target.unroll(rows["observation"], h0)[:, 1:].max(-1).values
            y = rows["reward"][:, :-1] + 0.99 * torch.where(rows["terminated"][:, :-1], 0.0, q_next)
        valid = mask[:, :-1] & mask[:, 1:] & ~rows["last"][:, :-1]  # steps whose next row is in the window
        q_taken = q[:, :-1].gather(-1, rows["action"][:, :-1, None])[..., 0]
        loss = nn.functional.smooth_l1_loss(q_taken[valid], y[valid])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        if self.updates % 250 == 0:
            self.target.load_state_dict(self.q.state_dict())
        return {"loss": loss.item(), "steps": valid.sum().item()}

    def get_params(self):
        return self.q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40_000)
    steps = parser.parse_args().steps
    torch.manual_seed(0)

    # Each step's row carries the GRU state it started from (the extra "h"). The Sequence adder writes
    # overlapping windows of LENGTH rows, one every 5 rows, that never cross an episode's end (zero_pad).
    env = envs.make("CartPole-v1", num_envs=4, seed=0)
    store = StepStore(env.step_spec({"h": specs.Field((HIDDEN,), np.float32)}), capacity=10_000, lanes=env.num_envs)
    limiter = SampleToInsertRatio(samples_per_insert=40, min_size_to_sample=100, error_buffer=500)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=limiter)
    adder = adders.Sequence(store, [table], length=LENGTH, period=5, end_behavior="zero_pad")

    learner = DRQNLearner()
    policy = RecurrentEpsilonGreedy(learner.q, steps)
    eval_env = envs.make("CartPole-v1", num_envs=None)
    result = rlflow.run(env, policy, learner, adder, table, steps=steps, batch_size=32, eval_env=eval_env,
                        eval_every=steps // 4, seed=0)
    print(f"done after {result.env_steps} env steps (a GRU policy), {result.learner_steps} learner steps on "
          f"sequences of {LENGTH} rows")


if __name__ == "__main__":
    main()
