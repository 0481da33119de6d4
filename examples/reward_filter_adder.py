"""An adder of one's own: n-step transitions that keep every transition with a non-zero return, and a fixed
``share`` of the others (sparse-reward tasks fill a table with zero-reward steps otherwise). It overrides the
one place items enter the tables, ``insert_items``; its random generator is part of its checkpoint state.
docs/extending.md walks through it.

    python examples/reward_filter_adder.py
"""

import numpy as np
from custom_env import CorridorEnv, Random  # examples/custom_env.py

import rlflow
from rlflow import adders
from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform


class RewardFilter(adders.NStepTransition):
    def __init__(self, store, tables, *, share: float, seed: int | None = None, **nstep) -> None:
        super().__init__(store, tables, **nstep)
        self.share = share
        self.rng = np.random.default_rng(seed)

    def insert_items(self, lanes, starts, lengths, fields, priorities=None) -> None:
        rewarded = (fields["return"].reshape(len(lanes), -1) != 0).any(axis=1)
        keep = rewarded | (self.rng.random(len(lanes)) < self.share)
        super().insert_items(lanes[keep], starts[keep], lengths[keep], {k: v[keep] for k, v in fields.items()},
                             None if priorities is None else priorities[keep])

    def state_dict(self) -> dict:
        return {**super().state_dict(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state) -> None:
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]  # a bad state raises here, before anything changes
        super().load_state_dict(state)
        self.rng = rng


def main() -> None:
    env = CorridorEnv(num_envs=4)
    store = StepStore(env.spec, capacity=5_000, lanes=env.num_envs)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = RewardFilter(store, [table], share=0.1, seed=0, n=3, discount=0.9)
    rlflow.run(env, Random(seed=0), None, adder, table, steps=4_000, progress=False)
    sample = table.sample(table.size)
    print(f"{table.size} of about 4,000 transitions kept; {np.mean(sample.data.reward != 0):.0%} of them rewarded")


if __name__ == "__main__":
    main()
