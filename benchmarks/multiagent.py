"""Multi-agent sampling speed: rlflow against flexibuff, a HARL-style numpy buffer and the numpy limit.

Three cases, on simple_spread's shapes (3 agents, 18-float observations, a 54-float global state, one
discrete action and one reward per agent, episodes of 25 steps):

- ``transitions``: a uniform sample of 256 transitions synchronised across agents from 1,000,000 steps:
  rlflow's ``MultiAgentTransition`` table (``[256, 3, ...]`` with per-agent discounts and next
  observations), ``rlflow.compat.flexibuff``, flexibuff itself (the installed version, through its own
  interface), a HARL-style buffer (per-agent numpy arrays, ``np.random.choice`` indices, as HARL's
  off-policy EP buffer keeps them) and the numpy limit (the same bytes gathered from preallocated arrays).
- ``episodes``: 32 whole episodes from the same 1,000,000 steps: rlflow's ``Episode`` table (padded
  ``[32, 26, 3, ...]`` with a mask), ``rlflow.compat.flexibuff`` and flexibuff (``sample_episodes``, a
  list), the numpy limit.
- ``groups``: simple_tag's heterogeneous team (3 adversaries with 16-float observations, 1 good agent
  with 14, a 62-float state): a uniform sample of 256 synchronised transitions from 1,000,000 steps of a
  grouped store (each group with its own width), the numpy limit of the same bytes, and the same team
  padded to one width (what a one-axis store needs); prints the memory per row of both.
- ``minibatches``: one epoch of 4 shuffled feed-forward minibatches over an on-policy rollout of 128
  steps x 16 envs x 3 agents (agents as independent samples): ``rlflow.minibatches.feedforward_batches``
  (the epoch's order, each array gathered once in it, minibatches as views) against HARL's generator
  (``torch.randperm`` of the flattened rollout, then numpy fancy indexing per array and minibatch, as
  ``feed_forward_generator_actor`` does) and the numpy limit (one ``np.take`` per array of an order drawn
  beforehand, minibatches as views: the bytes moved, no shuffle).

Every library's buffer is filled once (rlflow through its adders; the others by writing their arrays
directly, which their sampling cannot tell apart from ``save_transition``), then the libraries are timed
in rotating order, round after round; the table reports medians over rounds and ratios to rlflow's time
and to the numpy limit, from one run. One thread (torch's intra-op threads set to 1).

    python benchmarks/multiagent.py                 # every case
    python benchmarks/multiagent.py --cases transitions --rounds 9
"""

from __future__ import annotations

import argparse
import gc
import inspect
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlflow import adders, minibatches
from rlflow.replay import Fifo, MinSize, StepStore, Table, Uniform
from rlflow.specs import Field
from rlflow.types import TimeStep, step_spec

A, OBS, STATE, EP, LANES = 3, 18, 54, 25, 8
f32 = np.float32


def ma_spec() -> dict[str, Any]:
    obs = {"obs": Field((A, OBS), f32), "active": Field((A,), np.bool_), "terminated": Field((A,), np.bool_),
           "truncated": Field((A,), np.bool_), "state": Field((STATE,), f32)}
    return step_spec(obs, Field((A,), np.int64, low=0, high=4), reward=Field((A,), f32))


class Pool:
    """Random episodes reused cyclically to fill the buffers."""

    def __init__(self, rng: np.random.Generator, episodes: int = 64) -> None:
        k = episodes
        self.obs = rng.normal(size=(k, EP + 1, A, OBS)).astype(f32)
        self.state = rng.normal(size=(k, EP + 1, STATE)).astype(f32)
        self.actions = rng.integers(0, 5, (k, EP, A))
        self.rewards = rng.normal(size=(k, EP, A)).astype(f32)
        self.k = k

    def observation(self, j: int, rows: slice | int) -> dict[str, np.ndarray]:
        obs = self.obs[j, rows]
        n = obs.shape[0] if obs.ndim == 3 else None
        shape = (n, A) if n is not None else (A,)
        truncated = np.zeros(shape, np.bool_)
        if n is not None and isinstance(rows, slice) and (rows.stop or EP + 1) == EP + 1:
            truncated[-1] = True  # the time limit ends every episode: every agent truncated on the last row
        return {"obs": obs, "active": np.ones(shape, np.bool_) & ~truncated, "terminated": np.zeros(shape, np.bool_),
                "truncated": truncated, "state": self.state[j, rows]}


