"""Compiled per-step kernels of the acting side (numba, cached on disk): what runs once per env step
outside the adders, where a handful of numpy calls would cost more than the work."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def count_step(reward: np.ndarray, first: np.ndarray, last: np.ndarray, returns: np.ndarray, lengths: np.ndarray,
               ended_returns: np.ndarray, ended_lengths: np.ndarray) -> int:
    """One step of :class:`rlflow.actors.EpisodeStats` on every lane; returns how many episodes ended.

    A lane that acted (anything but a lone ``first``) adds its reward and a step; a lane that is
    ``last`` hands its episode's return and length to ``ended_*[:m]`` (in lane order) and starts over.
    """
    m = 0
    for i in range(first.shape[0]):
        if first[i] and not last[i]:  # a reset: no action belongs to this call
            continue
        returns[i] += reward[i]
        lengths[i] += 1
        if last[i]:
            ended_returns[m] = returns[i]
            ended_lengths[m] = lengths[i]
            m += 1
            returns[i] = 0.0
            lengths[i] = 0
    return m
