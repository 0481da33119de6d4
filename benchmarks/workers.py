"""Env steps in worker processes: rlflow.run's throughput with 2 worker processes against 1.

The env is CartPole-v1 made to cost ``--cost-ms`` of CPU per step (a busy loop, as a physics engine
would), so the workers, not the loop, set the pace. Each lane is one gymnasium ``AsyncVectorEnv``
worker process; the loop, adder and table stay in the main process. Rounds alternate between 1 and 2
workers; medians are reported.

    python benchmarks/workers.py               # 1 ms per step, 3,000 env steps per round
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
from loop import RandomPolicy  # benchmarks/loop.py, beside this file

import rlflow
from rlflow import adders, envs
from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform


class CostlyCartPole(gym.Wrapper):
    """CartPole whose every step burns ``cost_ms`` of CPU time."""

    def __init__(self, cost_ms: float = 1.0) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.cost_s = cost_ms / 1000

    def step(self, action):
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


def throughput(workers: int, steps: int, cost_ms: float) -> float:
    """Env steps per second of rlflow.run over ``workers`` AsyncVectorEnv worker processes."""
    env = envs.GymEnvironment(gym.vector.AsyncVectorEnv(
        [lambda: CostlyCartPole(cost_ms)] * workers, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    store = StepStore(env.spec, capacity=steps // workers + 16, lanes=workers)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    start = time.perf_counter()
    result = rlflow.run(env, RandomPolicy(2), None, adder, table, steps=steps, progress=False, seed=0)
    seconds = time.perf_counter() - start
    env.close()
    return result.env_steps / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3_000)
    parser.add_argument("--cost-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for w in rates:
            rates[w].append(throughput(w, args.steps, args.cost_ms))
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"env cost {args.cost_ms} ms/step; medians of {args.rounds} rounds of {args.steps} env steps")
    print(f"| workers | env steps/s |\n|---:|---:|\n| 1 | {one:,.0f} |\n| 2 | {two:,.0f} |")
    print(f"2 workers / 1 worker: {two / one:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
