"""N-step transitions: one item per action taken, a window of the rows it spans.

For the action taken at row ``t`` of an episode with ``T`` actions (rows ``0 .. T``, row ``T`` the final
observation), let ``k = min(n, T - t)``. The item is the window of rows ``t .. t + k`` and its fields
are::

    return   = r_t + g r_{t+1} + ... + g^(k-1) r_{t+k-1}
    discount = 0       if the window ends on the final row of a terminated episode
               g^k     otherwise (mid-episode, and on truncation: bootstrap from the true final observation)

so the learner's target is ``return + discount * Q(next_observation)``. ``n = 1`` gives plain
transitions. Every action yields exactly one item (no extra short windows at episode starts), and
observations are never copied per transition: ``next_observation`` is row ``t + k``.

Worked example (``n = 3``, ``g = 0.9``), an episode of four actions with rewards ``1, 2, 3, 4`` that
terminates::

    start t   rows      return                         discount
    0         0..3      1 + .9*2 + .81*3    = 5.23      .729
    1         1..4      2 + .9*3 + .81*4    = 7.94      0      (ends on the terminal row)
    2         2..4      3 + .9*4            = 6.6       0
    3         3..4      4                   = 4         0

Had the episode been truncated instead, the last three discounts would be ``.729, .81, .9``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlflow.adders.base import Adder, PriorityFn, StepEvents
from rlflow.replay.storage import StepStore
from rlflow.replay.table import Table
from rlflow.replay.views import TransitionView
from rlflow.specs import Field, SpecError

__all__ = ["NStepTransition"]


class NStepTransition(Adder):
    """Writes n-step transition items (see the module docstring for the exact semantics).

    Args:
        store: the step rows (spec from :func:`rlflow.types.step_spec`), one lane per env stream.
        tables: tables receiving every transition; sampling them returns
            :class:`~rlflow.replay.views.Transition` batches.
        n: rewards summed per transition (``n >= 1``).
        discount: the per-step discount ``g`` in ``[0, 1]``.
        priority_fns: per table name, ``fn(transitions) -> priorities`` for new items (default 1).
    """

    def __init__(self, store: StepStore, tables: Sequence[Table], *, n: int = 1, discount: float = 0.99,
                 priority_fns: Mapping[str, PriorityFn] | None = None) -> None:
        if int(n) != n or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n}")
        if not 0.0 <= float(discount) <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        self.n = int(n)
        self.discount = float(discount)
        reward = store.fields.get("reward")
        item_spec = {"return": Field(reward.shape if reward is not None else (), np.float32),
                     "discount": Field((), np.float32)}
        super().__init__(store, tables, view=TransitionView(), item_spec=item_spec, priority_fns=priority_fns,
                         min_capacity=self.n + 2)
        self._powers = self.discount ** np.arange(self.n + 1)  # g^0 .. g^n, float64
        self._steps = np.arange(self.n)

    def add_steps(self, lane: int, actions: Any, rewards: Any, next_observations: Any, *, terminated: bool = False,
                  truncated: bool = False, extras: Any = None) -> None:
        """``T`` consecutive steps of one lane at once: the same rows and items as ``T`` calls of :meth:`add`.

        The lane's episode must be in progress (its open row holds the observation ``actions[0]`` was
        taken from). ``next_observations[i]`` follows ``actions[i]``; only the last step may end the
        episode (``terminated`` or ``truncated``). Every argument leads with axis ``T``; bad input
        raises and writes nothing.
        """
        lane = int(lane)
        if not 0 <= lane < self.num_lanes or self._open[lane] < 0:
            raise ValueError(f"add_steps: lane {lane} has no episode in progress (lanes 0..{self.num_lanes - 1})")
        t = int(np.shape(rewards)[0]) if np.ndim(rewards) else -1
        if t < 1 or t > self.store.capacity - self.n - 2:
            raise ValueError(f"add_steps: expected 1 to {self.store.capacity - self.n - 2} steps, got {t}")
        row = {"action": actions, "reward": rewards}
        fields = {**self._act_fields, **self._reward_fields}
        if self._extra_fields:
            if extras is None:
                raise SpecError(f"add_steps: the store has extras {list(self._extra_fields)}; pass extras=")
            row["extras"] = extras
            fields.update(self._extra_fields)
        elif extras is not None:
            raise SpecError("add_steps: extras given, but the store's spec has no 'extras'")
        cols = self._check(fields, row, t, "add_steps")
        obs = self._check(self._obs_fields, {"observation": next_observations}, t, "add_steps: next_observations")
        ended = bool(terminated) or bool(truncated)
        term = np.zeros(t + 1, bool)
        trunc = np.zeros(t + 1, bool)
        term[t - 1], trunc[t - 1] = bool(terminated), bool(truncated)
        store = self.store
        with store.lock:
            r, s0 = int(self._open[lane]), int(self._episode_start[lane])
            # Row r (open) gets the first action; rows r+1 .. r+t are new, the last one open or final.
            first_row = {k: v[:1] for k, v in cols.items()}
            store.write([lane], [r], {**self._top(first_row), "terminated": term[:1], "truncated": trunc[:1]},
                        checked=False)
            tail = {k: np.concatenate([v[1:], np.zeros((1, *v.shape[1:]), v.dtype)]) for k, v in cols.items()}
            last = np.zeros(t, bool)
            last[-1] = ended
            new = {**obs, **tail, "terminated": term[1:], "truncated": trunc[1:],  # flat columns
                   "first": np.zeros(t, bool), "last": last}
            store._write_lane(lane, new, t, np.zeros(0, bool))
            f = r + t
            self._open[lane] = -1 if ended else f
            lo = max(s0, r + 1 - self.n)
            hi = f if ended else f - self.n + 1
            if hi <= lo:
                return
            starts = np.arange(lo, hi, dtype=np.int64)
            ks = np.minimum(self.n, f - starts)
            disc = np.where(bool(terminated) & (starts + ks == f), 0.0, self._powers[ks]).astype(np.float32)
            lanes = np.full(starts.size, lane, np.int64)
            self._insert(lanes, starts, ks + 1, {"return": self._returns(lanes, starts, ks), "discount": disc})

    def _emit(self, events: StepEvents) -> None:
        n = self.n
        # Lanes that go on: the window that now reaches n steps ahead is complete.
        starts = events.continued_rows - n
        full = starts >= events.continued_starts
        if not events.ended.size:  # the common call: at most one full-length item per lane
            if not full.all():
                lanes, starts = events.continued[full], starts[full]
            else:
                lanes = events.continued
            if lanes.size:
                ks = np.full(lanes.size, n, np.int64)
                self._insert(lanes, starts, ks + 1, {"return": self._returns(lanes, starts, ks),
                                                     "discount": np.full(lanes.size, self._powers[n], np.float32)})
            return
        lanes = events.continued[full]
        starts = starts[full]
        ks = np.full(lanes.size, n, np.int64)
        discounts = np.full(lanes.size, self._powers[n])
        if events.ended.size:
            # Lanes that ended: every start within n rows of the final row, each with k = final - start.
            f, s0 = events.final_rows, events.episode_starts
            # (After truncate() the final row was the open row: the window reaching it at full length n
            # was written when that row arrived.)
            first = np.maximum(s0, f - n + int(events.final_was_open))
            count = f - first
            end_lanes = np.repeat(events.ended, count)
            offsets = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
            end_starts = np.repeat(first, count) + offsets
            end_k = np.repeat(f, count) - end_starts
            end_disc = np.where(np.repeat(events.terminated, count), 0.0, self._powers[end_k])
            lanes = np.concatenate([lanes, end_lanes])
            starts = np.concatenate([starts, end_starts])
            ks = np.concatenate([ks, end_k])
            discounts = np.concatenate([discounts, end_disc])
        if not lanes.size:
            return
        returns = self._returns(lanes, starts, ks)
        self._insert(lanes, starts, ks + 1, {"return": returns, "discount": discounts.astype(np.float32)})

    def _returns(self, lanes: np.ndarray, starts: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """``sum_{j<k} g^j r_{start+j}`` per item, from the stored rewards (float64 sums)."""
        store = self.store
        cap = store.capacity
        j = self._steps
        idx = lanes[:, None] * cap + (starts[:, None] + j) % cap  # [M, n]
        rewards = store._flat["reward"][idx]  # [M, n, *reward shape]
        if rewards.ndim == 2 and ks.min() == self.n:  # the common case: n scalar rewards each
            return (rewards @ self._powers[:-1]).astype(np.float32)
        rewards = rewards.astype(np.float64)
        weight = np.where(j < ks[:, None], self._powers[:-1], 0.0)  # rows past k: weight 0
        inside = (j < ks[:, None]).reshape(weight.shape + (1,) * (rewards.ndim - 2))
        rewards = np.where(inside, rewards, 0.0)  # unwritten rows may hold anything
        weight = weight.reshape(inside.shape)
        return (weight * rewards).sum(axis=1).astype(np.float32)
