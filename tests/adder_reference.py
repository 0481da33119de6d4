"""A slow, obviously-correct model of the adders: plain Python lists of rows, per lane.

``Stream`` produces random batched TimeSteps (lanes ending at different times, termination or
truncation, same-step or next-step resets) and records, per lane, every row the adders should store.
The ``*_items`` functions list the items each adder should have written, from those rows alone.
``ADDERS`` builds each adder setting that tests run on these streams (``name: make(store, tables)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlflow import adders, specs
from rlflow.types import TimeStep, step_spec

OBS = specs.Field((2,), np.float32)
ACT = specs.Field((), np.int64, low=0, high=5)
SPEC = step_spec(OBS, ACT, {"v": specs.Field((), np.float32)})


G = 0.9


def nstep(n=3, discount=G):
    return lambda store, tables: adders.NStepTransition(store, tables, n=n, discount=discount)


def sequence(length=6, period=4, end="continue"):
    return lambda store, tables: adders.Sequence(store, tables, length=length, period=period, end_behavior=end)


def episode(max_length=120, ragged=False):
    return lambda store, tables: adders.Episode(store, tables, max_length=max_length, ragged=ragged)


ADDERS = {
    "nstep-1": nstep(1), "nstep-3": nstep(3), "episode": episode(),
    "sequence-continue": sequence(), "sequence-zero_pad": sequence(end="zero_pad"),
    "sequence-truncate": sequence(end="truncate"), "sequence-write": sequence(end="write"),
    "sequence-tiles": sequence(4, 4, "zero_pad"), "sequence-continue-tiles": sequence(5, 5),
}


@dataclass
class Row:
    obs: tuple[float, float]
    action: int = 0
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    first: bool = False
    last: bool = False
    v: float = 0.0
    complete: bool = False  # action and reward known (or a final row)


@dataclass
class Lane:
    rows: list[Row] = field(default_factory=list)  # every row ever written, absolute index = position
    episodes: list[tuple[int, int, bool, bool]] = field(default_factory=list)  # (start, final row, terminated, done)
    open: int = -1
    start: int = -1
    waiting_reset: bool = False  # next-step mode: ended, the next call starts the episode


class Stream:
    """Random TimeSteps for ``lanes`` lanes, and the rows they should produce.

    ``plan[t][e]`` is what happens on lane ``e`` at call ``t``: "mid", "term" or "trunc". ``same_step``
    chooses whether an ending lane restarts in the same call or (next-step autoreset) in the next.
    """

    def __init__(self, lanes: int, rng: np.random.Generator, same_step: bool) -> None:
        self.n = lanes
        self.rng = rng
        self.same_step = same_step
        self.lanes = [Lane() for _ in range(lanes)]
        self.serial = 0

    def _obs(self, e: int) -> np.ndarray:
        self.serial += 1
        return np.array([e, self.serial], np.float32)

    def reset(self) -> TimeStep:
        obs = np.stack([self._obs(e) for e in range(self.n)])
        for e, lane in enumerate(self.lanes):
            lane.rows.append(Row(tuple(obs[e]), first=True))
            lane.open = lane.start = len(lane.rows) - 1
        ones = np.ones(self.n, bool)
        zeros = np.zeros(self.n, bool)
        return TimeStep(obs, np.zeros(self.n, np.float32), zeros, zeros.copy(), ones, zeros.copy())

    def step(self, events: list[str]) -> tuple[np.ndarray, TimeStep, dict]:
        n = self.n
        actions = self.rng.integers(0, 6, n)
        v = self.rng.standard_normal(n).astype(np.float32)
        reward = np.round(self.rng.standard_normal(n), 2).astype(np.float32)
        obs = np.zeros((n, 2), np.float32)
        final = np.zeros((n, 2), np.float32)
        term, trunc, first, last = (np.zeros(n, bool) for _ in range(4))
        for e, lane in enumerate(self.lanes):
            if lane.waiting_reset:  # next-step mode: this call only starts the episode
                lane.waiting_reset = False
                reward[e] = 0.0
                obs[e] = self._obs(e)
                first[e] = True
                lane.rows.append(Row(tuple(obs[e]), first=True))
                lane.open = lane.start = len(lane.rows) - 1
                continue
            row = lane.rows[lane.open]
            row.action, row.reward, row.v, row.complete = int(actions[e]), float(reward[e]), float(v[e]), True
            nxt = self._obs(e)
            if events[e] == "mid":
                obs[e] = nxt
                lane.rows.append(Row(tuple(nxt)))
                lane.open = len(lane.rows) - 1
                continue
            term[e], trunc[e] = events[e] == "term", events[e] == "trunc"
            row.terminated, row.truncated = term[e], trunc[e]
            last[e] = True
            final[e] = nxt
            lane.rows.append(Row(tuple(nxt), last=True, complete=True))
            lane.episodes.append((lane.start, len(lane.rows) - 1, bool(term[e]), True))
            lane.open = -1
            if self.same_step:
                obs[e] = self._obs(e)
                first[e] = True
                lane.rows.append(Row(tuple(obs[e]), first=True))
                lane.open = lane.start = len(lane.rows) - 1
            else:
                obs[e] = nxt  # next-step autoreset: the final observation, acted on in vain
                lane.waiting_reset = True
        ts = TimeStep(obs, reward, term, trunc, first, last, final if last.any() else None)
        return actions, ts, {"v": v}

    def random_events(self, p_end: float) -> list[str]:
        out = []
        for _ in range(self.n):
            u = self.rng.random()
            out.append("term" if u < p_end / 2 else "trunc" if u < p_end else "mid")
        return out


def nstep_items(lane: Lane, n: int, g: float) -> dict[int, tuple]:
    """start row -> (length, return, discount) of every n-step item the lane's rows give."""
    items = {}
    ends = {s: (f, terminated) for s, f, terminated, _ in lane.episodes}
    starts = sorted({s for s, *_ in lane.episodes} | ({lane.start} if lane.open >= 0 else set()))
    for s in starts:
        if s in ends:
            f, terminated = ends[s]
        else:
            f, terminated = None, False
        last_row = f if f is not None else lane.open  # rows s .. last_row exist
        t = s
        while t < last_row:
            steps_left = (f - t) if f is not None else None
            k = n if steps_left is None else min(n, steps_left)
            if t + k > last_row:
                break
            ret = sum(g ** j * lane.rows[t + j].reward for j in range(k))
            disc = 0.0 if (terminated and f is not None and t + k == f) else g ** k
            items[t] = (k + 1, ret, disc)
            t += 1
    return items


