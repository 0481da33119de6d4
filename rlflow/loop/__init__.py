"""The loop and its parts: the event loop of one process (:mod:`~rlflow.loop.runner`: :func:`run`, its
:class:`RunConfig` and :class:`RunResult`), the actor between policy and env and the episodes' statistics
(:mod:`~rlflow.loop.actors`), the checks a run makes of its parts before it starts
(:mod:`~rlflow.loop.checks`), its checkpoints (:mod:`~rlflow.loop.checkpoint`) and the saving of a trained
policy and learner (:mod:`~rlflow.loop.saving`). ``rlflow`` exports the names a user calls; the distributed
launcher builds on the same parts.
"""

from rlflow.loop.actors import Actor, EpisodeStats, VariableClient, evaluate
from rlflow.loop.runner import RunConfig, RunResult, StopRequest, run
from rlflow.loop.saving import load, save

__all__ = ["Actor", "EpisodeStats", "RunConfig", "RunResult", "StopRequest", "VariableClient", "evaluate", "load",
           "run", "save"]
