"""The variable source: the learner's latest parameters, held for the actors as a Ray object and a version.

The driver publishes the learner's parameters (``ray.put`` once, then :meth:`VariableSource.publish` with the
reference); an actor asks :meth:`VariableSource.newer` for parameters newer than the version it has and
fetches them from Ray's object store only when there are some. The source holds a reference, never a copy,
so a publish costs one ``ray.put`` however many actors pull. An actor that acts in lockstep with the learner
(``on_policy``) asks with a timeout: its call waits until the learner publishes, or the source is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["VariableSource"]


class VariableSource:
    """The latest published parameters (an object reference inside a list, so that Ray passes the reference
    on, not the value) and their version (-1: nothing published). Its methods run in one event loop (an
    asyncio Ray actor)."""

    def __init__(self) -> None:
        self.version = -1
        self._params: list[Any] = []
        self._closed = False
        self._changed: asyncio.Condition | None = None  # made in the event loop, on first use

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def publish(self, version: int, params: list[Any]) -> None:
        """Hold ``params`` (``[ref]``) as version ``version`` (an older version than held is ignored)."""
        if version > self.version:
            self.version, self._params = int(version), list(params)
            async with self._condition():
                self._condition().notify_all()

    async def newer(self, version: int, timeout: float = 0.0) -> tuple[int, list[Any]] | None:
        """``(version, [ref])`` once what is held is newer than ``version``, waiting up to ``timeout`` seconds
        for a publication (a wait ends early when the source is closed); None if nothing newer is held then."""
        if timeout > 0 and not (self._closed or self.version > version):
            changed = self._condition()
            async with changed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait_for(lambda: self._closed or self.version > version), timeout)
        return (self.version, self._params) if self.version > version else None

    async def close(self) -> None:
        """End every wait now and from now on (the run is over): :meth:`newer` answers at once."""
        self._closed = True
        async with self._condition():
            self._condition().notify_all()

    async def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed
