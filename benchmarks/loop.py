"""Loop overhead: env steps per second of ``rlflow.run`` against the bare environment.

The bare rate is the gymnasium env (or vector env) stepped with pre-drawn actions and nothing else
(for one env, ``gymnasium.make`` with a reset call at each episode end; for a vector env,
``make_vec`` in same-step autoreset mode). The loop is ``rlflow.run`` with a random policy drawing
all lanes' actions in one call, an ``NStepTransition(n=1)`` adder writing to a uniform table, no learner.
The two are timed in alternating rounds; the ratio of medians is reported.

    python benchmarks/loop.py                  # 1 env and a 16-env vector env, CartPole-v1
    python benchmarks/loop.py --envs 1 4 16 --rounds 7
    python benchmarks/loop.py --components --rounds 3 --steps 20000   # per part of the loop body
    python benchmarks/loop.py --adder-paths --rounds 5                 # one lane's add and stage per step
    python benchmarks/loop.py --ladder --rounds 5                      # one env: rlflow's parts one by one
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

import rlflow
from rlflow import ReplayBuffer, adders, envs
from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform

_INT64 = np.dtype(np.int64)


class RandomPolicy(rlflow.Policy):
    def __init__(self, n_actions: int, seed: int = 0) -> None:
        self.n, self.rng = n_actions, np.random.default_rng(seed)
        self._u, self._scale = np.empty(0), np.empty(0)

    def act(self, observation, state, *, evaluation=False):
        # One draw of uniforms for all lanes, scaled and floored: about 3 us a call here, where
        # ``Generator.integers`` costs about 10 us and a Python-int scale factor another 1.5 us
        # (the bare env's actions are drawn in advance).
        k = len(observation)
        if self._u.shape[0] != k:
            self._u, self._scale = np.empty(k), np.full(k, float(self.n))
        self.rng.random(out=self._u)
        return (self._u * self._scale).astype(_INT64), None, state


def bare(env_id: str, num_envs: int, steps: int) -> float:
    """Env steps per second of the plain gymnasium env, actions drawn beforehand."""
    rng = np.random.default_rng(0)
    if num_envs == 1:
        env = gym.make(env_id)
        actions = rng.integers(0, env.action_space.n, steps)
        env.reset(seed=0)
        start = time.perf_counter()
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
    else:
        env = gym.make_vec(env_id, num_envs, vectorization_mode="sync",
                           vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
        actions = rng.integers(0, env.single_action_space.n, (steps // num_envs, num_envs))
        env.reset(seed=0)
        start = time.perf_counter()
        for a in actions:
            env.step(a)
    seconds = time.perf_counter() - start
    env.close()
    return steps / seconds


def loop(env_id: str, num_envs: int, steps: int) -> float:
    """Env steps per second of ``rlflow.run`` collecting into a uniform table (no learner)."""
    env = envs.make(env_id, num_envs=None if num_envs == 1 else num_envs, seed=0)  # one env: the plain env
    store = StepStore(env.spec, capacity=max(steps // num_envs + 8, 64), lanes=num_envs)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    policy = RandomPolicy(int(env.single_action_space.n))
    start = time.perf_counter()
    result = rlflow.run(env, policy, None, adder, table, steps=steps, progress=False)
    seconds = time.perf_counter() - start
    env.close()
    return result.env_steps / seconds


def loop_parts(env_id: str, num_envs: int, steps: int) -> tuple[Any, ...]:
    """What ``rlflow.run``'s body uses with ``num_envs`` envs (1: the plain env) and no learner, reset and ready
    for ``steps`` env steps: ``(env, policy, actor, adder, stats, first TimeStep)``."""
    from rlflow.loop.actors import Actor, EpisodeStats

    env = envs.make(env_id, num_envs=None if num_envs == 1 else num_envs, seed=0)
    store = StepStore(env.spec, capacity=steps // num_envs + 8, lanes=num_envs)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    policy = RandomPolicy(int(env.single_action_space.n))
    actor = Actor(policy, env.action_spec, num_envs, env.single_action_space)
    ts = env.reset(seed=0)
    adder.add_first(ts)
    return env, policy, actor, adder, EpisodeStats(num_envs), ts


PARTS = ("actor.select_action (policy, action check)", "env.step", "adder.stage", "EpisodeStats.update")


def components(env_id: str, num_envs: int, steps: int) -> dict[str, float]:
    """Microseconds per turn (one env step of every lane) of each part of the loop body (what ``rlflow.run``
    does per turn without a learner), timed call by call; the first 500 turns warm up. Then the whole turn
    of ``rlflow.run``, and what is left of it for the loop's own work (its checks, counters, calls)."""
    turns = steps // num_envs
    env, _, actor, adder, stats, ts = loop_parts(env_id, num_envs, steps)
    total = dict.fromkeys(PARTS, 0)
    clock = time.perf_counter_ns
    for i in range(turns):
        t0 = clock()
        actions, extras = actor.select_action(ts.observation, first=ts.first)
        t1 = clock()
        ts = env.step(actions)
        t2 = clock()
        adder.stage(actions, ts, extras)
        t3 = clock()
        stats.update(ts)
        t4 = clock()
        if i >= 500:
            for key, dt in zip(total, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                total[key] += dt
    adder.flush()
    env.close()
    out = {k: v / (turns - 500) / 1e3 for k, v in total.items()}
    out["rlflow.run, the whole turn"] = 1e6 * num_envs / loop(env_id, num_envs, steps)
    out["the loop's own work (whole - parts)"] = out["rlflow.run, the whole turn"] - sum(out[k] for k in PARTS)
    out["bare env step (all lanes)"] = 1e6 * num_envs / bare(env_id, num_envs, steps)
    return out


LADDER = ("hand-written loop (no checks)", "+ rlflow's env wrapper", "+ Actor (action check)",
          "+ adder.stage", "+ EpisodeStats")


def ladder(env_id: str, level: int, steps: int) -> float:
    """Env steps per second of a hand-written one-env loop whose parts are rlflow's up to ``level``
    (:data:`LADDER`): level 0 is the random policy, the plain env, its observation batched to ``[1, ...]``,
    the step's action, reward and observation copied into preallocated rows, and the episode's return and
    length counted, in plain Python with no checks; each level swaps one part for rlflow's."""
    env, policy, actor, adder, stats, ts = loop_parts(env_id, 1, steps)
    raw, obs = env.env, ts.observation
    rows_obs = np.zeros((64, *obs.shape[1:]), obs.dtype)
    rows_act, rows_rew = np.zeros(64, np.int64), np.zeros(64, np.float32)
    k, ret, length = 0, 0.0, 0
    start = time.perf_counter()
    for _ in range(steps):
        if level >= 2:
            actions = actor.select_action(ts.observation, first=ts.first)[0]
        else:
            actions = policy.act(obs, None)[0]
        if level >= 1:
            ts = env.step(actions)
            obs, reward, done = ts.observation, ts.reward[0], ts.last[0]
        else:
            o, reward, terminated, truncated, _ = raw.step(actions[0])
            done = terminated or truncated
            if done:
                o, _ = raw.reset()
            obs = np.array(o, rows_obs.dtype)[None]
        if level >= 3:
            adder.stage(actions, ts)
        else:
            rows_obs[k], rows_act[k], rows_rew[k] = obs[0], actions[0], reward
            k = (k + 1) % 64
        if level >= 4:
            stats.update(ts)
        else:
            ret, length = (0.0, 0) if done else (ret + reward, length + 1)
    adder.flush()
    seconds = time.perf_counter() - start
    env.close()
    return steps / seconds


def adder_paths(env_id: str, steps: int, rounds: int) -> dict[str, float]:
    """Microseconds per step of one lane's ``NStepTransition.add`` (a block of one step written at once) and
    ``stage`` (steps written in blocks; flushes included) on a recorded stream of ``env_id`` (random
    actions), and of ``ReplayBuffer.add`` of the same transitions; best of ``rounds`` interleaved runs, each
    on a fresh store and table."""
    env = envs.make(env_id, num_envs=None, seed=0)
    rng = np.random.default_rng(0)
    first = ts = env.reset(seed=0)
    stream = []
    for _ in range(steps):
        actions = rng.integers(0, env.single_action_space.n, 1)
        ts = env.step(actions)
        stream.append((actions, ts))
    env.close()
    transitions = _transitions(first, stream)
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for method in ("add", "stage"):
            store = StepStore(env.spec, capacity=steps + 8, lanes=1)
            table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
            adder = adders.NStepTransition(store, [table], n=1)
            adder.add_first(first)
            write = getattr(adder, method)
            start = time.perf_counter()
            for actions, step in stream:
                write(actions, step)
            adder.flush()
            times.setdefault(f"NStepTransition.{method}", []).append((time.perf_counter() - start) / steps * 1e6)
        # The same stream through the ReplayBuffer facade, as a loop that has its own env calls it: unbatched
        # arrays, ``obs = next_obs`` going on, the reset observation after an episode end.
        buf = ReplayBuffer(env.single_observation_space, env.single_action_space, capacity=steps + 8)
        start = time.perf_counter()
        for obs, action, reward, nxt, terminated, truncated in transitions:
            buf.add(obs, action, reward, nxt, terminated, truncated)
        buf.flush()
        times.setdefault("ReplayBuffer.add (one env)", []).append((time.perf_counter() - start) / steps * 1e6)
    return {k: min(v) for k, v in times.items()}


def _transitions(first: Any, stream: list[tuple[np.ndarray, Any]]) -> list[tuple[Any, ...]]:
    """One env's ``(obs, action, reward, next_obs, terminated, truncated)`` per step of a recorded stream, as a
    training loop hands them to a replay buffer: ``obs`` is the previous ``next_obs`` object, or the reset
    observation after an episode end."""
    out = []
    obs = first.observation[0]
    for actions, ts in stream:
        ended = bool(ts.last[0])
        nxt = ts.final_observation[0] if ended else ts.observation[0]
        out.append((obs, int(actions[0]), float(ts.reward[0]), nxt, bool(ts.terminated[0]), bool(ts.truncated[0])))
        obs = ts.observation[0] if ended else nxt
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--envs", nargs="*", type=int, default=[1, 16])
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--components", action="store_true",
                        help="time each call of the loop body for each --envs instead (median of the rounds)")
    parser.add_argument("--adder-paths", action="store_true",
                        help="time one lane's add and stage per step, and ReplayBuffer.add (best of the rounds)")
    parser.add_argument("--ladder", action="store_true",
                        help="one env: a hand-written loop with rlflow's parts swapped in one by one, against the "
                             "bare env and rlflow.run (median of the rounds)")
    args = parser.parse_args(argv)
    if args.ladder:
        times: dict[str, list[float]] = {}
        for r in range(args.rounds + 1):  # the first round warms up
            rates = {"bare env": bare(args.env_id, 1, args.steps),
                     **{name: ladder(args.env_id, i, args.steps) for i, name in enumerate(LADDER)},
                     "rlflow.run": loop(args.env_id, 1, args.steps)}
            for key, rate in rates.items():
                if r:
                    times.setdefault(key, []).append(1e6 / rate)
        base = statistics.median(times["bare env"])
        print("| loop | us per step | bare / loop |\n|---|---:|---:|")
        for key, us in times.items():
            print(f"| {key} | {statistics.median(us):.1f} | {base / statistics.median(us):.0%} |")
        return 0
    if args.adder_paths:
        for key, us in adder_paths(args.env_id, args.steps, args.rounds).items():
            print(f"{key:<30} {us:6.1f} us per step")
        return 0
    if args.components:
        cols = {n: [components(args.env_id, n, args.steps) for _ in range(args.rounds)] for n in args.envs}
        print(f"| us per turn | {' | '.join(f'{n} env(s)' for n in args.envs)} |\n|---|{'---:|' * len(args.envs)}")
        for key in cols[args.envs[0]][0]:
            row = " | ".join(f"{statistics.median(r[key] for r in runs):.1f}" for runs in cols.values())
            print(f"| {key} | {row} |")
        return 0
    print("| envs | bare env steps/s | rlflow.run steps/s | loop / bare |\n|---:|---:|---:|---:|")
    for n in args.envs:
        b, lp = [], []
        for r in range(args.rounds + 1):  # the first round warms up (compiles kernels, fills caches)
            pair = (bare(args.env_id, n, args.steps), loop(args.env_id, n, args.steps))
            if r:
                b.append(pair[0])
                lp.append(pair[1])
        mb, ml = statistics.median(b), statistics.median(lp)
        print(f"| {n} | {mb:,.0f} | {ml:,.0f} | {ml / mb:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
