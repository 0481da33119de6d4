"""A batched sum tree with a min tree beside it, compiled with numba, shaped for the CPU cache.

The tree is ``BRANCH``-ary (8 children per node): a million leaves need 8 levels instead of 21, and the
8 float64 child sums of a node fill one 64-byte cache line, so a descent or an update touches about
one memory line per level (8 was the fastest of 8, 16 and 32 on the replay benchmark's prioritized case). Levels are
stored top to bottom in one flat array; level ``d`` starts at ``offsets[d]``; the children of node ``j``
of level ``d`` are nodes ``j * BRANCH .. j * BRANCH + BRANCH - 1`` of level ``d + 1``; the last level
holds the leaves.

Every internal node is recomputed as the sum (min) of its children in a fixed order, never by adding a
delta: values do not drift however many updates are made, and the tree is a pure function of its
leaves (a rebuild gives it bit for bit). The min tree covers internal nodes only and counts positive
leaves only, so its root is the smallest positive leaf (``inf`` when there is none).

A batch of updates is applied in order (a repeated leaf keeps its last value).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rlflow.kernels import compiled
from rlflow.kernels.prefetch import prefetch

__all__ = ["BRANCH", "draws_left", "find", "rebuild", "sample", "sequential", "update"]


BRANCH = 8


@njit(inline="always", cache=True)
def _recompute(sums: np.ndarray, mins: np.ndarray, offsets: np.ndarray, d: int, j: int) -> None:
    """Node ``j`` of level ``d`` from its children (leaves count in the min only when positive); inlined in
    its two callers (one function fewer to compile)."""
    first = offsets[d + 1] + j * BRANCH
    s = 0.0
    m = np.inf
    if d == offsets.shape[0] - 3:  # the children are leaves: their min is read from the sums
        for c in range(BRANCH):
            v = sums[first + c]
            s += v
            if v > 0.0:
                m = min(m, v)
    else:
        for c in range(BRANCH):
            s += sums[first + c]
            m = min(m, mins[first + c])
    sums[offsets[d] + j] = s
    mins[offsets[d] + j] = m


@compiled
def update(sums: np.ndarray, mins: np.ndarray, offsets: np.ndarray, slots: np.ndarray,
            values: np.ndarray, exponent: float) -> None:
    """Set leaves to ``values ** exponent`` in order, then recompute their ancestors level by level.

    Level by level, the batch's memory reads are independent of each other and are all prefetched
    before any is used, so their cache misses overlap instead of adding up; a parent shared with the
    previous entry (sorted batches) is recomputed once.
    """
    depth = offsets.shape[0] - 1
    leaf0 = offsets[depth - 1]
    n = slots.shape[0]
    for i in range(n):
        prefetch(sums, leaf0 + slots[i])
    for i in range(n):
        v = values[i]
        if exponent != 1.0:
            v = v**exponent if v > 0.0 else 0.0  # a zero stays zero, also for exponent 0
        sums[leaf0 + slots[i]] = v
    nodes = slots.copy()
    for d in range(depth - 2, -1, -1):
        for i in range(n):
            prefetch(sums, offsets[d] + nodes[i] // BRANCH)
            prefetch(mins, offsets[d] + nodes[i] // BRANCH)
        previous = -1
        for i in range(n):
            j = nodes[i] // BRANCH
            nodes[i] = j
            if j != previous:
                _recompute(sums, mins, offsets, d, j)
                previous = j


@compiled
def rebuild(sums: np.ndarray, mins: np.ndarray, offsets: np.ndarray) -> None:
    depth = offsets.shape[0] - 1
    for d in range(depth - 2, -1, -1):
        for j in range((offsets[d + 2] - offsets[d + 1]) // BRANCH):  # nodes of level d in use
            _recompute(sums, mins, offsets, d, j)


@compiled
def find(sums: np.ndarray, offsets: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The leaf where the running sum passes each target; never a zero leaf while the total is > 0.

    At each node: the first child whose running sum exceeds what is left of the target (counted without
    branches: the number of running sums at or below it), which always has positive mass. If rounding
    leaves the target at or past the children's total, the last child with positive mass is taken, and
    the rest of the descent follows last positive children. All targets descend together, level by
    level, and each level's nodes are prefetched before any is read, so their cache misses overlap.
    """
    depth = offsets.shape[0] - 1
    n = targets.shape[0]
    u = targets.copy()
    nodes = np.empty(n, np.int64)
    overflow = np.empty(n, np.bool_)
    for i in range(n):  # set here, not by np.zeros: one numpy overload fewer to compile on a cold start
        nodes[i] = 0
        overflow[i] = False
    for d in range(1, depth):
        for i in range(n):  # start every load of this level before using any
            prefetch(sums, offsets[d] + nodes[i] * BRANCH)
        for i in range(n):
            first = offsets[d] + nodes[i] * BRANCH
            pick = 0
            if not overflow[i]:
                target = u[i]
                running = 0.0
                below = 0.0
                for c in range(BRANCH):
                    running += sums[first + c]
                    passed = running <= target
                    pick += passed
                    below = running if passed else below
                u[i] = target - below
            if pick == BRANCH or overflow[i]:
                overflow[i] = True
                pick = 0
                for c in range(BRANCH):
                    if sums[first + c] > 0.0:
                        pick = c
            nodes[i] = nodes[i] * BRANCH + pick
    return nodes


