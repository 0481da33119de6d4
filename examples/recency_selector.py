"""A selector of one's own: items drawn by how recently they came.

Item ``i``, the table's ``seq_i``-th insert, is drawn with probability ``P(i) = exp(-rate * (newest - seq_i)) /
sum_j exp(-rate * (newest - seq_j))`` over the items held. With ``rate > 0`` newer items are drawn more often
(a sampler that favours recent experience); with ``rate < 0`` older ones are (a remover that evicts mostly
old items, keeping a few for a long time); ``rate = 0`` is uniform. docs/extending.md walks through it.

    python examples/recency_selector.py
"""

import numpy as np

from rlflow import specs
from rlflow.replay import SampleToInsertRatio, Selector, StepStore, Table


class Recency(Selector):
    def __init__(self, rate: float, seed: int | None = None) -> None:
        super().__init__(seed)
        self.rate = float(rate)

    def allocate(self) -> None:
        self.seqs = np.full(self.capacity, -1, np.int64)  # each slot's insert number; -1: no item

    def insert(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray) -> None:
        self.seqs[slots] = seqs
        self.size += len(slots)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass  # recency alone decides

    def delete(self, slots: np.ndarray) -> None:
        self.seqs[slots] = -1
        self.size -= len(slots)

    def weights(self) -> np.ndarray:
        """Each slot's unnormalised weight (0 where no item is), the largest 1."""
        held = self.seqs >= 0
        logits = np.where(held, self.rate * self.seqs.astype(np.float64), -np.inf)  # -rate * age, up to a constant
        return np.exp(logits - logits[held].max())

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.weights()
        p /= p.sum()
        slots = self.rng.choice(self.capacity, size=n, p=p)
        return slots, p[slots]

    def sequential_weights(self, slots: np.ndarray, retires: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``j``'s probability among the items the draws before it did not retire (max_times_sampled)."""
        weights = self.weights()
        w = weights[slots]
        gone = np.cumsum(w * retires) - w * retires  # the weight retired before each draw
        return w / (weights.sum() - gone), np.ones(len(slots), np.float32)

    def config(self) -> dict:
        return {"rate": self.rate, "seed": self.seed}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"seqs": self.seqs.copy()}

    def load_arrays(self, state: dict) -> None:
        self.seqs[:] = state["seqs"]


def main() -> None:
    store = StepStore({"obs": specs.Field((), np.float32)}, capacity=10_000)
    table = Table(store, sampler=Recency(rate=0.01, seed=0), remover=Recency(rate=-0.01, seed=1), max_size=1_000,
                  rate_limiter=SampleToInsertRatio(samples_per_insert=4, min_size_to_sample=100, error_buffer=400))
    for block in range(50):  # 50 blocks of 100 one-step items (obs: the step's number), sampled as the ratio allows
        steps = np.arange(100 * block, 100 * block + 100, dtype=np.float32)
        rows = store.extend(0, {"obs": steps}, first=np.arange(100) == 0)
        table.insert(np.zeros(100, np.int64), rows, 1)
        while table.can_sample(64):
            ages = steps[-1] - table.sample(64).data["obs"][:, 0]
    print(f"{table.size} items held; the last batch drew items {np.median(ages):.0f} steps old (median), "
          f"{ages.max():.0f} at most")


if __name__ == "__main__":
    main()
