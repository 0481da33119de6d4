"""Calls to a Ray actor that may be restarting: asked again until it answers or a deadline passes.

Every part of a distributed run that calls another (the driver the replay server, an actor the server, the
learner the server) waits the same way while Ray restarts the one it calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["until_answered"]


def until_answered(call: Callable[[], Any], *, timeout: float, errors: tuple[type[BaseException], ...],
                   pause: float = 0.2) -> Any:
    """``ray.get(call())``, made again ``pause`` seconds after each of ``errors`` (what a restarting actor
    raises), for up to ``timeout`` seconds; then that error."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(call(), timeout=timeout)
        except errors:
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)
