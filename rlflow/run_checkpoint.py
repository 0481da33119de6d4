"""Checkpoints of a run: replay, adder, learner, policy, counters and RNGs, so a run can be resumed.

A checkpoint is a directory ``<checkpoint_dir>/step-<env steps>`` holding

- ``replay.ckpt``: the store and the table (:mod:`rlflow.replay.checkpoint`: every row, item, priority,
  selector and RNG state, and rate-limiter counter);
- ``run.pt``: the adder's state (its lanes' positions, its staged steps and the settings of its items,
  checked on load before anything changes), the learner's and policy's ``state_dict()``, the variable
  client's last pull, the loop's counters, its finished episodes and evaluations, the per-lane episode
  statistics in progress, the policy's recurrent state, the env's state (:mod:`rlflow.env_state`; None
  when it cannot be saved) with the timestep the loop acts on next, and torch's global RNG state,
  saved with ``torch.save`` and loaded with ``weights_only=True``. State dicts may hold tensors, numpy
  arrays and scalars of numbers, and plain values (numbers, strings, None) in dicts, lists and tuples.
  Numpy values are stored as their bytes (a uint8 tensor), dtype and shape, and come back as numpy
  values of the same dtype, shape and type. A numpy array of objects is refused when saving, naming
  where it is, and the previous checkpoint stays the latest; other objects fail the loading.

The directory is written under a temporary name and renamed into place, then ``latest`` (a one-line
file naming it) is replaced atomically: a crash while saving leaves the previous checkpoint as the
latest. Older checkpoint directories are removed after the new one is in place.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlflow.replay import checkpoint as replay_checkpoint

__all__ = ["FORMAT", "VERSION", "latest", "load_run", "load_state", "save_run", "save_state"]

FORMAT = "rlflow.run"
VERSION = 2


def latest(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``checkpoint_dir`` (None if there is none)."""
    pointer = Path(checkpoint_dir) / "latest"
    if not pointer.exists():
        return None
    path = Path(checkpoint_dir) / pointer.read_text().strip()
    return path if (path / "run.pt").exists() and (path / "replay.ckpt").exists() else None


def save_run(checkpoint_dir: str | Path, env_steps: int, store: Any, table: Any, state: dict[str, Any]) -> Path:
    """Write a checkpoint of ``store``, ``table`` and the run ``state``; returns its directory."""
    import torch

    state = _walk(state, _encode_numpy, "state")  # before anything is written: a refusal keeps the last checkpoint
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{env_steps:012d}"
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    replay_checkpoint.save(tmp / "replay.ckpt", store, [table])
    payload = {"format": FORMAT, "version": VERSION, **state, "torch_rng": torch.get_rng_state()}
    with (tmp / "run.pt").open("wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(name + "\n")
    os.replace(pointer, root / "latest")
    for old in root.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_run(path: str | Path, store: Any, table: Any, adder: Any = None,
             before_replay: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``store`` and ``table``; returns the run state (checked).

    With ``adder``, the checkpoint's adder state is checked first (``adder.check_state``: every setting
    that shapes items must match), so a mismatch raises before the store or the table change. Then
    ``before_replay(state)`` is called with the run state before the store and table change (e.g. to
    restore the env, which raises when it was built otherwise)."""
    import torch

    path = Path(path)
    try:
        state = torch.load(path / "run.pt", weights_only=True)
    except Exception as exc:  # unreadable, truncated, or holding objects other than plain data
        raise replay_checkpoint.CheckpointError(f"{path / 'run.pt'}: cannot be read as a run checkpoint: "
                                                f"{type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") != VERSION:
        got = (state.get("format"), state.get("version")) if isinstance(state, dict) else type(state).__name__
        raise replay_checkpoint.CheckpointError(f"{path / 'run.pt'}: expected format {FORMAT!r} version {VERSION}, "
                                                f"got {got}")
    state = _walk(state, _decode_numpy, "state")
    if adder is not None:
        adder.check_state(state.get("adder", {}))
    if before_replay is not None:
        before_replay(state)
    replay_checkpoint.load(path / "replay.ckpt", store, [table])
    torch.set_rng_state(state["torch_rng"])
    return state


def save_state(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` (e.g. ``{"args": ..., "learner": learner.state_dict()}``) to ``path`` for
    :func:`load_state`: tensors, numbers, strings and containers as they are, numpy values encoded as in
    a run checkpoint. Written to a temporary file and renamed, so ``path`` is never half-written; a value
    that cannot be stored raises before anything is written."""
    import torch

    state = _walk(state, _encode_numpy, "state")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        torch.save(state, f)
    os.replace(tmp, path)


def load_state(path: str | Path) -> dict[str, Any]:
    """The state :func:`save_state` wrote to ``path``, numpy values restored; read with
    ``torch.load(weights_only=True)``, so the file runs no code."""
    import torch

    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:
        raise replay_checkpoint.CheckpointError(f"{path}: cannot be read as a saved state: "
                                                f"{type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict):
        raise replay_checkpoint.CheckpointError(f"{path}: expected a dict of state, got {type(state).__name__}")
    return _walk(state, _decode_numpy, "state")


_NUMPY = "__rlflow_numpy__"  # marks an encoded numpy value: {_NUMPY: its bytes (a uint8 tensor), "dtype", ...}


def _walk(value: Any, leaf: Any, where: str) -> Any:
    """``value`` with ``leaf(x, where)`` applied to every value inside its dicts, lists and tuples, ``leaf``
    first (it returns ``x`` itself to look inside, or a replacement). A container is rebuilt only where
    something inside changed, so a module's ``OrderedDict`` state keeps its type and metadata."""
    out = leaf(value, where)
    if out is not value:
        return out
    if isinstance(value, dict):
        new = {k: _walk(v, leaf, f"{where}[{k!r}]") for k, v in value.items()}
        return value if all(new[k] is value[k] for k in value) else new
    if isinstance(value, list | tuple):
        items = [_walk(v, leaf, f"{where}[{i}]") for i, v in enumerate(value)]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


def _encode_numpy(value: Any, where: str) -> Any:
    """A numpy array or scalar as plain values a ``weights_only`` load accepts; anything else as it is."""
    if not isinstance(value, np.ndarray | np.generic):
        return value
    arr = np.asarray(value)
    if arr.dtype.hasobject or arr.dtype.names is not None:
        raise TypeError(f"run checkpoint: {where} is a numpy value of dtype {arr.dtype}: expected numbers "
                        "(objects and structured dtypes cannot be stored)")
    import torch

    raw = torch.from_numpy(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).copy())
    return {_NUMPY: raw, "dtype": arr.dtype.str, "shape": list(arr.shape), "scalar": isinstance(value, np.generic)}


def _decode_numpy(value: Any, where: str) -> Any:
    """The numpy value :func:`_encode_numpy` made of it; anything else as it is."""
    if not (isinstance(value, dict) and _NUMPY in value):
        return value
    arr = value[_NUMPY].numpy().view(np.dtype(value["dtype"])).reshape(value["shape"]).copy()
    return arr[()] if value["scalar"] else arr
