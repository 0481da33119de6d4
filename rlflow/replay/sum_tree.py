"""A batched sum tree with a min tree beside it, over ``capacity`` non-negative leaves: the arrays, and calls
of the compiled routines of :mod:`rlflow.kernels.sum_tree`, which describes the tree's layout and its
guarantees (no drift, batches applied in order)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow.kernels import sum_tree
from rlflow.kernels.sum_tree import BRANCH

__all__ = ["BRANCH", "SumTree"]


def _cache_aligned(n: int, fill: float) -> np.ndarray:
    """``n`` float64 set to ``fill``, starting on a 64-byte boundary."""
    buf = np.full(n + 8, fill, np.float64)
    shift = (-buf.ctypes.data % 64) // 8
    return buf[shift: shift + n]


class SumTree:
    """Sums and minimum over ``capacity`` non-negative leaves, with batched updates and searches."""

    def __init__(self, capacity: int) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        # Levels top-down: the root, then for each level BRANCH children for every node in use above it.
        # Level d uses ceil(capacity / BRANCH^(depth - 1 - d)) nodes; the rest of it is padding.
        depth = 1
        while BRANCH ** (depth - 1) < self.capacity:
            depth += 1
        depth = max(depth, 2)
        # Every level starts on a multiple of BRANCH (the root's level is padded to BRANCH), and both
        # arrays start on a cache line, so each node's children share one 64-byte line.
        sizes = [BRANCH] + [-(-self.capacity // BRANCH ** (depth - d)) * BRANCH for d in range(1, depth)]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.sums = _cache_aligned(int(self.offsets[-1]), 0.0)
        self.mins = _cache_aligned(int(self.offsets[-2]), np.inf)  # internal nodes only

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name in ("sums", "mins"):  # on a cache line again
            aligned = _cache_aligned(state[name].size, 0.0)
            aligned[...] = state[name]
            setattr(self, name, aligned)

    @property
    def leaves(self) -> np.ndarray:
        """The leaf values (a view of the first ``capacity``)."""
        start = int(self.offsets[-2])
        return self.sums[start: start + self.capacity]

    @property
    def total(self) -> float:
        return float(self.sums[0])

    @property
    def min(self) -> float:
        """The smallest positive leaf (inf when none is positive)."""
        return float(self.mins[0])

    def update(self, slots: np.ndarray, values: np.ndarray, exponent: float = 1.0) -> None:
        """Set leaves ``slots`` to ``values ** exponent`` (zero stays zero), in order."""
        sum_tree.update(self.sums, self.mins, self.offsets, slots, np.asarray(values, np.float64), float(exponent))

    def sample(self, uniforms: np.ndarray, *, stratified: bool,
               beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Leaves drawn by mass from uniforms in ``[0, 1)``, with probabilities and importance weights."""
        return sum_tree.sample(self.sums, self.mins, self.offsets, uniforms, stratified, float(beta))

    def sequential(self, leaves: np.ndarray, retires: np.ndarray, *,
                   beta: float) -> tuple[np.ndarray, np.ndarray]:
        """Probabilities and importance weights of draws ``leaves`` made in order, each over the leaves
        that the earlier draws with ``retires`` set have not taken out (the tree is left as it was)."""
        return sum_tree.sequential(self.sums, self.mins, self.offsets, np.asarray(leaves, np.int64),
                           np.asarray(retires, np.bool_), float(beta))

    def draws_left(self, times: np.ndarray, limit: int, enough: int) -> int:
        """``sum(limit - times[i])`` over the leaves ``i`` of positive mass, counted until it reaches
        ``enough`` (a scan that stops there)."""
        return int(sum_tree.draws_left(self.leaves, times, int(limit), int(enough)))

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target mass in ``[0, total)``: the leaf where the running sum passes it."""
        return sum_tree.find(self.sums, self.offsets, targets)

    def set_leaves(self, values: np.ndarray) -> None:
        """Replace every leaf and rebuild the tree."""
        self.sums[:] = 0.0
        self.leaves[:] = values
        sum_tree.rebuild(self.sums, self.mins, self.offsets)
