"""A griffe extension for the API reference: the docstrings' Sphinx roles as links.

rlflow's docstrings name other objects the Sphinx way (``:class:`~rlflow.replay.Table```,
``:meth:`add```). Markdown has no such roles, so each becomes code, linked (an mkdocstrings cross-reference)
where it names an object the reference shows: a public name of one of rlflow's modules, or a member of one.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(~?)([^`]+)`")
PUBLIC_MODULES = ("rlflow", "rlflow.envs", "rlflow.adders", "rlflow.replay", "rlflow.specs", "rlflow.types",
                  "rlflow.returns", "rlflow.minibatches", "rlflow.loggers", "rlflow.policies", "rlflow.distributed",
                  "rlflow.compat.flexibuff", "rlflow.compat.harl")


def public_names() -> dict[str, str]:
    """Every object the reference shows, by each path that names it (``rlflow.replay.Table`` and the path of
    its defining module, ``rlflow.replay.table.Table``), to the path the reference shows it under."""
    out: dict[str, str] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        out[module_name] = module_name
        for name in getattr(module, "__all__", ()):
            shown = f"{module_name}.{name}"
            out[shown] = shown
            obj = getattr(module, name)
            home = getattr(obj, "__module__", None)
            if isinstance(home, str) and hasattr(obj, "__qualname__"):
                out.setdefault(f"{home}.{obj.__qualname__}", shown)
            if isinstance(obj, type):  # the methods and properties the reference shows: public, documented
                for member, value in vars(obj).items():
                    doc = getattr(getattr(value, "fget", value), "__doc__", None)
                    if not member.startswith("_") and callable(getattr(value, "fget", value)) and doc:
                        out[f"{shown}.{member}"] = f"{shown}.{member}"
    return out


class SphinxRoles(griffe.Extension):
    """Rewrites each docstring's roles when griffe loads it."""

    def __init__(self) -> None:
        super().__init__()
        self.names = public_names()

    def target(self, path: str, obj: Any) -> str | None:
        """The shown path of ``path`` (absolute, or a member of ``obj``'s class or module), or None."""
        path = path.removesuffix("()")
        for candidate in (path, *(f"{scope}.{path}" for scope in _scopes(obj))):
            if candidate in self.names:
                return self.names[candidate]
            head, _, member = candidate.rpartition(".")
            shown = f"{self.names.get(head)}.{member}"
            if shown in self.names:
                return self.names[shown]
        return None

    def on_instance(self, *, node: Any, obj: Any, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is None:
            return

        def link(match: re.Match[str]) -> str:
            short, path = match.group(1), match.group(2)
            text = path.rpartition(".")[2] if short else path
            target = self.target(path, obj)
            return f"[`{text}`][{target}]" if target else f"`{text}`"

        obj.docstring.value = _ROLE.sub(link, obj.docstring.value)


def _scopes(obj: Any) -> list[str]:
    """Where a relative name in ``obj``'s docstring may live: its class (for a method), then its module."""
    scopes = []
    parent = obj if obj.is_class or obj.is_module else obj.parent
    while parent is not None:
        scopes.append(parent.path)
        parent = parent.parent
    return scopes
