"""Replay speed and memory: rlflow against cpprb, TorchRL, Tianshou, Stable-Baselines3 and flexibuff.

Every library runs the same cases in one process run (see ``peers.py`` for the cases, the input pools and
each peer's API); the table reports medians of repeats, each peer's time divided by rlflow's, and every
time divided by the numpy limit (plain preallocated arrays doing only the memory traffic). torch runs
with one intra-op thread (set in ``peers.py``).

rlflow stores each step once as a row of a ``StepStore`` lane and inserts one two-row transition item
(row t, row t + 1) per step into a ``Table``; ``next_observation`` is the next row, never a copy.

    python benchmarks/replay.py                      # every case, every peer
    python benchmarks/replay.py --cases per --peers rlflow cpprb numpy
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
from peers import ADAPTERS, CASES, Case, Result, get_pool, run_case

from rlflow import specs
from rlflow.replay import Fifo, MinSize, Prioritized, StepStore, Table, Uniform


class RlflowAdapter(peers._Base):
    """rlflow: StepStore rows + a Table of two-row transition items (Uniform or Prioritized sampler)."""

    name = "rlflow"

    def available(self) -> str | None:
        return None

    def supports(self, case: Case) -> bool:
        return True

    def describe(self, case: Case) -> str:
        return {
            "add": "StepStore.append/extend + Table.insert of (row, 2) items",
            "sample": "Table.sample (Uniform)",
            "per": "Table.sample (Prioritized) + update_priorities",
        }[case.op]

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        pool = get_pool(case)
        spec = {
            "observation": specs.Field(case.obs_shape, case.obs_dtype),
            "action": specs.Field((case.act_dim,), case.act_dtype),
            "reward": specs.Field((), np.float32),
            "terminated": specs.Field((), np.bool_),
        }
        self.store = StepStore(spec, capacity=case.capacity)
        sampler = Prioritized(peers.PER_ALPHA, peers.PER_BETA, seed=0) if case.op == "per" else Uniform(seed=0)
        self.table = Table(self.store, sampler=sampler, remover=Fifo(), rate_limiter=MinSize(1))
        self.zero = np.zeros(1, np.int64)

        def rows(start: int, n: int) -> dict[str, Any]:
            return {
                "observation": pool.obs(start, n),
                "action": pool.act[start : start + n],
                "reward": pool.rew[start : start + n],
                "terminated": pool.done[start : start + n],
            }

        chunk = min(pool.rows, case.capacity)
        while int(self.store.count[0]) < case.capacity:
            n = min(chunk, case.capacity - int(self.store.count[0]))
            written = self.store.extend(0, rows(0, n))
            starts = written - 1 if written[0] > 0 else written[:-1]
            self.table.insert(np.zeros(starts.size, np.int64), starts, 2)
        if case.op == "add" and case.batch == 1:
            self._items = [{k: v[:1] for k, v in rows(i, 1).items()} for i in range(peers.ADD_ONE_CYCLE)]
        elif case.op == "add":
            self._items = [rows(k * case.batch, case.batch) for k in range(pool.n_batches(case.batch))]
            self._lanes = np.zeros(case.batch, np.int64)
        elif case.op == "per":
            self._prios = list(pool.priorities.astype(np.float64))

    def run_once(self, case: Case) -> None:
        if case.op == "add":
            item = self._next_item()
            if case.batch == 1:
                row = self.store.append(item, lanes=self.zero)
                self.table.insert(self.zero, row - 1, 2)
            else:
                written = self.store.extend(0, item)
                self.table.insert(self._lanes, written - 1, 2)
        elif case.op == "per":
            sample = self.table.sample(case.batch)
            self.table.update_priorities(sample.keys, self._prios[self._step % len(self._prios)])
            self._step += 1
        else:
            self._out = self.table.sample(case.batch)

    def teardown(self) -> None:
        super().teardown()
        self.store = self.table = self._out = None  # type: ignore[assignment]


ADAPTERS_ALL = {"rlflow": RlflowAdapter, **ADAPTERS}


def ratio_table(results: list[Result]) -> str:
    """Per case: each library's median, its ratio to the numpy limit, and peer time / rlflow time."""
    lines = [f"{'case':<10} {'library':<10} {'median us':>10} {'x numpy':>8} {'peer/rlflow':>12} {'RSS':>20}", "-" * 76]
    for case_name in dict.fromkeys(r.case for r in results):
        rows = [r for r in results if r.case == case_name]
        limit = next((r.median for r in rows if r.peer == "numpy" and r.median), None)
        ours = next((r.median for r in rows if r.peer == "rlflow" and r.median), None)
        case = CASES[case_name]
        for r in rows:
            if r.median is None:
                lines.append(f"{case_name:<10} {r.peer:<10} {r.note}")
                continue
            x_np = f"x{r.median / limit:.2f}" if limit else "-"
            vs = f"{r.median / ours:.2f}" if ours and r.peer != "rlflow" else "-"
            rss = "-"
            if case.pixel and r.rss_growth is not None:
                rss = f"{r.rss_growth / 2**30:.2f} GiB ({r.rss_growth / (case.capacity * case.obs_nbytes):.2f}x)"
            lines.append(f"{case_name:<10} {r.peer:<10} {r.median * 1e6:>10.1f} {x_np:>8} {vs:>12} {rss:>20}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--peers", nargs="*", default=list(ADAPTERS_ALL), choices=list(ADAPTERS_ALL))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target-s", type=float, default=0.1, help="seconds per timed repeat")
    args = parser.parse_args(argv)
    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}; medians of {args.repeats} repeats; "
        "torch intra-op threads: 1",
        flush=True,
    )
    results: list[Result] = []
    for case_name in args.cases:
        for peer in args.peers:
            res = run_case(ADAPTERS_ALL[peer](), CASES[case_name], args.repeats, args.target_s)
            shown = f"{res.median * 1e6:.1f} us" if res.median is not None else res.note
            print(f"  {case_name:<10} {peer:<10} {shown}", flush=True)
            results.append(res)
        peers._POOLS.pop(case_name, None)
        gc.collect()
    print()
    print(ratio_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
