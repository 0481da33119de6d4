"""Sequences: fixed-length windows of rows, every ``period`` rows, for recurrent learners.

Rows are counted as stored (an episode of ``T`` actions is ``T + 1`` rows; the last holds the final
observation, with a zero action and ``last=True``). Within an episode, sequences start at rows
``0, P, 2P, ...`` and are written once all ``L`` of their rows are complete (a row is complete once its
action and reward are known, or when it is the final row). ``P < L`` overlaps sequences, ``P == L``
tiles them.

At the end of an episode, rows after the last full sequence are handled by ``end_behavior`` (Acme's
meanings; ``L = 3, P = 2`` and an episode of six rows ``1 .. 6``, full sequences ``1 2 3`` and
``3 4 5``)::

    WRITE      4 5 6      the last L rows of the episode (overlapping the previous sequence)
    ZERO_PAD   5 6 0      from the next period start, padded with zero rows (mask False)
    TRUNCATE   5 6        from the next period start, shorter
    CONTINUE   5 6 F      sequences run on into the lane's next episode (F: its first row)

An episode shorter than ``L`` rows gives one sequence of its rows under ZERO_PAD and TRUNCATE, and none under
WRITE, which writes only full-length sequences (as Acme drops episodes too short for one). Samples are
always ``[B, L, ...]`` with a mask ``[B, L]`` that is False on padding (zero-filled rows), so ZERO_PAD and
TRUNCATE write the same items (of the episode's remaining rows, ``Sample.lengths``) and give the same
batches; both names are accepted.
CONTINUE needs tables made with ``cross_episodes=True`` (otherwise rows of the next episode would be
masked); the rows' ``first`` column marks where an episode starts inside a sequence (reset RNN state
there).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from collections.abc import Sequence as SequenceType
from typing import Any

import numpy as np

from rlflow.adders.base import Adder, PriorityFn, StepEvents
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase
from rlflow.replay.views import SequenceView

__all__ = ["EndBehavior", "Sequence"]


class EndBehavior(enum.Enum):
    """What happens to the rows after an episode's last full sequence (see the module docstring)."""

    WRITE = "write"
    ZERO_PAD = "zero_pad"
    TRUNCATE = "truncate"
    CONTINUE = "continue"


