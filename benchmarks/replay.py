"""Replay speed and memory: rlflow against cpprb, TorchRL, Tianshou, Stable-Baselines3 and flexibuff.

Every library runs the same cases in one process run (see ``peers.py`` for the cases, the input pools and
each peer's API). Each peer is set up together with rlflow and the numpy limit (plain preallocated arrays
doing only the memory traffic), and the three are timed in rotating order, round after round; the table
reports medians over the rounds, each peer's time divided by rlflow's, and both divided by the numpy
limit. torch runs with one intra-op thread (set in ``peers.py``).

rlflow stores each step once as a row of a ``StepStore`` lane and inserts one two-row transition item
(row t, row t + 1) per step into a ``Table``; ``next_observation`` is the next row, never a copy.

    python benchmarks/replay.py                      # every case, every peer
    python benchmarks/replay.py --cases per --peers cpprb tianshou
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
from peers import ADAPTERS, CASES, Case, get_pool

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


class RlflowUncheckedAdapter(RlflowAdapter):
    """rlflow's add cases with ``checked=False``: what input validation costs on the write path."""

    name = "rlflow-unchecked"

    def supports(self, case: Case) -> bool:
        return case.op == "add"

    def describe(self, case: Case) -> str:
        return "StepStore.append/extend(checked=False) + Table.insert" if case.op == "add" else "add cases only"

    def run_once(self, case: Case) -> None:
        item = self._next_item()
        if case.batch == 1:
            row = self.store.append(item, lanes=self.zero, checked=False)
            self.table.insert(self.zero, row - 1, 2)
        else:
            written = self.store.extend(0, item, checked=False)
            self.table.insert(self._lanes, written - 1, 2)


WARMUP_ROUNDS = 2  # timed but not counted

ADAPTERS_ALL = {"rlflow": RlflowAdapter, **ADAPTERS, "rlflow-unchecked": RlflowUncheckedAdapter}


@dataclass
class Group:
    """One peer timed against rlflow and the numpy limit, interleaved in the same rounds."""

    case: str
    peer: str
    times: dict[str, list[float]] = field(default_factory=dict)
    rss: dict[str, int] = field(default_factory=dict)
    note: str = ""

    def median(self, name: str) -> float | None:
        t = self.times.get(name)
        return statistics.median(t) if t else None


def run_group(case: Case, peer: str, rounds: int, target_s: float) -> Group:
    """Set up numpy, rlflow and ``peer`` together, then time them in rotating order, ``rounds`` times.

    Interleaving makes the three see the same machine: drift in memory bandwidth, other tenants and the
    allocator's state affect them alike, so their ratios hold even when absolute times wander.
    """
    group = Group(case.name, peer)
    names = list(dict.fromkeys(["numpy", "rlflow", peer]))
    adapters = {name: ADAPTERS_ALL[name]() for name in names}
    for name, adapter in list(adapters.items()):
        reason = adapter.available() or (None if adapter.supports(case) else adapter.describe(case))
        if reason is not None:
            group.note = reason
            del adapters[name]
    if peer not in adapters:
        return group
    peers.warm_allocator()
    inner: dict[str, int] = {}
    try:
        for name, adapter in adapters.items():
            gc.collect()
            before = peers.rss_bytes()
            adapter.setup(case, np.random.default_rng(0))
            group.rss[name] = peers.rss_bytes() - before
            probe = peers.time_adapter(adapter, case, repeats=1, target_s=target_s / 5)
            inner[name] = max(1, round(target_s / max(probe[0], 1e-9)))
        for r in range(-WARMUP_ROUNDS, rounds):  # the first rounds settle page faults and huge pages
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                if name in adapters:
                    t = peers.time_adapter(adapters[name], case, repeats=1, inner=inner[name], warmup=1)
                    if r >= 0:
                        group.times.setdefault(name, []).extend(t)
        group.note = adapters[peer].describe(case)
    except Exception as exc:  # a peer failing on one case is reported, not fatal
        group.note = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        for adapter in adapters.values():
            adapter.teardown()
        gc.collect()
    return group


def table(groups: list[Group]) -> str:
    """Per case and peer: medians (us), peer/rlflow, and each as a multiple of the numpy limit."""
    lines = [f"{'case':<10} {'peer':<10} {'peer us':>9} {'rlflow us':>9} {'peer/rlflow':>11} {'rlflow x np':>11} "
             f"{'peer x np':>9}  {'memory (pixel: x one copy)':<26}", "-" * 104]
    for g in groups:
        peer, ours, limit = g.median(g.peer), g.median("rlflow"), g.median("numpy")
        if peer is None or ours is None or limit is None:
            lines.append(f"{g.case:<10} {g.peer:<10} {g.note}")
            continue
        mem = ""
        case = CASES[g.case]
        if case.pixel:
            one = case.capacity * case.obs_nbytes
            mem = f"rlflow x{g.rss['rlflow'] / one:.2f}, {g.peer} x{g.rss[g.peer] / one:.2f}"
        lines.append(f"{g.case:<10} {g.peer:<10} {peer * 1e6:>9.1f} {ours * 1e6:>9.1f} {peer / ours:>11.2f} "
                     f"{ours / limit:>11.2f} {peer / limit:>9.2f}  {mem}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    others = [p for p in ADAPTERS_ALL if p not in ("numpy", "rlflow")]
    parser.add_argument("--peers", nargs="*", default=others, choices=others)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (medians are over these)")
    parser.add_argument("--target-s", type=float, default=0.1, help="seconds per timed round")
    args = parser.parse_args(argv)
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}; medians of {args.rounds} interleaved rounds; "
          "torch intra-op threads: 1", flush=True)
    groups: list[Group] = []
    for case_name in args.cases:
        for peer in args.peers:
            g = run_group(CASES[case_name], peer, args.rounds, args.target_s)
            groups.append(g)
            mine, theirs = g.median("rlflow"), g.median(peer)
            shown = g.note if mine is None or theirs is None else f"{theirs * 1e6:.1f} us vs rlflow {mine * 1e6:.1f} us"
            print(f"  {case_name:<10} {peer:<10} {shown}", flush=True)
        peers._POOLS.pop(case_name, None)
        gc.collect()
    print()
    print(table(groups))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
