"""rlflow's ReplayBuffer inside a training loop you already have: one `add` per step, one `sample` per update.

Nothing else of rlflow is used: your env loop, your network, your optimiser. The buffer stores each
observation once and returns n-step transitions whose `discount` is 0 after termination and gamma^k
otherwise (truncation bootstraps from the true final observation).

    python examples/replay_buffer_loop.py      # 20,000 env steps of DQN on CartPole
"""

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlflow.replay import ReplayBuffer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20_000)
steps = parser.parse_args().steps
torch.manual_seed(0)
rng = np.random.default_rng(0)

env = gym.make("CartPole-v1")
buffer = ReplayBuffer(env.observation_space, env.action_space, capacity=20_000, n_step=3, discount=0.99, seed=0)
q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))
target = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))
target.load_state_dict(q.state_dict())
opt = torch.optim.Adam(q.parameters(), lr=1e-3)

obs, _ = env.reset(seed=0)
returns, episode_return = [], 0.0
for step in range(steps):
    eps = max(0.05, 1 - step / (0.2 * steps))
    with torch.no_grad():
        action = int(rng.integers(2)) if rng.random() < eps else int(q(torch.as_tensor(obs)).argmax())
    next_obs, reward, terminated, truncated, _ = env.step(action)
    buffer.add(obs, action, reward, next_obs, terminated, truncated)   # one transition, as it happened
    episode_return += reward
    obs = next_obs
    if terminated or truncated:
        returns.append(episode_return)
        episode_return = 0.0
        obs, _ = env.reset()
    if step >= 500 and step % 2 == 0:
        b = buffer.sample(64).to_torch().data                          # a Transition of [64, ...] tensors
        with torch.no_grad():
            y = b.reward + b.discount * target(b.next_observation).max(1).values
        loss = nn.functional.smooth_l1_loss(q(b.observation).gather(1, b.action[:, None])[:, 0], y)
        opt.zero_grad(), loss.backward(), opt.step()
    if step % 500 == 0:
        target.load_state_dict(q.state_dict())
print(f"{len(buffer)} transitions stored; mean return of the last 20 episodes after {steps} env steps: "
      f"{np.mean(returns[-20:]):.1f}")
