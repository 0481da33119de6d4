"""The learner's side of a distributed run: samples in flight, learner steps, priorities and parameters.

:class:`LearnerWorker` holds the user's Learner. :func:`rlflow.distributed.run` keeps it in the driver's
process by default, or makes it a Ray actor of its own with the resources of ``Layout.learner_options``
(e.g. ``{"num_gpus": 1}``): the same class, so the learner steps the same way wherever it is.

Each :meth:`LearnerWorker.train` call makes learner steps for up to a given number of seconds. Samples come
from the replay server up to ``prefetch`` a request, the next request asked as soon as one is answered, so
the next samples are there when a step ends; priorities go back without waiting for an answer; the
parameters are published to the variable source every ``publish_every`` learner steps.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rlflow.core import Learner, learner_step
from rlflow.distributed.retry import until_answered

__all__ = ["LearnerReport", "LearnerWorker"]

_SAMPLE_WAIT = 0.5  # seconds a sample request waits at the server before the worker looks around again


@dataclass
class LearnerReport:
    """What :meth:`LearnerWorker.train` did: the learner's step count after it, the metrics of its steps (per
    name, their sum and count) and the last step's metrics."""

    learner_steps: int
    sums: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)


class LearnerWorker:
    """The user's learner fed by the replay server (see the module docstring).

    Args:
        learner: the Learner, or its pickle (what another process sends).
        server, source: Ray handles of the replay server and the variable source.
        batch_size: items a sample holds.
        prefetch: samples one request brings at most.
        publish_every: learner steps between publications of the parameters.
        wait_timeout: seconds to wait for a restarting replay server.
        learner_steps: the step count to go on from (a resumed run's).
    """

    def __init__(self, learner: Learner | bytes, server: Any, source: Any, *, batch_size: int, prefetch: int,
                 publish_every: int, wait_timeout: float, learner_steps: int = 0) -> None:
        self.learner: Learner = pickle.loads(learner) if isinstance(learner, bytes) else learner
        self.server, self.source = server, source
        self.batch_size, self.prefetch, self.publish_every = int(batch_size), int(prefetch), int(publish_every)
        self.wait_timeout = float(wait_timeout)
        self.learner_steps = int(learner_steps)
        self.version = -1  # of the parameters published last
        self._request: Any = None  # the sample request in flight
        self._ready: deque[Any] = deque()  # samples received, not yet learned from

    def publish(self, *, wait: bool = False) -> int:
        """Publish the learner's parameters now, as the next version; that version. With ``wait``, once the
        variable source holds them (the first publication: every actor starts with it)."""
        import ray

        self.version += 1
        done = self.source.publish.remote(self.version, [ray.put(self.learner.get_params())])
        if wait:
            ray.get(done)
        return self.version

    def train(self, seconds: float) -> LearnerReport:
        """Learner steps for up to ``seconds`` (at least one look for a sample); what they did."""
        report = LearnerReport(self.learner_steps)
        deadline = time.monotonic() + seconds
        while True:
            sample = self._next_sample()
            if sample is not None:
                self._step(sample, report)
            if time.monotonic() >= deadline:
                return report

    def _step(self, sample: Any, report: LearnerReport) -> None:
        update = learner_step(self.learner, sample.copy())  # writable arrays of this process (Ray's are read-only)
        if update.priorities is not None:
            self.server.update_priorities.remote(sample.keys, update.priorities)
        self.learner_steps += 1
        report.learner_steps = self.learner_steps
        report.last = dict(update.metrics)
        for k, v in update.metrics.items():
            total = report.sums.setdefault(k, [0.0, 0])
            total[0] += v
            total[1] += 1
        if self.learner_steps % self.publish_every == 0:
            self.publish()

    def _next_sample(self) -> Any:
        """The next sample received (None if none came within ``_SAMPLE_WAIT`` seconds, or the server stops).

        One request is in flight at a time, asked again as soon as the last one is answered (before the learner
        trains on what it brought): Ray runs an asyncio actor's calls concurrently, in no set order, so two
        requests in flight could be served in either order and a FIFO table's items reach the learner out of
        order."""
        import ray

        if not self._ready:
            if self._request is None:
                self._request = self._ask()
            try:
                received = ray.get(self._request)
            except ray.exceptions.RayActorError:  # the server restarts: ask again once it is up
                self._request = None
                until_answered(self.server.ping.remote, timeout=self.wait_timeout,
                               errors=(ray.exceptions.RayActorError,))
                return None
            self._request = self._ask()
            if received is None:
                return None
            self._ready.extend(received)
        return self._ready.popleft()

    def _ask(self) -> Any:
        return self.server.sample.remote(self.batch_size, _SAMPLE_WAIT, self.prefetch)

    def state(self) -> dict[str, Any]:
        """The learner's ``state_dict()`` and step count, as ``learner.pt`` holds them."""
        return {"learner": self.learner.state_dict(), "learner_steps": self.learner_steps}
