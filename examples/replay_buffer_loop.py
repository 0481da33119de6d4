"""rlflow's ``ReplayBuffer`` alone inside a training loop you already have (DQN on CartPole-v1): one ``add``
per env step, one ``sample`` per update; the env loop, the network and the optimiser are your own.

    python examples/replay_buffer_loop.py                 # 20,000 env steps
    python examples/replay_buffer_loop.py --steps 1200    # a quick check that it runs
"""

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlflow import ReplayBuffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    steps = parser.parse_args().steps
    torch.manual_seed(0)
    rng = np.random.default_rng(0)

    env = gym.make("CartPole-v1")
    # Stores each observation once; samples 3-step transitions whose discount is 0 after termination and
    # gamma^k otherwise (a truncated episode bootstraps from its true final observation).
    buffer = ReplayBuffer(env.observation_space, env.action_space, capacity=20_000, n_step=3, discount=0.99, seed=0)
    q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))
    target = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-3)

    obs, _ = env.reset(seed=0)
    returns = []
    episode_return = 0.0
    for step in range(steps):
        epsilon = max(0.05, 1 - step / (0.2 * steps))
        if rng.random() < epsilon:
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add(obs, action, reward, next_obs, terminated, truncated)  # one transition, as it happened
        episode_return += reward
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()

        if step >= 500 and step % 2 == 0:
            batch = buffer.sample(64).to_torch().data  # a Transition of [64, ...] tensors
            with torch.no_grad():
                y = batch.reward + batch.discount * target(batch.next_observation).max(1).values
            q_taken = q(batch.observation).gather(1, batch.action[:, None])[:, 0]
            loss = nn.functional.smooth_l1_loss(q_taken, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step % 500 == 0:
            target.load_state_dict(q.state_dict())

    print(f"{len(buffer)} transitions stored; mean return of the last 20 episodes after {steps} env steps: "
          f"{np.mean(returns[-20:]):.1f}")


if __name__ == "__main__":
    main()