def fill_rlflow(adder_factory: Callable[[StepStore, Table], Any], steps: int, pool: Pool) -> tuple[StepStore, Table]:
    """A store of ``steps`` rows over ``LANES`` lanes, written by the adder: every lane runs episodes of
    ``EP`` steps that end truncated (reset in the same call), all lanes stepping together; an adder with
    ``add_steps`` gets each episode in one call instead."""
    cap = steps // LANES
    store = StepStore(ma_spec(), capacity=cap, lanes=LANES)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adder_factory(store, table)
    episodes = cap // (EP + 1)
    lanes = np.arange(LANES)

    def first_step(js: np.ndarray) -> TimeStep:
        obs = {k: np.stack([pool.observation(int(j), 0)[k] for j in js]) for k in pool.observation(0, 0)}
        n = len(js)
        return TimeStep(obs, np.zeros((n, A), f32), np.zeros(n, bool), np.zeros(n, bool), np.ones(n, bool),
                        np.zeros(n, bool))

    if hasattr(adder, "add_steps"):
        j = 0
        for lane in range(LANES):
            for _ in range(episodes):
                adder.add_first(first_step(np.array([j % pool.k])), lanes=[lane])
                nxt = pool.observation(j % pool.k, slice(1, EP + 1))
                adder.add_steps(lane, pool.actions[j % pool.k], pool.rewards[j % pool.k], nxt, truncated=True)
                j += 1
        return store, table
    js = lanes % pool.k
    adder.add_first(first_step(js))
    for _ in range(episodes):
        for t in range(EP):
            end = t == EP - 1
            nxt = {k: np.stack([pool.observation(int(j), slice(t + 1, t + 2))[k][0] for j in js])
                   for k in ("obs", "active", "terminated", "truncated", "state")}
            flag = np.full(LANES, end)
            ts = TimeStep(nxt, pool.rewards[js, t], np.zeros(LANES, bool), flag.copy(), flag.copy(), flag.copy())
            if end:
                ts.final_observation = nxt
                ts.observation = first_step((js + LANES) % pool.k).observation
            adder.add(pool.actions[js, t], ts)
        js = (js + LANES) % pool.k
    return store, table


# ---------------------------------------------------------------------------------------------- contenders
def transitions_contenders(steps: int, pool: Pool, rng: np.random.Generator) -> list[tuple[str, Callable[[], Any]]]:
    out: list[tuple[str, Callable[[], Any]]] = []
    _, table = fill_rlflow(lambda s, t: adders.MultiAgentTransition(s, [t], n=1, discount=0.99), steps, pool)
    out.append(("rlflow", lambda: table.sample(256)))
    n = table.size
    # the numpy limit: the same bytes from preallocated step-major arrays, written once (np.ones), so that
    # they are backed by memory of their own: untouched np.zeros pages all map to one zero page, which
    # the gather would read from the cache
    obs = np.ones((n + 1, A, OBS), f32)
    state = np.ones((n + 1, STATE), f32)
    act = np.ones((n, A), np.int64)
    rew = np.ones((n, A), f32)
    flags = np.ones((n + 1, 3, A), np.bool_)
    r = np.random.default_rng(1)

    def limit() -> Any:
        i = r.integers(0, n, 256)
        return (obs[i], obs[i + 1], state[i], state[i + 1], act[i], rew[i], flags[i], flags[i + 1])

    out.append(("numpy limit", limit))
    compat = _compat_flexibuff(steps, pool)
    out.append(("rlflow.compat.flexibuff", lambda: compat.sample_transitions(256)))
    fb = _flexibuff(steps, pool)
    if isinstance(fb, str):
        out.append((f"flexibuff ({fb})", None))
    else:
        out.append((f"flexibuff {fb[1]}", lambda: fb[0].sample_transitions(256)))
    harl = HarlStyle(steps, pool)
    out.append(("HARL-style numpy", harl.sample))
    return out


# simple_tag's team: 3 adversaries (16-float observations) and 1 good agent (14), one discrete action each, a
# 62-float global state
TAG = {"adversary": (3, 16), "agent": (1, 14)}
TAG_AGENTS, TAG_STATE = 4, 62


def groups_spec(padded: bool) -> dict[str, Any]:
    """simple_tag's rows: each group with its own observation width, or (padded) every agent's padded to 16."""
    a = TAG_AGENTS
    per_agent = Field((a, 16), f32) if padded else {g: Field((n, d), f32) for g, (n, d) in TAG.items()}
    obs: dict[str, Any] = {"obs": per_agent,
                           "active": Field((a,), np.bool_), "terminated": Field((a,), np.bool_),
                           "truncated": Field((a,), np.bool_), "state": Field((TAG_STATE,), f32)}
    act = Field((a,), np.int64, low=0, high=4) if padded else {
        g: Field((n,), np.int64, low=0, high=4) for g, (n, _) in TAG.items()}
    return step_spec(obs, act, reward=Field((a,), f32))


