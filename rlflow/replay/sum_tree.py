"""A batched sum tree with a min tree beside it, over ``capacity`` non-negative leaves, for the prioritized
selectors: a thin face of the compiled core's ``SumTree`` (``csrc/sum_tree.h``).

The tree is ``BRANCH``-ary (8 children per node): a million leaves need 8 levels instead of 21, and the 8
float64 child sums of a node fill one 64-byte cache line, so a descent or an update touches about one memory
line per level. Levels are stored top to bottom in one flat array (``sums``); level ``d`` starts at
``offsets[d]``; the children of node ``j`` of level ``d`` are nodes ``j * BRANCH .. j * BRANCH + BRANCH - 1``
of level ``d + 1``; the last level holds the leaves.

Every internal node is recomputed as the sum (min) of its children in a fixed order, never by adding a delta:
values do not drift however many updates are made, and the tree is a pure function of its leaves (a rebuild
gives it bit for bit). The min tree (``mins``) covers internal nodes only and counts positive leaves only, so
its root is the smallest positive leaf (``inf`` when there is none). A batch of updates is applied in order (a
repeated leaf keeps its last value). Every slot handed in is checked (``IndexError``) before any leaf changes.
The calls release the GIL; each takes the tree's own lock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow import _core

__all__ = ["BRANCH", "SumTree"]

BRANCH: int = _core.SUM_TREE_BRANCH


class SumTree:
    """Sums and minimum over ``capacity`` non-negative leaves, with batched updates and searches."""

    def __init__(self, capacity: int) -> None:
        self._tree = _core.SumTree(int(capacity))

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "leaves": self.leaves.copy()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._tree = _core.SumTree(state["capacity"])
        self._tree.set_leaves(state["leaves"])

    @property
    def capacity(self) -> int:
        return int(self._tree.capacity)

    @property
    def offsets(self) -> np.ndarray:
        """Where each level starts in :attr:`sums` (read-only)."""
        return self._tree.offsets

    @property
    def sums(self) -> np.ndarray:
        """Every node's sum, level by level, the leaves last (read-only)."""
        return self._tree.sums

    @property
    def mins(self) -> np.ndarray:
        """The internal nodes' minimum over their positive leaves (read-only)."""
        return self._tree.mins

    @property
    def leaves(self) -> np.ndarray:
        """The leaf values (a read-only view of the first ``capacity``)."""
        return self._tree.leaves

    @property
    def total(self) -> float:
        return float(self._tree.total)

    @property
    def min(self) -> float:
        """The smallest positive leaf (inf when none is positive)."""
        return float(self._tree.min)

    def update(self, slots: np.ndarray, values: np.ndarray, exponent: float = 1.0) -> None:
        """Set leaves ``slots`` to ``values ** exponent`` (zero stays zero), in order."""
        self._tree.update(np.asarray(slots, np.int64), np.asarray(values, np.float64), float(exponent))

    def sample(self, uniforms: np.ndarray, *, stratified: bool,
               beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Leaves drawn by mass from uniforms in ``[0, 1)``, with probabilities and importance weights.

        Target ``j`` of ``n`` is ``(j + u_j) / n`` of the total when stratified, else ``u_j`` of it. The weight
        of a leaf of mass ``m`` is ``(min_mass / m) ** beta``, which is ``(N P(i)) ** -beta`` divided by its
        largest value over the tree (``min_mass``: the smallest positive leaf)."""
        return self._tree.sample(np.asarray(uniforms, np.float64), bool(stratified), float(beta))

    def sequential(self, leaves: np.ndarray, retires: np.ndarray, *,
                   beta: float) -> tuple[np.ndarray, np.ndarray]:
        """Probabilities and importance weights of draws ``leaves`` made in order, each over the leaves
        that the earlier draws with ``retires`` set have not taken out (the tree is left as it was)."""
        return self._tree.sequential(np.asarray(leaves, np.int64), np.asarray(retires, np.bool_), float(beta))

    def draws_left(self, times: np.ndarray, limit: int, enough: int) -> int:
        """``sum(limit - times[i])`` over the leaves ``i`` of positive mass, counted until it reaches
        ``enough`` (a scan that stops there)."""
        return int(self._tree.draws_left(np.asarray(times, np.int64), int(limit), int(enough)))

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target mass in ``[0, total)``: the leaf where the running sum passes it; never a zero leaf
        while the total is > 0 (when rounding leaves a target at or past a node's children's total, the last
        child with positive mass is taken)."""
        return self._tree.find(np.asarray(targets, np.float64))

    def set_leaves(self, values: np.ndarray) -> None:
        """Replace every leaf and rebuild the tree."""
        self._tree.set_leaves(np.asarray(values, np.float64))
