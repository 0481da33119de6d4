"""Item views: how a table's sampled items are shaped into a batch.

A table without a view returns each item's window of rows as ``[B, L, ...]`` columns with a mask. An
adder declares the kind of item it writes on the tables it feeds (:meth:`Table.configure_items`), and
from then on ``Table.sample`` shapes the batch by that kind:

- :class:`TransitionView`: a :class:`Transition` ``[B, ...]``; only the rows a transition needs are
  gathered (the observation, action and extras of the window's first row, the observation of its last
  row) and the reward and discount come from the item's fields.
- :class:`SequenceView`: the window's rows ``[B, L, ...]`` in the store's nesting with a mask
  ``[B, L]``, ``L`` fixed by the adder.
- :class:`EpisodeView`: whole episodes, padded to ``[B, max_length, ...]`` with a mask, or ragged (a
  list of ``B`` episodes, each ``[T_i, ...]``).

A view also holds the adder's settings that decide which items are written and what their fields hold
(n-step ``n`` and ``discount``; sequence ``length``, ``period`` and ``end_behavior``; episode
``max_length``): its :meth:`~ItemView.config` is part of the table's configuration, so a checkpoint of
the table loads only into a table fed by an adder with the same settings, and a table takes items of one
such adder only.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rlflow import _core
from rlflow import specs as _specs
from rlflow.replay.items import LANE, LENGTH, START, VALID

__all__ = ["EpisodeView", "ItemView", "SequenceView", "Transition", "TransitionView"]


class Transition(NamedTuple):
    """A batch of (n-step) transitions, each leaf ``[B, ...]``.

    ``next_observation`` is the observation ``k`` steps after ``observation`` (``k`` = the number of
    rewards summed into ``reward``), and the learner's target is ``reward + discount * Q(next_observation)``:
    ``discount`` is ``gamma ** k``, or 0 when the episode terminated within the window.
    """

    observation: Any
    action: Any
    reward: np.ndarray
    discount: np.ndarray
    next_observation: Any
    extras: Any = None


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + "/")


def nest_part(store: Any, flat: dict[str, np.ndarray], prefix: str) -> Any:
    """The columns under ``prefix`` in the spec's nesting of that part of the row (None if absent)."""
    part = store.spec.get(prefix)
    return None if part is None else _specs.unflatten(part, flat, prefix)


def other_setting(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """The first item setting (``kind`` first) whose value differs between two views' configs, as
    ``(name, mine, theirs)`` (None where absent); None when they agree."""
    for key in sorted(set(mine) | set(theirs), key=lambda k: (k != "kind", k)):
        if mine.get(key) != theirs.get(key):
            return key, mine.get(key), theirs.get(key)
    return None


class ItemView:
    """Shapes sampled items into a batch (see the module docstring)."""

    kind = "window"

    def config(self) -> dict[str, Any]:
        """The item kind and every setting that shapes its items (plain values, for checkpoints)."""
        return {"kind": self.kind}

    def gather(self, store: Any, meta: np.ndarray, fields: dict[str, np.ndarray]) -> tuple[Any, Any]:
        """The batch of items ``meta`` (item records) and its mask (or None)."""
        raise NotImplementedError


@dataclass(frozen=True)
class TransitionView(ItemView):
    """Windows ``(t, k + 1 rows)`` as transitions ``(s_t, a_t, R, discount, s_{t+k})``, of an n-step adder
    with ``n`` and ``discount`` (the item fields hold the return and discount)."""

    n: int
    discount: float
    kind = "transition"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "n": self.n, "discount": self.discount}

    def gather(self, store: Any, meta: np.ndarray, fields: dict[str, np.ndarray]) -> tuple[Transition, None]:
        plan = _transition_plan(store)
        ends = _core.window_ends(meta, store.capacity)  # [2, B]: each half a [B, ...] batch
        first = ends[0]
        obs: dict[str, np.ndarray] = {}
        nxt: dict[str, np.ndarray] = {}
        for name in plan.observation:
            both = store.take_column(name, ends, by_column=True)
            obs[name], nxt[name] = both[0], both[1]
        rows = {name: store.take_column(name, first) for name in plan.rows}
        batch = Transition(
            observation=plan.nest["observation"](obs),
            action=plan.nest["action"](rows),
            reward=fields["return"],
            discount=fields["discount"],
            next_observation=plan.nest["observation"](nxt),
            extras=plan.nest["extras"](rows),
        )
        return batch, None