def fill_groups(steps: int, padded: bool) -> tuple[StepStore, Table]:
    """``steps`` rows of simple_tag's team over ``LANES`` lanes, episodes of ``EP`` steps ending truncated,
    written by a ``MultiAgentTransition`` adder (one ``add_steps`` call an episode)."""
    from rlflow.specs import AgentGroup

    rng = np.random.default_rng(0)
    cap = steps // LANES
    store = StepStore(groups_spec(padded), capacity=cap, lanes=LANES)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    groups = None if padded else {"adversary": AgentGroup("adversary", ("adversary_0", "adversary_1", "adversary_2"),
                                                          (0, 1, 2)), "agent": AgentGroup("agent", ("agent_0",), (3,))}
    adder = adders.MultiAgentTransition(store, [table], n=1, discount=0.99, groups=groups)
    a = TAG_AGENTS

    def rows(n: int) -> dict[str, Any]:
        obs = (rng.normal(size=(n, a, 16)).astype(f32) if padded else
               {g: rng.normal(size=(n, k, d)).astype(f32) for g, (k, d) in TAG.items()})
        truncated = np.zeros((n, a), np.bool_)
        truncated[-1] = n > 1
        return {"obs": obs, "active": ~truncated, "terminated": np.zeros((n, a), np.bool_), "truncated": truncated,
                "state": rng.normal(size=(n, TAG_STATE)).astype(f32)}

    first = rows(1)
    nxt = rows(EP)
    actions = rng.integers(0, 5, (EP, a)) if padded else {g: rng.integers(0, 5, (EP, k)) for g, (k, _) in TAG.items()}
    rewards = rng.normal(size=(EP, a)).astype(f32)
    for lane in range(LANES):
        for _ in range(cap // (EP + 1)):
            adder.add_first(TimeStep(first, np.zeros((1, a), f32), np.zeros(1, bool), np.zeros(1, bool),
                                     np.ones(1, bool), np.zeros(1, bool)), lanes=[lane])
            adder.add_steps(lane, actions, rewards, nxt, truncated=True)
    return store, table


def groups_contenders(steps: int, pool: Pool, rng: np.random.Generator) -> list[tuple[str, Callable[[], Any]]]:
    store, table = fill_groups(steps, padded=False)
    out: list[tuple[str, Callable[[], Any]]] = [("rlflow", lambda: table.sample(256))]
    n = table.size
    cols = {g: np.ones((n + 1, k, d), f32) for g, (k, d) in TAG.items()}
    state = np.ones((n + 1, TAG_STATE), f32)
    act = {g: np.ones((n, k), np.int64) for g, (k, _) in TAG.items()}
    rew = np.ones((n, TAG_AGENTS), f32)
    flags = np.ones((n + 1, 3, TAG_AGENTS), np.bool_)
    r = np.random.default_rng(1)

    def limit() -> Any:
        i = r.integers(0, n, 256)
        return ([c[i] for c in cols.values()], [c[i + 1] for c in cols.values()], state[i], state[i + 1],
                [c[i] for c in act.values()], rew[i], flags[i], flags[i + 1])

    out.append(("numpy limit", limit))
    padded_store, padded = fill_groups(steps, padded=True)
    out.append(("rlflow, observations padded to 16", lambda: padded.sample(256)))
    grouped_row = sum(f.nbytes for f in store.fields.values())
    padded_row = sum(f.nbytes for f in padded_store.fields.values())
    print(f"memory per row: grouped {grouped_row} B, padded {padded_row} B ({padded_row / grouped_row:.3f}x)")
    return out


def episodes_contenders(steps: int, pool: Pool, rng: np.random.Generator) -> list[tuple[str, Callable[[], Any]]]:
    out: list[tuple[str, Callable[[], Any]]] = []
    _, table = fill_rlflow(lambda s, t: adders.Episode(s, [t], max_length=EP + 1), steps, pool)
    out.append(("rlflow", lambda: table.sample(32)))
    n_eps = table.size
    obs = np.ones((n_eps * (EP + 1), A, OBS), f32)  # written, as in transitions_contenders
    state = np.ones((n_eps * (EP + 1), STATE), f32)
    act = np.ones((n_eps * (EP + 1), A), np.int64)
    rew = np.ones((n_eps * (EP + 1), A), f32)
    flags = np.ones((n_eps * (EP + 1), 3, A), np.bool_)
    r = np.random.default_rng(1)

    def limit() -> Any:
        i = (r.integers(0, n_eps, 32) * (EP + 1))[:, None] + np.arange(EP + 1)
        return obs[i], state[i], act[i], rew[i], flags[i]

    out.append(("numpy limit", limit))
    compat = _compat_flexibuff(steps, pool)
    out.append(("rlflow.compat.flexibuff", lambda: compat.sample_episodes(32 * EP, n_episodes=32)))
    fb = _flexibuff(steps, pool)
    if isinstance(fb, str):
        out.append((f"flexibuff ({fb})", None))
    else:
        out.append((f"flexibuff {fb[1]}", lambda: fb[0].sample_episodes(32 * EP, n_episodes=32)))
    return out


def minibatch_contenders(steps: int, pool: Pool, rng: np.random.Generator) -> list[tuple[str, Callable[[], Any]]]:
    import torch  # HARL's generators draw their order with torch.randperm
    T, E, k = 128, 16, 4
    rollout = {"obs": rng.normal(size=(T, E, A, OBS)).astype(f32),
               "state": rng.normal(size=(T, E, A, STATE)).astype(f32),
               "actions": rng.integers(0, 5, (T, E, A)), "log_probs": rng.normal(size=(T, E, A)).astype(f32),
               "values": rng.normal(size=(T, E, A)).astype(f32), "returns": rng.normal(size=(T, E, A)).astype(f32),
               "advantages": rng.normal(size=(T, E, A)).astype(f32), "active": np.ones((T, E, A), np.bool_)}
    lanes = {key: v.reshape(T, E * A, *v.shape[3:]) for key, v in rollout.items()}  # agents as lanes
    flat = {key: v.reshape(T * E * A, *v.shape[3:]) for key, v in rollout.items()}
    g = np.random.default_rng(0)

    def rlflow_epoch() -> Any:
        return list(minibatches.feedforward_batches(lanes, T, E * A, k, rng=g))

    def harl_epoch() -> Any:  # HARL: torch.randperm of the flattened rollout, cut into minibatches, gathered
        rand = torch.randperm(T * E * A).numpy()
        size = T * E * A // k
        return [{key: v[rand[i * size:(i + 1) * size]] for key, v in flat.items()} for i in range(k)]

    order = g.permutation(T * E * A)

    size = T * E * A // k

    def limit() -> Any:
        whole = {key: v.take(order, axis=0) for key, v in flat.items()}
        return [{key: v[i * size:(i + 1) * size] for key, v in whole.items()} for i in range(k)]

    return [("rlflow", rlflow_epoch), ("numpy limit", limit), ("HARL-style numpy", harl_epoch)]


def _compat_flexibuff(steps: int, pool: Pool) -> Any:
    from rlflow.compat.flexibuff import FlexibleBuffer

    fb = FlexibleBuffer(num_steps=steps, obs_size=OBS, n_agents=A, discrete_action_cardinalities=[5],
                        state_size=STATE, individual_reward=True, seed=0)
    _fill_flexibuff_arrays(fb, steps, pool)
    fb._count = steps
    from rlflow.compat.flexibuff import _Episodes

    fb._episodes = _Episodes((s, EP) for s in range(0, steps - EP + 1, EP))
    return fb


def _flexibuff(steps: int, pool: Pool) -> tuple[Any, str] | str:
    try:
        import flexibuff
    except ImportError as exc:
        return f"not installed: {exc}"
    from importlib.metadata import version

    ver = version("flexibuff")
    params = inspect.signature(flexibuff.FlexibleBuffer.__init__).parameters
    if "obs_size" in params:  # the 0.1 interface
        fb = flexibuff.FlexibleBuffer(num_steps=steps, obs_size=OBS, n_agents=A, discrete_action_cardinalities=[5],
                                      state_size=STATE, individual_reward=True)
    else:  # 0.2+: registered values
        fb = flexibuff.FlexibleBuffer(
            num_steps=steps, n_agents=A, discrete_action_cardinalities=[5],
            global_registered_vars={"state": ([STATE], f32), "state_": ([STATE], f32)},
            individual_registered_vars={"obs": ([OBS], f32), "obs_": ([OBS], f32),
                                        "individual_rewards": (None, f32), "discrete_actions": ([1], np.int32)})
    _fill_flexibuff_arrays(fb, steps, pool)
    fb.steps_recorded = steps
    fb.idx = 0
    fb.episode_inds = list(range(0, steps + 1, EP))
    fb.episode_lens = [EP] * (len(fb.episode_inds) - 1)
    return fb, ver


def _fill_flexibuff_arrays(fb: Any, steps: int, pool: Pool) -> None:
    reps = -(-steps // (pool.k * EP))
    obs = np.tile(pool.obs[:, :EP].reshape(-1, A, OBS), (reps, 1, 1))[:steps]
    fb.obs[...] = obs.transpose(1, 0, 2)
    fb.obs_[...] = np.roll(obs, -1, axis=0).transpose(1, 0, 2)
    st = np.tile(pool.state[:, :EP].reshape(-1, STATE), (reps, 1))[:steps]
    fb.state[...] = st
    fb.state_[...] = np.roll(st, -1, axis=0)
    # Its other arrays (actions, rewards, flags, masks) are written too, so that, as every contender's,
    # they are backed by memory of their own: untouched np.zeros pages all map to one zero page.
    for name, arr in vars(fb).items():
        if (isinstance(arr, np.ndarray) and arr.size >= steps and arr.dtype.kind in "biuf"
                and name not in ("obs", "obs_", "state", "state_")):
            arr[...] = 1


class HarlStyle:
    """Per-agent arrays as HARL's off-policy EP buffer keeps them, sampled with ``np.random.choice``."""

    def __init__(self, steps: int, pool: Pool) -> None:
        reps = -(-steps // (pool.k * EP))
        obs = np.tile(pool.obs[:, :EP].reshape(-1, A, OBS), (reps, 1, 1))[:steps]
        self.obs = [np.ascontiguousarray(obs[:, a]) for a in range(A)]
        self.next_obs = [np.roll(o, -1, axis=0) for o in self.obs]
        self.share_obs = np.tile(pool.state[:, :EP].reshape(-1, STATE), (reps, 1))[:steps]
        self.next_share_obs = np.roll(self.share_obs, -1, axis=0)
        self.actions = [np.ones((steps, 1), f32) for _ in range(A)]  # written (np.ones), not zero pages
        self.available = [np.ones((steps, 5), f32) for _ in range(A)]
        self.next_available = [np.ones((steps, 5), f32) for _ in range(A)]
        self.valid = [np.ones((steps, 1), f32) for _ in range(A)]
        self.reward = np.ones((steps, 1), f32)
        self.done = np.ones((steps, 1), f32)
        self.term = np.ones((steps, 1), f32)
        self.size = steps
        self.rng = np.random.default_rng(0)

    def sample(self) -> Any:
        i = self.rng.choice(self.size, size=256)  # with replacement, as HARL draws
        per_agent = [np.stack([x[i] for x in xs]) for xs in (self.obs, self.actions, self.available, self.valid,
                                                             self.next_obs, self.next_available)]
        return (self.share_obs[i], self.reward[i], self.done[i], self.term[i], self.next_share_obs[i], *per_agent)


CASES = {"transitions": transitions_contenders, "episodes": episodes_contenders, "minibatches": minibatch_contenders,
         "groups": groups_contenders}


def timed(fn: Callable[[], Any], target_s: float) -> float:
    """Seconds per call: as many calls as fit in ``target_s`` (at least 3), their mean."""
    fn()
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < target_s:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target", type=float, default=0.2, help="seconds of calls per timing")
    args = parser.parse_args(argv)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    print("| case | library | us (median) | / rlflow | x numpy limit |\n|---|---|---:|---:|---:|")
    for case in args.cases:
        contenders = CASES[case](args.steps, Pool(np.random.default_rng(0)), np.random.default_rng(0))
        live = [(name, fn) for name, fn in contenders if fn is not None]
        times: dict[str, list[float]] = {name: [] for name, _ in live}
        for r in range(args.rounds):
            order = live[r % len(live):] + live[:r % len(live)]
            for name, fn in order:
                gc.collect()
                times[name].append(timed(fn, args.target))
        med = {name: statistics.median(v) for name, v in times.items()}
        for name, _ in contenders:
            if name not in med:
                print(f"| {case} | {name} | | | |")
                continue
            print(f"| {case} | {name} | {med[name] * 1e6:,.1f} | {med[name] / med['rlflow']:.2f} | "
                  f"{med[name] / med['numpy limit']:.2f} |", flush=True)
        del contenders, live
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
