"""Every compiled routine of rlflow (numba), importing only numpy and numba.

- :mod:`~rlflow.kernels.prefetch`: cache-line requests and byte copies the other kernels inline.
- :mod:`~rlflow.kernels.packed`: a struct of arrays as one argument (``Packed``) of the per-call kernels.
- :mod:`~rlflow.kernels.items`: item records, windows, episode marks, gathers.
- :mod:`~rlflow.kernels.selection`: the selectors' structures (dense arrays, insertion rings, top-k).
- :mod:`~rlflow.kernels.rows`: a RowTable's placements, evictions and draws.

Every kernel is compiled with :data:`compiled` (cached on disk, releasing the GIL). The write path (the block
filler, the block writer, the n-step item maker, ReplayBuffer's call classifier) is in the compiled core,
``rlflow._core``.
"""

from numba import njit

compiled = njit(cache=True, nogil=True)
