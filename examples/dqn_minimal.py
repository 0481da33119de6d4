"""DQN on CartPole-v1 in 32 lines of code (blank lines, comments and docstrings not counted; tests/test_examples.py
counts them): the learner (14 of them) is the algorithm; rlflow gives the env, the replay, the epsilon-greedy
policy and the loop. Its greedy evaluation at 50,000 env steps is 500 (the most a CartPole episode pays) on
seeds 0, 1 and 2 (benchmarks/RESULTS.md, 2026-11-26); the full baseline, with options and logging, is
baselines/dqn.py.

    python examples/dqn_minimal.py                        # seed 0, 50,000 env steps, a minute or two
    python examples/dqn_minimal.py --seed 1 --steps 1500  # another seed; a quick check that it runs
"""

import torch
import tyro
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import rlflow
from rlflow import adders, envs, policies
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform


class DQN(rlflow.Learner):
    """Double DQN on 3-step transitions: the Huber loss of Q(s, a) against R + discount * Q_target(s', a*), a* the
    online network's choice (R sums 3 rewards; the sample's discount is 0.99^3, or 0 after termination); the
    target network is an exponential moving average of the online one (2% of the way to it every step)."""

    def __init__(self, q: nn.Module) -> None:
        self.q, self.target = q, AveragedModel(q, multi_avg_fn=get_ema_multi_avg_fn(0.98)).requires_grad_(False)
        self.optimizer = torch.optim.Adam(q.parameters(), lr=2.3e-3)

    def step(self, sample):
        batch = sample.to_torch().data  # a Transition of [64, ...] tensors
        best = self.q(batch.next_observation).argmax(1, keepdim=True)  # double Q: the online net picks the action
        y = batch.reward + batch.discount * self.target(batch.next_observation).gather(1, best)[:, 0]
        loss = nn.functional.smooth_l1_loss(self.q(batch.observation).gather(1, batch.action[:, None])[:, 0], y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.target.update_parameters(self.q)
        return {"loss": loss.item()}


def main(seed: int = 0, steps: int = 50_000) -> None:
    torch.manual_seed(seed)
    env, eval_env = envs.make("CartPole-v1", seed=seed), envs.make("CartPole-v1")
    # Every step stored once; one 3-step transition item per action, 16 samples drawn per stored transition
    store = StepStore(env.spec, capacity=50_000)
    table = Table(store, sampler=Uniform(seed=seed), remover=Fifo(), rate_limiter=SampleToInsertRatio(16, 1_000, 200))
    q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    # The policy acts with the network the learner trains: epsilon falls from 1 to 0.04 over 16% of the steps
    policy = policies.EpsilonGreedy(q, 2, decay_steps=int(0.16 * steps), end=0.04, seed=seed)
    rlflow.run(env, policy, DQN(q), adders.NStepTransition(store, [table], n=3), table, steps=steps, batch_size=64,
               eval_env=eval_env, eval_every=steps // 5, seed=seed)  # prints each evaluation


if __name__ == "__main__":
    tyro.cli(main)
