"""A batched sum tree with a min tree beside it, over ``capacity`` non-negative leaves, for the prioritized
selectors: the compiled core's ``SumTree`` (``csrc/sum_tree.h``).

The tree is ``BRANCH``-ary (8 children per node): a million leaves need 8 levels instead of 21, and the 8
float64 child sums of a node fill one 64-byte cache line, so a descent or an update touches about one memory
line per level. Levels are stored top to bottom in one flat array (``sums``); level ``d`` starts at
``offsets[d]``; the children of node ``j`` of level ``d`` are nodes ``j * BRANCH .. j * BRANCH + BRANCH - 1``
of level ``d + 1``; the last level holds the leaves.

Every internal node is recomputed as the sum (min) of its children in a fixed order, never by adding a delta:
values do not drift however many updates are made, and the tree is a pure function of its leaves (a rebuild
gives it bit for bit; a pickle holds the capacity and the leaves). The min tree (``mins``) covers internal
nodes only and counts positive leaves only, so its root is the smallest positive leaf (``inf`` when there is
none).

Its calls, each on numpy arrays (converted to int64 slots and float64 values where they are not):

- ``update(slots, values, exponent=1.0)``: leaves ``slots`` set to ``values ** exponent`` (zero stays zero), in
  order (a repeated leaf keeps its last value);
- ``sample(uniforms, stratified=, beta=)``: leaves drawn by mass, target ``j`` of ``n`` at ``(j + u_j) / n`` of
  the total when stratified, else ``u_j`` of it; returns ``(leaves, probabilities, weights)``, the weight of a
  leaf of mass ``m`` being ``(min / m) ** beta``, i.e. ``(N P(i)) ** -beta`` over its largest value;
- ``sequential(leaves, retires, beta=)``: probabilities and weights of draws made in order, each over the
  leaves that earlier draws with ``retires`` set took out (the tree is left as it was);
- ``find(targets)``: for each target mass in ``[0, total)`` the leaf where the running sum passes it, never a
  zero leaf while the total is > 0 (when rounding leaves a target at or past a node's children's total, the
  last child with positive mass is taken);
- ``draws_left(times, limit, enough)``: ``sum(limit - times[i])`` over the leaves of positive mass, counted
  until it reaches ``enough``;
- ``set_leaves(values)``: every leaf replaced, the tree rebuilt;
- read-only views ``leaves``, ``sums``, ``mins``, ``offsets``; ``total``, ``min`` (the smallest positive leaf)
  and ``capacity``.

Every slot handed in is checked (``IndexError``) before any leaf changes, and lengths that do not match are a
``ValueError``. The calls release the GIL; each takes the tree's own lock.
"""

from __future__ import annotations

from rlflow import _core

__all__ = ["BRANCH", "SumTree"]

BRANCH: int = _core.SUM_TREE_BRANCH
SumTree = _core.SumTree