class Sequence(Adder):
    """Writes sequences of ``length`` rows every ``period`` rows (see the module docstring).

    Args:
        store: the step rows (spec from :func:`rlflow.types.step_spec`), one lane per env stream.
        tables: tables receiving every sequence; sampling them returns ``[B, length, ...]`` with a mask.
        length: rows per sequence (``L``).
        period: rows between sequence starts (``P``, default ``length``).
        end_behavior: an :class:`EndBehavior` or its value (default ZERO_PAD).
        priority_fns: per table name, ``fn(columns) -> priorities`` for new sequences, ``columns`` ``[M, L, ...]``
            with zero padding (the mask is not passed; default priority 1).
    """

    def __init__(self, store: StepStore, tables: SequenceType[TableBase], *, length: int, period: int | None = None,
                 end_behavior: EndBehavior | str = EndBehavior.ZERO_PAD,
                 priority_fns: Mapping[str, PriorityFn] | None = None) -> None:
        period = length if period is None else period
        for name, value in (("length", length), ("period", period)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value}")
        self.length, self.period = int(length), int(period)
        self.max_items_per_step = 3  # up to two new rows per call: two full sequences and a tail at most
        try:
            self.end_behavior = EndBehavior(end_behavior)
        except ValueError:
            raise ValueError(f"end_behavior must be one of {[b.value for b in EndBehavior]}, "
                             f"got {end_behavior!r}") from None
        if self.end_behavior is EndBehavior.CONTINUE:
            flat = [t.name for t in tables if not t.cross_episodes]
            if flat:
                raise ValueError(f"end_behavior CONTINUE writes sequences across episodes; tables {flat} need "
                                 "cross_episodes=True")
        # TRUNCATE writes ZERO_PAD's items (see the module docstring): one setting for the tables' checks.
        items_rule = EndBehavior.ZERO_PAD if self.end_behavior is EndBehavior.TRUNCATE else self.end_behavior
        super().__init__(store, tables, view=SequenceView(self.length, self.period, items_rule.value), item_spec=None,
                         priority_fns=priority_fns, min_capacity=self.length + 2)
        self._next_start = np.full(self.num_lanes, -1, np.int64)  # absolute row of the lane's next sequence

    def lane_state(self) -> dict[str, np.ndarray]:
        return {**super().lane_state(), "next_start": self._next_start}

    def on_step(self, events: StepEvents) -> None:
        L, P = self.length, self.period
        cont = self.end_behavior is EndBehavior.CONTINUE
        # Rows before this bound are complete: those before the open row, or every stored row if none is
        # open. A lane that ended and restarted in this call has its new first row open, so its old
        # episode (through the final row) is complete and its new one is not.
        complete = np.where(self._open >= 0, self._open, self.store.count)
        lanes_out: list[np.ndarray] = []
        starts_out: list[np.ndarray] = []
        lengths_out: list[np.ndarray] = []
        while True:
            ready = np.flatnonzero((self._next_start >= 0) & (self._next_start + L <= complete))
            if not ready.size:
                break
            lanes_out.append(ready)
            starts_out.append(self._next_start[ready].copy())
            lengths_out.append(np.full(ready.size, L, np.int64))
            self._next_start[ready] += P
        if not cont and events.ended.size:
            self._tails(events, lanes_out, starts_out, lengths_out)
            self._next_start[events.ended] = -1
        if events.started.size:  # a new episode restarts the count (CONTINUE: only the lane's first one)
            fresh = self._next_start[events.started] < 0
            self._next_start[events.started[fresh]] = events.started_rows[fresh]
        if lanes_out:
            self.insert_items(np.concatenate(lanes_out), np.concatenate(starts_out), np.concatenate(lengths_out), None)

    def _tails(self, events: StepEvents, lanes_out: list, starts_out: list, lengths_out: list) -> None:
        """The sequence covering each ended episode's rows after its last full sequence, if any."""
        L, P = self.length, self.period
        f, s0 = events.final_rows, events.episode_starts
        ns = self._next_start[events.ended]
        covered = np.where(ns > s0, ns - P + L, s0)  # rows before this are in a full sequence
        if self.end_behavior is EndBehavior.WRITE:  # full-length sequences only: a shorter episode gives none
            start = f + 1 - L
            want = (covered <= f) & (start >= s0)
        else:
            start = ns
            want = (covered <= f) & (ns <= f)
        lanes_out.append(events.ended[want])
        starts_out.append(start[want])
        lengths_out.append((f + 1 - start)[want])

    def rows_until_written(self, lanes: Any = None) -> np.ndarray:
        """Per lane of ``lanes`` (default all): how many more rows it must store before its next full-length
        sequence is written, if no episode of it ends first (an episode end can write one sooner: a tail, or
        under CONTINUE a sequence whose last row is the final row).

        A sequence is written once its ``L`` rows are complete, and a row is complete once the row after it is
        stored, so a lane whose next sequence starts at row ``s`` and has stored ``c`` rows needs
        ``s + L + 1 - c`` more; a lane with no sequence begun (no episode yet, or one ended under another end
        behaviour than CONTINUE) needs ``L + 1``, the first of them starting its episode. A remote actor that
        acts in lockstep with its learner ships blocks of this many steps (``rlflow.distributed``'s
        ``on_policy``), each of which then completes one sequence on every lane."""
        lanes_arr = self.store.check_lanes(lanes)
        self.flush()
        start = self._next_start[lanes_arr]
        count = self.store.count[lanes_arr]
        return np.where(start >= 0, start + self.length + 1 - count, self.length + 1)

    def on_abandon(self, lanes: np.ndarray) -> None:
        self._next_start[lanes] = -1

    def on_dropped(self, lanes: np.ndarray) -> None:
        # CONTINUE: the lane's sequences run on across the dropped episode's one (final) row, as across any
        # episode end, so its rows before it still go into sequences and its count goes on.
        if self.end_behavior is not EndBehavior.CONTINUE:
            self.on_abandon(lanes)