class _TransitionPlan(NamedTuple):
    observation: list[str]  # flat columns gathered at both ends of the window
    rows: list[str]  # action and extras columns, gathered at the window's first row
    nest: dict[str, Any]  # part -> flat columns of that part in the spec's nesting (None if absent)


_PLANS: weakref.WeakKeyDictionary[Any, _TransitionPlan] = weakref.WeakKeyDictionary()


def _transition_plan(store: Any) -> _TransitionPlan:
    """Which of the store's columns a transition reads, worked out once per store."""
    plan = _PLANS.get(store)
    if plan is None:
        flat = store.flat_columns()
        nest: dict[str, Callable[[dict[str, np.ndarray]], Any]] = {}
        for prefix in ("observation", "action", "extras"):
            part = store.spec.get(prefix)
            if part is None:
                nest[prefix] = lambda cols: None
            elif isinstance(part, _specs.Field):
                nest[prefix] = operator.itemgetter(prefix)
            else:
                nest[prefix] = functools.partial(_specs.unflatten_by, _specs.unflatten_plan(part, prefix))
        plan = _TransitionPlan(
            observation=[n for n in flat if under(n, "observation")],
            rows=[n for n in flat if under(n, "action") or under(n, "extras")],
            nest=nest,
        )
        _PLANS[store] = plan
    return plan


@dataclass(frozen=True)
class SequenceView(ItemView):
    """Windows of up to ``length`` rows as ``[B, length, ...]`` plus a mask ``[B, length]``, written every
    ``period`` rows with ends handled by ``end_behavior`` (:class:`rlflow.adders.EndBehavior`'s value)."""

    length: int
    period: int
    end_behavior: str
    kind = "sequence"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "length": self.length, "period": self.period, "end_behavior": self.end_behavior}

    def gather(self, store: Any, meta: np.ndarray, fields: dict[str, np.ndarray]) -> tuple[Any, np.ndarray]:
        return _padded(store, meta, self.length)


@dataclass(frozen=True)
class EpisodeView(ItemView):
    """Whole episodes: padded to ``max_length`` rows with a mask, or a ragged list when ``ragged``."""

    max_length: int
    ragged: bool = False
    kind = "episode"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "max_length": self.max_length, "ragged": self.ragged}

    def gather(self, store: Any, meta: np.ndarray, fields: dict[str, np.ndarray]) -> tuple[Any, Any]:
        if not self.ragged:
            return _padded(store, meta, self.max_length)
        cap = store.capacity
        episodes = []
        for b in range(meta.shape[0]):
            idx = meta[b, LANE] * cap + (meta[b, START] + np.arange(meta[b, VALID])) % cap
            episodes.append(store.unflatten(store.take(idx)))
        return episodes, None


def _padded(store: Any, meta: np.ndarray, length: int) -> tuple[Any, np.ndarray]:
    """Windows as ``[B, length, ...]``: rows past each item's valid length zero-filled and masked."""
    padded = meta.copy()
    padded[:, LENGTH] = length
    np.minimum(padded[:, VALID], length, out=padded[:, VALID])
    if meta.shape[0]:
        idx, mask, full = _core.window_index(padded, store.capacity)
    else:
        idx, mask, full = np.zeros((0, length), np.int64), np.zeros((0, length), bool), True
    data = store.take(idx)
    if not full:
        hole = ~mask
        for arr in data.values():
            arr[hole] = 0
    return store.unflatten(data), mask
