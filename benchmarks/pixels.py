"""Atari-style frame stacks: memory held and stacked sampling speed, rlflow against SB3, cpprb and Tianshou.

The stream is one env's Atari observations: 84x84 uint8 frames stacked 4 deep on axis 0, as gymnasium's
``FrameStackObservation(env, 4)`` makes them (an episode's first stack is its first frame 4 times, then a
sliding window), episodes of 300 to 2,000 steps, 70% of them terminated and the rest truncated. Frames
are drawn from a pool of 1,024 random frames (frame ``g`` of the stream is ``pool[g % 1024]``); every
buffer copies them into its own storage, so what it holds is real memory.

Memory: each buffer is built and filled with ``--steps`` transitions in its own fresh process (this script
run again with a hidden flag), after its library is imported and a small buffer filled once; the table
gives the process's RSS growth across the fill (after ``gc`` and glibc's ``malloc_trim``, so the fill's
freed inputs do not count) and the bytes the library's own arrays hold where it exposes them (rlflow's
``store.nbytes``; SB3's numpy arrays), both also as a multiple of one copy of the single frames
(``steps * 84 * 84`` bytes). ``--million``: rlflow alone at 1,000,000 steps (about 7 GB).

Speed: all buffers filled again in this process (fewer steps when their measured RSS would not fit in
the free memory; the output says so), then ``sample(32)`` of each, ``--calls`` calls per round, in
rotating order round after round (the first round not counted); the table gives medians over rounds,
each time over rlflow's and over the numpy limit's: a plain gather of the same bytes (rows drawn with
``rng.integers``, then ``frames.take`` of ``[32, 2, 4]`` frame indices, 256 frames of 7,056 bytes, from
a preallocated array of ``steps`` frames, plus action, reward and discount). Each contender is timed
for what its ``sample`` gives a user:

- rlflow: ``ReplayBuffer`` with ``Field((4, 84, 84), uint8, stack=4)``: one frame per row; ``sample``
  rebuilds both stacks (``Transition`` of numpy arrays, ``[32, 4, 84, 84]`` observations).
- rlflow-plain: the same buffer with ``Field((4, 84, 84), uint8)``: each stack stored whole (4 frames).
- sb3-opt / sb3: ``stable_baselines3.common.buffers.ReplayBuffer`` (``n_envs=1``) with
  ``optimize_memory_usage`` True / False; ``ReplayBufferSamples`` of torch tensors. With True the
  next observation is the next row's, so an episode's last next observation is the reset stack (SB3
  requires ``handle_timeout_termination=False`` there, truncations then count as terminations).
- cpprb: ``ReplayBuffer(next_of="obs", stack_compress="obs")``, ``on_episode_end()`` after each
  episode; stack_compress needs the stack on the last axis, so it gets ``[84, 84, 4]`` stacks and
  ``sample`` returns a dict of numpy arrays ``[32, 84, 84, 4]``.
- tianshou: ``ReplayBuffer(size, stack_num=4, ignore_obs_next=True, save_only_last_obs=True)`` (its
  Atari setup): one frame per row; ``sample`` returns ``(Batch, indices)`` with both stacks built
  (``np.stack`` of 4 gathers). ``obs_next`` is the next row's stack, and at an episode's last step
  the step's own ``obs`` (its next observation is not kept).

One thread: ``OMP_NUM_THREADS=1`` and torch's intra-op threads set to 1.

    python benchmarks/pixels.py                        # 100k steps, every peer
    python benchmarks/pixels.py --steps 10000 --rounds 3 --peers cpprb
    python benchmarks/pixels.py --million              # also rlflow's memory at 1M steps
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import ctypes
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import psutil

from rlflow import ReplayBuffer, specs

STACK, FRAME, ACTIONS, POOL, CHUNK, BATCH = 4, (84, 84), 6, 1024, 128, 32
FRAME_BYTES = FRAME[0] * FRAME[1]
PEERS = {"sb3": "stable_baselines3", "cpprb": "cpprb", "tianshou": "tianshou"}


def frame_pool() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (POOL, *FRAME), dtype=np.uint8)


def episodes(steps: int, seed: int = 0):
    """Episodes of the stream until ``steps`` transitions: per episode the frame ids of its stacks
    ``[n + 1, 4]`` (stack ``t`` is the observation of step ``t``, stack ``t + 1`` its next one), actions,
    rewards and the flags; frames are numbered across episodes, an episode of ``n`` steps uses ``n + 1``."""
    rng = np.random.default_rng(seed)
    first = done = 0
    while done < steps:
        n = min(int(rng.integers(300, 2001)), steps - done)
        ids = first + np.maximum(np.arange(n + 1)[:, None] + np.arange(STACK) - (STACK - 1), 0)
        term, trunc = np.zeros(n, bool), np.zeros(n, bool)
        (term if rng.random() < 0.7 else trunc)[-1] = True
        yield ids, rng.integers(0, ACTIONS, n), (rng.random(n) < 0.05).astype(np.float32), term, trunc
        first, done = first + n + 1, done + n


def chunks(steps: int, pool: np.ndarray):
    """The stream in pieces of at most CHUNK steps of one episode: stacks, next stacks ``[T, 4, 84, 84]``,
    actions, rewards, terminated, truncated, and whether the piece ends its episode."""
    for ids, act, rew, term, trunc in episodes(steps):
        n = act.size
        for a in range(0, n, CHUNK):
            b = min(a + CHUNK, n)
            yield (pool[ids[a:b] % POOL], pool[ids[a + 1:b + 1] % POOL], act[a:b], rew[a:b], term[a:b], trunc[a:b],
                   b == n)


# Each maker returns the empty buffer, its add of one piece of the stream, its sample and the bytes its
# library says it holds (None where it says nothing).

def make_rlflow(steps: int, stack: int = STACK):
    buf = ReplayBuffer(specs.Field((STACK, *FRAME), np.uint8, stack=stack),
                       specs.Field((), np.int64, low=0, high=ACTIONS - 1), capacity=steps, n_step=1, discount=0.99,
                       seed=0)

    def add(obs, nxt, act, rew, term, trunc, end):
        buf.extend(obs, act, rew, nxt, term, trunc)
    return buf, add, lambda: buf.sample(BATCH), lambda: buf.store.nbytes


def make_sb3(steps: int, optimize: bool = True):
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its memory check warns when the (lazy) arrays exceed the free memory
        buf = SB3Buffer(steps, spaces.Box(0, 255, (STACK, *FRAME), np.uint8), spaces.Discrete(ACTIONS), device="cpu",
                        n_envs=1, optimize_memory_usage=optimize, handle_timeout_termination=not optimize)

    def add(obs, nxt, act, rew, term, trunc, end):
        done = term | trunc
        for t in range(act.size):
            buf.add(obs[t:t + 1], nxt[t:t + 1], act[t:t + 1], rew[t:t + 1], done[t:t + 1],
                    [{"TimeLimit.truncated": bool(trunc[t])}])
    held = lambda: sum(v.nbytes for v in vars(buf).values() if isinstance(v, np.ndarray))  # noqa: E731
    return buf, add, lambda: buf.sample(BATCH), held


def make_cpprb(steps: int):
    import cpprb
    env = {"obs": {"shape": (*FRAME, STACK), "dtype": np.uint8}, "act": {"dtype": np.int64},
           "rew": {"dtype": np.float32}, "done": {"dtype": np.float32}}
    buf = cpprb.ReplayBuffer(steps, env, next_of="obs", stack_compress="obs")

    def add(obs, nxt, act, rew, term, trunc, end):
        buf.add(obs=np.ascontiguousarray(np.moveaxis(obs, 1, -1)), act=act, rew=rew,
                next_obs=np.ascontiguousarray(np.moveaxis(nxt, 1, -1)), done=term.astype(np.float32))
        if end:
            buf.on_episode_end()
    return buf, add, lambda: buf.sample(BATCH), lambda: None


def make_tianshou(steps: int):
    from tianshou.data import Batch
    from tianshou.data import ReplayBuffer as TianshouBuffer
    buf = TianshouBuffer(steps, stack_num=STACK, ignore_obs_next=True, save_only_last_obs=True)

    def add(obs, nxt, act, rew, term, trunc, end):
        for t in range(act.size):
            buf.add(Batch(obs=obs[t], act=act[t], rew=rew[t], terminated=term[t], truncated=trunc[t], obs_next=nxt[t],
                          info={}))
    return buf, add, lambda: buf.sample(BATCH), lambda: None


MAKERS = {"rlflow": make_rlflow, "rlflow-plain": lambda steps: make_rlflow(steps, stack=1),
          "sb3-opt": make_sb3, "sb3": lambda steps: make_sb3(steps, optimize=False),
          "cpprb": make_cpprb, "tianshou": make_tianshou}
WHAT = {"rlflow": "ReplayBuffer, Field(stack=4)", "rlflow-plain": "ReplayBuffer, Field (4,84,84)",
        "sb3-opt": "ReplayBuffer(optimize_memory_usage=True)", "sb3": "ReplayBuffer(optimize_memory_usage=False)",
        "cpprb": "ReplayBuffer(next_of, stack_compress)", "tianshou": "ReplayBuffer(stack_num=4, last obs only)"}
RETURNS = {"rlflow": "Sample; .data a Transition of numpy arrays, observation and next_observation [32, 4, 84, 84], "
                     "action, reward, discount (rlflow-plain the same)",
           "sb3": "ReplayBufferSamples of torch tensors: observations, next_observations [32, 4, 84, 84], actions, "
                  "rewards, dones, discounts (both settings)",
           "cpprb": "dict of numpy arrays: obs, next_obs [32, 84, 84, 4] (stack last), act, rew, done",
           "tianshou": "(Batch, indices): numpy obs, obs_next [32, 4, 84, 84] stacked at sample, act, rew, terminated, "
                       "truncated, done"}


def filled(name: str, steps: int, pool: np.ndarray):
    buf, add, sample, held = MAKERS[name](steps)
    for piece in chunks(steps, pool):
        add(*piece)
    return buf, sample, held


def rss() -> int:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give glibc's freed heap back, so that only live memory counts
    except (OSError, AttributeError):
        pass
    return psutil.Process().memory_info().rss


def child(name: str, steps: int) -> None:
    """One buffer's memory, in a fresh process: printed as one JSON line."""
    pool = frame_pool()
    filled(name, 2_000, pool)  # imports the library and runs its code once
    before = rss()
    t0 = time.perf_counter()
    _buf, sample, held = filled(name, steps, pool)  # the buffer is kept alive until RSS is read
    seconds = time.perf_counter() - t0
    sample()
    print("RESULT " + json.dumps({"rss": rss() - before, "held": held(), "fill_s": seconds}), flush=True)


