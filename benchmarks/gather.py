"""StepStore gathers: the two choices behind ``StepStore.take``, measured.

- ``rows``: one column of 1,000,000 rows, a gather of 256 random rows and of 32 windows of 26 rows, by
  the compiled core's small-row gather (``take_rows``, which requests every row's cache lines first, then copies
  them as bytes) and by ``np.take``,
  for rows of 3 to 512 bytes. Rows up to ``storage._SMALL_ROW`` bytes go to the kernel.
- ``prefetch``: 32 windows of 26 rows from a store of 1,000,000 rows with the columns of a 3-agent
  multi-agent row (11 columns, 481 bytes a row), ``StepStore.take`` with and without its first pass that
  requests every cache line of the rows in every column (the core's ``prefetch_rows``).

Fresh random indices on every call (a pool larger than the CPU caches can hold the gathered rows of), the
variants timed in alternating rounds; medians over rounds, in us per gather, from one run.

    python benchmarks/gather.py
    python benchmarks/gather.py --cases rows --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlflow import _core
from rlflow.replay import StepStore, storage
from rlflow.specs import Field

ROWS, POOL = 1_000_000, 2_000


def timed(variants: dict[str, Callable[[Any], Any]], pool: list[Any], rounds: int, calls: int) -> dict[str, float]:
    """Median us per call of each variant, the variants alternating round after round."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for f in variants.values():  # compile and warm up
        f(pool[0])
    for _ in range(rounds):
        for name, f in variants.items():
            start = time.perf_counter()
            for i in range(calls):
                f(pool[i % len(pool)])
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def windows(rng: np.random.Generator, rows: int) -> np.ndarray:
    return (rng.integers(0, rows - 26, 32)[:, None] + np.arange(26)).reshape(-1)


def rows_case(rounds: int) -> None:
    rng = np.random.default_rng(0)
    print("| row | bytes | indices | take_rows (us) | np.take (us) | gathered by |")
    print("|---|---:|---|---:|---:|---|")
    for dtype, width in [(np.bool_, 3), (np.float32, 3), (np.float32, 16), (np.float32, 17), (np.float32, 24),
                         (np.float32, 28), (np.float32, 54), (np.float32, 128)]:
        col = np.ones((ROWS, width), dtype)
        nbytes = col.itemsize * width
        for label, pool in [("256 random", [rng.integers(0, ROWS, 256) for _ in range(POOL)]),
                            ("32 x 26 windows", [windows(rng, ROWS) for _ in range(POOL)])]:
            raw = col.view(np.uint8).reshape(ROWS, nbytes)

            def take_rows(i: np.ndarray, raw: np.ndarray = raw, col: np.ndarray = col) -> np.ndarray:
                out = np.empty((i.size, *col.shape[1:]), col.dtype)
                _core.take_rows(raw, i, out.reshape(-1).view(np.uint8))
                return out

            got = timed({"kernel": take_rows,
                         "np.take": lambda i, c=col: np.take(c, i, axis=0)}, pool, rounds, POOL)
            by = "kernel" if nbytes <= storage._SMALL_ROW else "np.take"
            print(f"| {np.dtype(dtype).name} x {width} | {nbytes} | {label} | {got['kernel']:.1f} | "
                  f"{got['np.take']:.1f} | {by} |")


def prefetch_case(rounds: int) -> None:
    a = 3
    spec = {"obs": Field((a, 18), np.float32), "active": Field((a,), np.bool_),
            "agent_terminated": Field((a,), np.bool_), "agent_truncated": Field((a,), np.bool_),
            "state": Field((54,), np.float32),
            "action": Field((a,), np.int64), "reward": Field((a,), np.float32), "terminated": Field((), np.bool_),
            "truncated": Field((), np.bool_), "first": Field((), np.bool_), "last": Field((), np.bool_)}
    store = StepStore(spec, capacity=ROWS // 8, lanes=8)
    for col in store.columns.values():
        col[...] = 1  # written: untouched pages would all map to the kernel's one zero page
    rng = np.random.default_rng(0)
    pool = [windows(rng, ROWS) for _ in range(POOL)]

    def without(idx: np.ndarray) -> Any:
        return {name: store.take_column(name, idx) for name in store.fields}

    got = timed({"take": store.take, "take without the prefetch pass": without}, pool, rounds, POOL)
    row = sum(f.nbytes for f in store.fields.values())
    print(f"| gather of 32 windows of 26 rows, {len(spec)} columns, {row}-byte rows | us |")
    print("|---|---:|")
    for name, us in got.items():
        print(f"| {name} | {us:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=["rows", "prefetch"], choices=["rows", "prefetch"])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    if "rows" in args.cases:
        rows_case(args.rounds)
    if "prefetch" in args.cases:
        prefetch_case(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
