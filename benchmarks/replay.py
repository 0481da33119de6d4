"""Replay speed and memory: rlflow against cpprb, TorchRL, Tianshou, Stable-Baselines3 and flexibuff.

Every library runs the same cases in one process run (see ``peers.py`` for the cases, the input pools and
each peer's API). Each peer is set up together with rlflow and the numpy limit (plain preallocated arrays
doing only the memory traffic), and the three are timed in rotating order, round after round; the table
reports medians over the rounds, each peer's time divided by rlflow's, and both divided by the numpy
limit. torch runs with one intra-op thread (set in ``peers.py``).

rlflow writes every step through its n-step transition adder: each observation is stored once as a row
of a ``StepStore`` lane, and each action gives one item (a window of rows) in a ``Table``;
``next_observation`` is a later row, never a copy.

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

from rlflow import ReplayBuffer, adders, specs
from rlflow.replay import Fifo, MinSize, Prioritized, RowTable, StepStore, Table, Uniform
from rlflow.types import TimeStep, step_spec


class RlflowAdapter(peers._Base):
    """rlflow: a StepStore, an n-step transition adder and a table: a RowTable for the uniform cases (or, with
    ``--table table``, a Table with a Uniform sampler and a Fifo remover), a Table with a Prioritized sampler
    and a Fifo remover for the ``per`` case.

    Every row is written once, through ``adders.NStepTransition`` (n = 1, or ``case.nstep``); the table's
    items are windows of rows and sampling returns ``Transition`` batches (``next_observation`` is the
    row ``k`` steps later, never a copy). Episode ends are the pool's ``done`` flags, as terminations with
    a same-step reset. The batched add cases take the peer's layout (``add_layout``): 256 consecutive
    steps of one env (``NStepTransition.add_steps`` on one lane) or one step of 256 envs (``stage``
    with one row per lane on 256 lanes: checked at once, written 64 steps at a time, the flushes inside
    the timed calls). The facade cases time the public ``ReplayBuffer`` as a user's loop calls it:
    ``add_one`` and ``add_one_nstep3`` its ``add`` of one transition (1-step and 3-step), ``extend`` and
    ``extend_nstep3`` its ``extend`` of 256 consecutive transitions of one env, ``extend_per`` the same into a
    prioritized buffer. Sample cases fill 256 lanes (32 for pixels).
    """

    name = "rlflow"

    def available(self) -> str | None:
        return None

    def supports(self, case: Case) -> bool:
        return True

    def describe(self, case: Case) -> str:
        n = f"NStepTransition(n={case.nstep})"
        if case.facade:
            kind = "ReplayBuffer(prioritized=True)" if case.prioritized else "ReplayBuffer"
            return f"{kind}.add (one env)" if case.batch == 1 else f"{kind}.extend ({case.batch} steps)"
        if case.op == "add":
            if self.add_layout == "stream":
                return f"{n}.add_steps, {case.batch} steps of one lane"
            return f"{n}.stage, {case.batch} lanes"
        return {"sample": f"{'RowTable' if UNIFORM_TABLE == 'row' else 'Table'}.sample (Uniform) of {n} items",
                "per": f"Table.sample (Prioritized) + update_priorities of {n} items"}[case.op]

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        pool = get_pool(case)
        if case.facade:
            self._setup_buffer(case, pool)
            return
        if case.op == "add" and self.add_layout == "stream":
            self._setup_stream(case, pool)
            return
        lanes = case.batch if case.op == "add" else (32 if case.pixel else 256)
        self._make(case, lanes)
        steps = []
        for k in range(pool.rows // lanes):
            lo, hi = k * lanes, (k + 1) * lanes
            done = pool.done[lo:hi]
            z = np.zeros(lanes, bool)
            steps.append((pool.act[lo:hi], TimeStep(
                observation=pool.frames[hi: hi + lanes] if hi + lanes <= pool.rows else pool.frames[:lanes],
                reward=pool.rew[lo:hi], terminated=done, truncated=z, first=done, last=done,
                final_observation=pool.next_obs(lo, lanes) if done.any() else None)))
        self._items = steps
        self.adder.add_first(TimeStep(pool.frames[:lanes], np.zeros(lanes, np.float32), np.zeros(lanes, bool),
                                      np.zeros(lanes, bool), np.ones(lanes, bool), np.zeros(lanes, bool)))
        while int(self.store.count.min()) < self.store.capacity:
            self.adder.add(*self._next_item())
        if case.op == "per":
            self._prios = list(pool.priorities.astype(np.float64))

    def _make(self, case: Case, lanes: int) -> None:
        spec = step_spec(specs.Field(case.obs_shape, case.obs_dtype), specs.Field((case.act_dim,), case.act_dtype))
        self.store = StepStore(spec, capacity=case.capacity // lanes, lanes=lanes)
        if case.op == "per":
            self.table = Table(self.store, sampler=Prioritized(peers.PER_ALPHA, peers.PER_BETA, seed=0),
                               remover=Fifo(), rate_limiter=MinSize(1))
        elif UNIFORM_TABLE == "row":  # each item in its start row's slot
            self.table = RowTable(self.store, seed=0, rate_limiter=MinSize(1))
        else:
            self.table = Table(self.store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
        self.adder = adders.NStepTransition(self.store, [self.table], n=case.nstep, discount=case.gamma)

    def _setup_stream(self, case: Case, pool: Any) -> None:
        """Batched adds of one env: ``add_steps`` of ``case.batch`` consecutive steps on one lane.

        An episode ends (terminates) wherever the pool's ``done`` is set, and the next step starts the next
        episode from the pool's next frame, as a one-env loop with same-step resets would see them: each
        end gives a row of ``first_observations`` (one after the last step too, when it ends). The calls'
        arguments are sliced in advance, as the peers' are.
        """
        self._make(case, 1)
        b = case.batch
        for k in range(pool.rows // b):
            a, z = k * b, (k + 1) * b
            done = pool.done[a:z]
            firsts = pool.frames[np.flatnonzero(done) + a + 1]  # frames[z] is the next batch's first observation
            self._items.append((pool.act[a:z], pool.rew[a:z], pool.frames[a + 1:z + 1], done, firsts))
        one, no = np.ones(1, bool), np.zeros(1, bool)
        self.adder.add_first(TimeStep(pool.frames[:1], np.zeros(1, np.float32), no, no, one, no))
        while int(self.store.count[0]) < self.store.capacity:
            self._add_stream()

    def _add_stream(self) -> None:
        act, rew, nxt, done, firsts = self._next_item()
        self.adder.add_steps(0, act, rew, nxt, terminated=done, first_observations=firsts)

    def _setup_buffer(self, case: Case, pool: Any) -> None:
        """The ReplayBuffer facade (one env), filled in blocks through the adder's add_steps, then timed as a
        user's loop calls it: ``add`` of one transition, or ``extend`` of ``case.batch`` consecutive ones.

        The stream continues from the last stored observation: frames i -> i + 1. Each call's ``obs`` is a
        view made for it, equal in value to the previous call's ``next_obs`` but not the same object, as a
        loop that copies or patches its observations hands them over."""
        obs, act = specs.Field(case.obs_shape, case.obs_dtype), specs.Field((case.act_dim,), case.act_dtype)
        self.buf = ReplayBuffer(obs, act, capacity=case.capacity, n_step=case.nstep, discount=case.gamma,
                                prioritized=case.prioritized)
        self.store, self.table, self.adder = self.buf.store, self.buf.table, self.buf.adder
        self.buf.add(pool.frames[0], pool.act[0], pool.rew[0], pool.frames[1], False, False)
        self.buf.flush()
        written = 1
        while written < case.capacity:
            n = min(pool.rows - 1, case.capacity - written)
            self.adder.add_steps(0, pool.act[1:n + 1], pool.rew[1:n + 1], pool.frames[2:n + 2])
            written += n
        f = pool.frames
        if case.batch == 1:
            self._items = [(f[i + 1], pool.act[i], pool.rew[i], f[i + 2], pool.done[i], False)
                           for i in range(peers.ADD_ONE_CYCLE)]
            return
        b = case.batch
        no = np.zeros(b, bool)
        self._items = [(f[a + 1:a + b + 1], pool.act[a:a + b], pool.rew[a:a + b], f[a + 2:a + b + 2],
                        pool.done[a:a + b], no) for a in range(0, pool.rows - b - 2, b)]

    def run_once(self, case: Case) -> None:
        if case.facade:
            (self.buf.add if case.batch == 1 else self.buf.extend)(*self._next_item())
        elif case.op == "add" and self.add_layout == "stream":
            self._add_stream()
        elif case.op == "add":
            self.adder.stage(*self._next_item())  # written 64 steps at a time, as rlflow.run and ReplayBuffer do
        elif case.op == "per":
            sample = self.table.sample(case.batch)
            self.table.update_priorities(sample.keys, self._prios[self._step % len(self._prios)])
            self._step += 1
        else:
            self._out = self.table.sample(case.batch)

    def teardown(self) -> None:
        super().teardown()
        self.store = self.table = self.adder = self.buf = self._out = None  # type: ignore[assignment]


WARMUP_ROUNDS = 2  # timed but not counted
UNIFORM_TABLE = "row"  # the uniform cases' table: "row" (RowTable) or "table" (Table, Uniform sampler); --table

ADAPTERS_ALL = {"rlflow": RlflowAdapter, **ADAPTERS}


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
    adapters["rlflow"].add_layout = adapters[peer].add_layout  # batched adds in the peer's layout
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
    parser.add_argument("--table", choices=["row", "table"], default="row",
                        help="the uniform cases' table: RowTable, or Table with a Uniform sampler")
    args = parser.parse_args(argv)
    global UNIFORM_TABLE
    UNIFORM_TABLE = args.table
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