def memory(name: str, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}


def numpy_limit(steps: int, pool: np.ndarray):
    """The same bytes as a stacked sample, gathered from plain preallocated arrays."""
    frames = pool[np.arange(steps) % POOL]
    act, rew, disc = np.zeros(steps, np.int64), np.zeros(steps, np.float32), np.ones(steps, np.float32)
    offsets = np.arange(2)[:, None] + np.arange(STACK) - (STACK - 1)  # [2, 4]: the stack and the next one
    rng = np.random.default_rng(0)

    def sample():
        rows = rng.integers(STACK - 1, steps - 1, BATCH)
        return frames.take(rows[:, None, None] + offsets, axis=0), act.take(rows), rew.take(rows), disc.take(rows)
    return sample, frames.nbytes


def time_samples(samplers: dict, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call over ``rounds`` rounds, contenders in rotating order (one warm-up round)."""
    block = np.ones(30 * 2**20, np.uint8)  # raises glibc's mmap threshold once for all (see peers.warm_allocator)
    del block
    names = list(samplers)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(-1, rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn = samplers[name]
            gc.collect()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if r >= 0:
                times[name].append((time.perf_counter() - t0) / calls)
    return {n: statistics.median(t) for n, t in times.items()}


def table(rows: list[dict]) -> str:
    head = ("| contender | what | library MB | library x frames | RSS MB | RSS x frames | sample us | x rlflow "
            "| x numpy limit |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        one = r["steps"] * FRAME_BYTES
        held, grown, t = r.get("held"), r.get("rss"), r.get("time")
        cells = [held and held / 1e6, held and held / one, grown and grown / 1e6, grown and grown / one,
                 t and t * 1e6, r.get("x_rlflow"), r.get("x_numpy")]
        shown = ["-" if v is None else format(v, f) for v, f in zip(cells, [".1f", ".3f", ".1f", ".3f", ".1f", ".2f",
                                                                            ".2f"], strict=True)]
        lines.append(f"| {r['name']} | {r['what']} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000, help="transitions per buffer")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (medians are over these)")
    parser.add_argument("--calls", type=int, default=200, help="sample(32) calls per contender and round")
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--million", action="store_true", help="also rlflow's memory at 1,000,000 steps")
    parser.add_argument("--out", default="runs/pixels.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.steps)
        return 0
    names, notes = ["rlflow", "rlflow-plain"], []
    for peer in args.peers:
        if importlib.util.find_spec(PEERS[peer]) is None:
            notes.append(f"{peer}: skipped, {PEERS[peer]} is not installed")
        else:
            names += ["sb3-opt", "sb3"] if peer == "sb3" else [peer]
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}; {args.steps:,} steps of 4x84x84 uint8 stacks; "
          f"one copy of the frames = {args.steps * FRAME_BYTES / 1e6:.1f} MB", flush=True)

    rows = {n: {"name": n, "what": WHAT[n], "steps": args.steps} for n in names}
    for name in names:
        rows[name].update(memory(name, args.steps))
        r = rows[name]
        shown = r["error"] if "error" in r else f"RSS {r['rss'] / 1e6:.1f} MB, filled in {r['fill_s']:.1f} s"
        print(f"  memory  {name:<13} {shown}", flush=True)
    extra = []
    if args.million:
        r = {"name": "rlflow (1M steps)", "what": WHAT["rlflow"], "steps": 1_000_000, **memory("rlflow", 1_000_000)}
        shown = r["error"] if "error" in r else f"RSS {r['rss'] / 1e6:.1f} MB, filled in {r['fill_s']:.1f} s"
        print(f"  memory  rlflow 1M     {shown}", flush=True)
        extra.append(r)

    # Speed: every buffer in this process, at fewer steps if their measured memory would not fit.
    need = sum(rows[n].get("rss", 0) for n in names) + args.steps * FRAME_BYTES
    steps = args.steps
    while need * steps / args.steps > 0.8 * psutil.virtual_memory().available:
        steps //= 2
    if steps != args.steps:
        notes.append(f"speed measured at {steps:,} steps per buffer: {need / 1e9:.1f} GB for {args.steps:,} would not "
                     f"fit in {psutil.virtual_memory().available / 1e9:.1f} GB free")
    pool = frame_pool()
    samplers, keep = {}, []
    limit, _ = numpy_limit(steps, pool)
    samplers["numpy"] = limit
    for name in names:
        if "error" in rows[name]:
            continue
        buf, sample, _ = filled(name, steps, pool)
        keep.append(buf)
        samplers[name] = sample
        print(f"  filled  {name:<13} for sampling", flush=True)
    times = time_samples(samplers, args.rounds, args.calls)

    limit_row = {"name": "numpy limit", "what": "frames.take([32, 2, 4]) + small columns", "steps": steps,
                 "held": steps * FRAME_BYTES, "rss": None}
    out_rows = [limit_row, *rows.values(), *extra]
    for r in [limit_row, *rows.values()]:
        key = "numpy" if r is limit_row else r["name"]
        if key in times:
            r["time"], r["x_numpy"] = times[key], times[key] / times["numpy"]
            r["x_rlflow"] = times[key] / times["rlflow"] if "rlflow" in times else None
    text = "\n".join([
        f"Frame stacks: {args.steps:,} steps of 4x84x84 uint8 (one copy of the frames = "
        f"{args.steps * FRAME_BYTES / 1e6:.1f} MB); sample(32) medians of {args.rounds} rounds x {args.calls} calls "
        f"at {steps:,} steps; python {sys.version.split()[0]}, numpy {np.__version__}, one thread.", "",
        table(out_rows), "", "What each sample(32) returns:",
        *[f"- {n}: {RETURNS[n]}" for n in RETURNS if n == "rlflow" or n in args.peers],
        *(["", *[f"- {n}" for n in notes]] if notes else [])])
    print()
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
