"""The variable source: the learner's latest parameters, held for the actors as a Ray object and a version.

The driver publishes the learner's parameters (``ray.put`` once, then :meth:`VariableSource.publish` with the
reference); an actor asks :meth:`VariableSource.newer` for parameters newer than the version it has and
fetches them from Ray's object store only when there are some. The source holds a reference, never a copy,
so a publish costs one ``ray.put`` however many actors pull.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VariableSource"]


class VariableSource:
    """The latest published parameters (an object reference inside a list, so that Ray passes the reference
    on, not the value) and their version (-1: nothing published)."""

    def __init__(self) -> None:
        self.version = -1
        self._params: list[Any] = []

    def publish(self, version: int, params: list[Any]) -> None:
        """Hold ``params`` (``[ref]``) as version ``version`` (an older version than held is ignored)."""
        if version > self.version:
            self.version, self._params = int(version), list(params)

    def newer(self, version: int) -> tuple[int, list[Any]] | None:
        """``(version, [ref])`` if what is held is newer than ``version``, else None."""
        return (self.version, self._params) if self.version > version else None
