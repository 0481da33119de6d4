"""Compiled kernels of :mod:`rlflow.minibatches` (numba): the epoch's shuffle and the flat rows of an index.

- :func:`shuffle`: Fisher-Yates over an int64 array, driven by uniform draws the caller takes from its own
  ``numpy.random.Generator`` (``rng.random(n)``, a few ns each), so a seeded generator gives the same order
  on every machine; the swaps run compiled, several times faster than ``Generator.permutation``, whose
  bounded integer draws dominate its cost.
- :func:`flat_rows`: ``np.ravel_multi_index`` of in-range indices in one pass, with the bounds checked on the
  way (numpy's version checks each element in a generic loop, several times slower for a minibatch).
"""

from __future__ import annotations

import numpy as np

from rlflow.kernels import compiled

IN_RANGE = -1  # flat_rows' status when every index was inside its axis


@compiled
def shuffle(values: np.ndarray, uniforms: np.ndarray) -> None:
    """Shuffle ``values`` in place: for ``i`` from the last position down to 1, swap position ``i`` with
    position ``j = floor(uniforms[i] * (i + 1))`` (uniform over ``0 .. i``); ``uniforms`` holds ``values.size``
    draws in ``[0, 1)`` (``uniforms[0]`` is not used). Every order is equally likely up to the 53-bit
    resolution of the draws (a bias below ``n / 2**53``)."""
    for i in range(values.shape[0] - 1, 0, -1):
        j = int(uniforms[i] * (i + 1))  # u < 1, so u * (i + 1) < i + 1 in floating point too
        tmp = values[i]
        values[i] = values[j]
        values[j] = tmp


@compiled
def flat_rows(index: tuple, lead: tuple, out: np.ndarray) -> int:
    """``out[m] = ravel_multi_index((index[0][m], index[1][m], ...), lead)`` for int64 index arrays of
    ``out.size`` elements each. Returns :data:`IN_RANGE`, or the first ``m`` with an index outside
    ``[0, lead[axis])`` (``out`` is then partly written: the caller lets numpy's indexing decide instead)."""
    for m in range(out.shape[0]):
        flat = 0
        for axis in range(len(index)):
            i = index[axis][m]
            if i < 0 or i >= lead[axis]:
                return m
            flat = flat * lead[axis] + i
        out[m] = flat
    return IN_RANGE
