"""Compatibility facades: other buffers' interfaces on rlflow, so their users switch by changing an import.

- :mod:`rlflow.compat.flexibuff`: flexibuff's ``FlexibleBuffer`` and ``FlexiBatch``.
"""
