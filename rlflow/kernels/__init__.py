"""Every compiled routine of rlflow (numba), importing only numpy and numba.

- :mod:`~rlflow.kernels.prefetch`: cache-line requests and byte copies the other kernels inline.
- :mod:`~rlflow.kernels.packed`: a struct of arrays as one argument (``Packed``) of the per-call kernels.
- :mod:`~rlflow.kernels.items`: item records, windows, episode marks, gathers.
- :mod:`~rlflow.kernels.selection`: the selectors' structures (dense arrays, insertion rings, top-k).
- :mod:`~rlflow.kernels.rows`: a RowTable's placements, evictions and draws.
- :mod:`~rlflow.kernels.steps`: the block writer (rows of a :class:`~rlflow.adders.StepBlock`) and the
  n-step item maker.

Every kernel is compiled with :data:`compiled` (cached on disk, releasing the GIL), or :data:`per_step` for the
calls made once per env step, too short to gain from releasing the GIL.
"""

from numba import njit

compiled = njit(cache=True, nogil=True)
per_step = njit(cache=True)
