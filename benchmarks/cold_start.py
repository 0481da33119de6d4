"""Cold start: the wall-clock from ``import rlflow`` to the first ``ReplayBuffer.sample``.

Each measurement runs in a fresh Python subprocess. *Cold*: Python's bytecode cache goes to a new, empty
directory (``PYTHONPYCACHEPREFIX``), so every module rlflow imports is compiled to bytecode, as on the first
run of a fresh checkout. *Warm*: the same program again on the cache the cold run left. rlflow's core is
compiled when pip installs it, so neither run compiles any of it; ``jit`` lists any JIT compiler the program
loaded (none is expected).

The program is ``benchmarks/replay.py``'s one-env case: a ``ReplayBuffer`` of 17-float observations
(``Box(-1, 1, (17,), float32)``) and ``Discrete(6)`` actions, ``--adds`` transitions added one at a time
as a training loop adds them (``obs = next_obs``, an episode end every ``--episode`` steps), then one
``sample(256)`` (``--prioritized``: the buffer samples by priority, a sum tree and a FIFO remover). gymnasium
is imported before the clock starts (it only provides the two spaces); the clock covers importing rlflow
(numpy included), building the buffer, the adds and the sample. Besides the wall-clock phases, ``cpu`` is the
process's CPU time over the same span.

    python benchmarks/cold_start.py                    # 3 cold and 3 warm runs, medians
    python benchmarks/cold_start.py --prioritized      # the prioritized buffer
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in the subprocess. Prints one JSON line: phase times (seconds) and the JIT compilers loaded.
CHILD = r"""
import json, sys, time
from gymnasium import spaces
import numpy as np

adds, episode, n_step, prioritized = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
jits_before = {"numba", "llvmlite"} & set(sys.modules)

t0, c0 = time.perf_counter(), time.process_time()
import rlflow
from rlflow import ReplayBuffer
t_import = time.perf_counter()

buffer = ReplayBuffer(spaces.Box(-1, 1, (17,), np.float32), spaces.Discrete(6), capacity=100_000, n_step=n_step,
                      prioritized=prioritized)
t_build, c_build = time.perf_counter(), time.process_time()

rng = np.random.default_rng(0)
observations = rng.uniform(-1, 1, (adds + 1, 17)).astype(np.float32)
actions = rng.integers(0, 6, adds)
rewards = rng.normal(size=adds).astype(np.float32)
obs = observations[0]
t_data, c_data = time.perf_counter(), time.process_time()
for i in range(adds):
    next_obs = observations[i + 1]
    buffer.add(obs, int(actions[i]), float(rewards[i]), next_obs, (i + 1) % episode == 0, False)
    obs = next_obs
t_adds = time.perf_counter()
sample = buffer.sample(256)
t_sample, c_sample = time.perf_counter(), time.process_time()
assert sample.data.observation.shape == (256, 17)

print(json.dumps({"import": t_import - t0, "build": t_build - t_import, "adds": t_adds - t_data,
                  "sample": t_sample - t_adds, "total": (t_sample - t0) - (t_data - t_build),
                  "cpu": (c_sample - c0) - (c_data - c_build),
                  "jit": sorted(({"numba", "llvmlite"} & set(sys.modules)) - jits_before)}))
"""

PHASES = ("import", "build", "adds", "sample", "total", "cpu")


def run_child(cache_dir: str, args: argparse.Namespace) -> dict:
    """One fresh interpreter with ``PYTHONPYCACHEPREFIX=cache_dir``; the child's JSON result."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=cache_dir, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(args.adds), str(args.episode), str(args.n_step),
                           str(int(args.prioritized))],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"the measured program failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold and warm runs each (default 3)")
    parser.add_argument("--adds", type=int, default=200, help="transitions added before the sample")
    parser.add_argument("--episode", type=int, default=50, help="an episode ends every this many adds")
    parser.add_argument("--n-step", type=int, default=1, help="the buffer's n_step")
    parser.add_argument("--prioritized", action="store_true", help="a prioritized buffer (default: uniform)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed to one run")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.adds < 1 or args.episode < 1:
        parser.error("--repeats, --adds and --episode must be at least 1")

    cold, warm = [], []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="rlflow-pycache-") as cache_dir:
            cold.append(run_child(cache_dir, args))
            warm.append(run_child(cache_dir, args))
        print(f"run {i + 1}/{args.repeats}: cold {cold[-1]['total']:.2f} s, warm {warm[-1]['total']:.2f} s",
              flush=True)

    print(f"import rlflow -> first ReplayBuffer.sample: seconds, medians of {args.repeats} runs "
          f"({args.adds} adds, an episode end every {args.episode}, n_step={args.n_step}"
          f"{', prioritized' if args.prioritized else ''})")
    print(f"{'':6}" + "".join(f"{p:>9}" for p in PHASES) + "  jit")
    for label, runs in (("cold", cold), ("warm", warm)):
        medians = [statistics.median(r[p] for r in runs) for p in PHASES]
        jits = sorted({j for r in runs for j in r["jit"]})
        print(f"{label:6}" + "".join(f"{m:9.2f}" for m in medians) + f"  {', '.join(jits) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
