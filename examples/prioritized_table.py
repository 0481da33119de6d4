"""A ``StepStore`` and a prioritized ``Table`` filled and sampled by hand: a random policy plays CartPole-v1,
every step is stored once, each action becomes a two-row transition item, and sampled items get new
priorities from made-up TD errors.

    python examples/prioritized_table.py                               # 5,000 env steps
    python examples/prioritized_table.py --steps 1500 --capacity 800   # a quick check that it runs
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

from rlflow import specs
from rlflow.replay import Fifo, Prioritized, SampleToInsertRatio, StepStore, Table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--capacity", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = gym.make("CartPole-v1")
    step_spec = {
        "observation": specs.from_space(env.observation_space),
        "action": specs.from_space(env.action_space),
        "reward": specs.Field((), np.float32),
        "terminated": specs.Field((), np.bool_),
        "truncated": specs.Field((), np.bool_),
    }
    store = StepStore(step_spec, capacity=args.capacity)
    table = Table(
        store,
        sampler=Prioritized(alpha=0.6, beta=0.4, seed=args.seed),
        remover=Fifo(),
        rate_limiter=SampleToInsertRatio(samples_per_insert=4.0, min_size_to_sample=500, error_buffer=512.0),
    )
    rng = np.random.default_rng(args.seed)
    obs, _ = env.reset(seed=args.seed)
    first = True  # the next row starts an episode
    episodes = 0
    sampled = 0
    updates = 0
    for _ in range(args.steps):
        action = int(rng.integers(2))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # This row: the observation and the action taken from it, with what that action brought.
        row = store.append({"observation": obs[None], "action": [action], "reward": [reward],
                            "terminated": [terminated], "truncated": [truncated]}, first=np.array([first]))
        if not first:
            table.insert([0], row - 1, 2)  # the transition (previous row -> this row)
        first = False
        obs = next_obs
        if terminated or truncated:
            # The episode's last row holds its final observation, with a zero action.
            last = store.append({"observation": obs[None], "action": [0], "reward": [0.0],
                                 "terminated": [terminated], "truncated": [truncated]})
            table.insert([0], last - 1, 2)
            obs, _ = env.reset()
            first = True
            episodes += 1
        while table.can_sample(args.batch_size):
            sample = table.sample(args.batch_size)
            td_error = rng.random(args.batch_size) + 1e-3
            table.update_priorities(sample.keys, td_error)
            sampled += len(sample)
            updates += 1
    obs_batch = sample.data["observation"]
    print(f"env steps: {args.steps}, episodes finished: {episodes}")
    print(f"store: {len(store)} rows alive of {store.capacity}, {store.nbytes / 1e3:.0f} kB")
    print(f"table: {table.size} transition items; {table.rate_limiter}")
    print(f"sampled {sampled} items in {updates} batches of {args.batch_size}, priorities updated after each")
    print(f"last batch: observation {obs_batch.shape} (item, row, feature), importance weights "
          f"{sample.weights.min():.3f}..{sample.weights.max():.3f}")


if __name__ == "__main__":
    main()
