"""Episodes: one item per finished episode, all of its rows.

An episode of ``T`` actions is ``T + 1`` rows (the last holds the final observation). The item is
written when the episode ends; an episode abandoned by :meth:`~rlflow.adders.Adder.reset` gives none.
``max_length`` bounds the rows of an episode: a call that would make an episode longer raises (and
writes nothing), so end long episodes with a time limit. Samples are padded to ``[B, max_length, ...]``
with a mask ``[B, max_length]``, or, with ``ragged=True``, a list of ``B`` episodes, each ``[T_i + 1, ...]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlflow.adders.base import Adder, PriorityFn, StepEvents
from rlflow.adders.block import StepBlock
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase
from rlflow.replay.views import EpisodeView

__all__ = ["Episode"]


class Episode(Adder):
    """Writes each finished episode as one item (see the module docstring).

    Args:
        store: the step rows (spec from :func:`rlflow.types.step_spec`); needs ``max_length + 1`` rows per lane.
        tables: tables receiving every episode.
        max_length: most rows per episode, its final observation row included.
        ragged: sample episodes as a list instead of a padded batch.
        priority_fns: per table name, ``fn(episodes) -> priorities`` for new episodes (default 1).
    """

    def __init__(self, store: StepStore, tables: Sequence[TableBase], *, max_length: int, ragged: bool = False,
                 priority_fns: Mapping[str, PriorityFn] | None = None) -> None:
        if int(max_length) != max_length or max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2 rows (one action), got {max_length}")
        self.max_length = int(max_length)
        super().__init__(store, tables, view=EpisodeView(self.max_length, bool(ragged)), item_spec=None,
                         priority_fns=priority_fns, min_capacity=self.max_length + 1)

    def _precheck(self, block: StepBlock) -> None:
        lanes = np.flatnonzero(self._open >= 0)  # one step a block: the lanes' state is the adder's
        rows_after = self._open[lanes] - self._episode_start[lanes] + 2  # the open row, plus one new row
        over = rows_after > self.max_length
        if over.any():
            lane = int(lanes[over][0])
            raise ValueError(
                f"the episode on lane {lane} would reach {int(rows_after[over][0])} rows, more than "
                f"max_length={self.max_length}; raise max_length or end episodes sooner (e.g. a time limit)")

    def on_step(self, events: StepEvents) -> None:
        if events.ended.size:
            self.insert_items(events.ended, events.episode_starts, events.final_rows - events.episode_starts + 1, None)
