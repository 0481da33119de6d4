"""Save and load the state of a trained learner, policy or any object with ``state_dict`` and ``load_state_dict``.

    rlflow.save("agent.pt", learner=learner, policy=policy)    # each part's state_dict(), one file
    rlflow.load("agent.pt", policy=policy)                     # any of the saved parts, by name

The file holds each part's ``state_dict()`` under its name: torch tensors (and modules' state dicts),
numpy arrays and scalars, and plain values (numbers, strings, bools, None) in dicts, lists and tuples. No
code is pickled: the file is read with ``torch.load(weights_only=True)`` after its zip checksums are
checked, so loading a file runs nothing from it, and a class can change as long as its state keeps its
shape. It is written atomically (a temporary file beside it, flushed and renamed): a crash while saving
leaves the previous file whole.

Loading checks the file and that it holds every part asked for before any part changes; a part whose
``load_state_dict`` raises gets its state from before back, and so does every part loaded before it,
then the error names the part.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rlflow.loop.checkpoint import CheckpointError, load_state, save_state

__all__ = ["HasState", "load", "save"]

FORMAT = "rlflow.parts"
VERSION = 1


class HasState(Protocol):
    """What :func:`save` and :func:`load` take: an object whose state is a dict (a :class:`rlflow.Learner`,
    a :class:`rlflow.Policy`, a ``torch.nn.Module``, an optimizer, ...)."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> Any: ...


def save(path: str | Path, **parts: HasState) -> Path:
    """Write the ``state_dict()`` of each named part to ``path`` (e.g. ``learner=..., policy=...``).

    Returns the path; its folder is made if missing. A part without ``state_dict``, or a state holding a
    value that cannot be stored (an object other than tensors, numpy values of numbers and plain values),
    raises naming it, and nothing is written.
    """
    if not parts:
        raise ValueError("rlflow.save: name at least one part to save, e.g. rlflow.save(path, learner=learner)")
    states = {}
    for name, part in parts.items():
        if not callable(getattr(part, "state_dict", None)):
            raise TypeError(f"rlflow.save: part {name!r} is a {type(part).__name__}, which has no state_dict(); "
                            "expected an object with state_dict() and load_state_dict() (a Learner, a Policy, "
                            "a torch module)")
        state = part.state_dict()
        if not isinstance(state, Mapping):
            raise TypeError(f"rlflow.save: part {name!r}: state_dict() returned a {type(state).__name__}, "
                            "expected a dict")
        _check_storable(state, f"part {name!r}")
        states[name] = state
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_state(path, {"format": FORMAT, "version": VERSION, "parts": states})
    return path


_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _check_storable(value: Any, where: str) -> None:
    """Raise naming the first value in ``value`` that :func:`save` cannot store without pickling code."""
    import numpy as np
    import torch

    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, _PLAIN):
                raise TypeError(f"rlflow.save: {where} has a key of type {type(key).__name__}; expected plain keys "
                                "(strings, numbers)")
            _check_storable(item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_storable(item, f"{where}[{i}]")
    elif isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject or value.dtype.names is not None:
            raise TypeError(f"rlflow.save: {where} is a numpy value of dtype {value.dtype}; expected numbers")
    elif not isinstance(value, (*_PLAIN, torch.Tensor, torch.dtype, torch.Size)):
        raise TypeError(f"rlflow.save: {where} is a {type(value).__name__}; a state holds tensors, numpy values "
                        "and plain values (numbers, strings, None) in dicts, lists and tuples (save what "
                        "rebuilds it instead, e.g. a generator's bit_generator.state)")


def load(path: str | Path, **parts: HasState) -> None:
    """Load the state :func:`save` wrote under each given name into the part passed with that name.

    Any subset of the saved parts may be given. A file that is not one :func:`save` wrote, or that lacks a
    part asked for, raises :class:`rlflow.replay.CheckpointError` and changes nothing; a part whose
    ``load_state_dict`` raises is put back as it was, with the parts loaded before it.
    """
    if not parts:
        raise ValueError("rlflow.load: name the parts to load, e.g. rlflow.load(path, policy=policy)")
    for name, part in parts.items():
        if not callable(getattr(part, "load_state_dict", None)) or not callable(getattr(part, "state_dict", None)):
            raise TypeError(f"rlflow.load: part {name!r} is a {type(part).__name__}, which has no "
                            "load_state_dict() and state_dict()")
    saved = load_state(path)
    if saved.get("format") != FORMAT or not isinstance(saved.get("parts"), dict):
        raise CheckpointError(f"{path}: not a file of rlflow.save (format {saved.get('format')!r}, expected "
                              f"{FORMAT!r})")
    if saved.get("version") != VERSION:
        raise CheckpointError(f"{path}: rlflow.save format version {saved.get('version')!r}; this rlflow reads "
                              f"version {VERSION}")
    missing = [name for name in parts if name not in saved["parts"]]
    if missing:
        raise CheckpointError(f"{path}: no part named {missing}; the file holds {sorted(saved['parts'])}")
    before: dict[str, Any] = {}
    for name, part in parts.items():
        before[name] = copy.deepcopy(part.state_dict())
        try:
            part.load_state_dict(saved["parts"][name])
        except Exception as exc:
            for done, state in before.items():
                parts[done].load_state_dict(state)
            raise ValueError(f"rlflow.load: {path}: part {name!r} does not take the saved state "
                             f"({type(exc).__name__}: {exc}); every part is as it was") from exc