def sequence_items(lane: Lane, length: int, period: int, behavior: str) -> dict[int, int]:
    """start row -> length of every sequence item the lane's rows give."""
    items: dict[int, int] = {}
    complete = [i for i, r in enumerate(lane.rows) if r.complete]
    n_complete = len(lane.rows) if lane.open < 0 else lane.open  # rows before the open one are complete
    assert complete == list(range(n_complete)) or lane.open >= 0
    if behavior == "continue":
        first_row = 0
        s = first_row
        while s + length <= n_complete:
            items[s] = length
            s += period
        return items
    episodes = [(s, f) for s, f, _, _ in lane.episodes]
    if lane.open >= 0:
        episodes.append((lane.start, None))
    for s0, f in episodes:
        end = (f + 1) if f is not None else lane.open  # complete rows of the episode: s0 .. end - 1
        s = s0
        last_full = None
        while s + length <= end:
            items[s] = length
            last_full = s
            s += period
        if f is None:
            continue
        covered = last_full + length if last_full is not None else s0
        if covered > f:
            continue
        if behavior == "write":  # the last `length` rows; an episode with fewer rows gives no item
            if f + 1 - s0 >= length:
                items[f + 1 - length] = length
        elif s <= f:
            items[s] = f + 1 - s
    return items


def episode_items(lane: Lane) -> dict[int, int]:
    return {s: f - s + 1 for s, f, _, _ in lane.episodes}


def alive(lane: Lane, start: int, capacity: int) -> bool:
    return start >= len(lane.rows) - capacity