@compiled
def sample(sums: np.ndarray, mins: np.ndarray, offsets: np.ndarray, uniforms: np.ndarray, stratified: bool,
            beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leaves drawn proportionally to their mass, their probabilities, and importance weights.

    Target ``j`` of ``n`` is ``(j + u_j) / n`` of the total when stratified, else ``u_j`` of it. The
    weight of a leaf of mass ``m`` is ``(min_mass / m) ** beta``, which is ``(N P(i)) ** -beta`` divided
    by its largest value over the tree (``min_mass``: the smallest positive leaf, the min tree's root).
    """
    n = uniforms.shape[0]
    total = sums[0]
    targets = np.empty(n)
    for j in range(n):
        targets[j] = (j + uniforms[j]) * (total / n) if stratified else uniforms[j] * total
    leaves = find(sums, offsets, targets)
    leaf0 = offsets[offsets.shape[0] - 2]
    min_mass = mins[0]
    probabilities = np.empty(n)
    weights = np.empty(n, np.float32)
    for j in range(n):
        m = sums[leaf0 + leaves[j]]
        probabilities[j] = m / total
        weights[j] = (min_mass / m) ** beta
    return leaves, probabilities, weights


@compiled
def sequential(sums: np.ndarray, mins: np.ndarray, offsets: np.ndarray, leaves: np.ndarray, retires: np.ndarray,
                beta: float) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and importance weights of draws ``leaves`` made one after another, where a draw with
    ``retires`` set takes its leaf out of the draws after it: draw ``j`` of a leaf of mass ``m`` has
    probability ``m / total`` and weight ``(min_mass / m) ** beta`` over the leaves still in. Each retiring
    leaf is set to 0 in turn (a leaf retires at most once), and every one is put back at the end: the
    tree is a pure function of its leaves, so it is left bit for bit as it was."""
    n = leaves.shape[0]
    leaf0 = offsets[offsets.shape[0] - 2]
    masses = np.empty(n)
    for j in range(n):
        masses[j] = sums[leaf0 + leaves[j]]
    probabilities = np.empty(n)
    weights = np.empty(n, np.float32)
    one = np.empty(1, np.int64)
    zero = np.zeros(1)
    for j in range(n):
        m = masses[j]
        probabilities[j] = m / sums[0]
        weights[j] = (mins[0] / m) ** beta
        if retires[j]:
            one[0] = leaves[j]
            update(sums, mins, offsets, one, zero, 1.0)
    update(sums, mins, offsets, leaves[retires], masses[retires], 1.0)
    return probabilities, weights


@compiled
def draws_left(leaves: np.ndarray, times: np.ndarray, limit: int, enough: int) -> int:
    """The draws the leaves of positive mass have left before ``limit`` (``limit - times[i]`` each),
    counted until they reach ``enough``."""
    total = 0
    for i in range(leaves.shape[0]):
        if leaves[i] > 0.0:
            total += limit - times[i]
            if total >= enough:
                break
    return total
