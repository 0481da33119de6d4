"""Checkpoints of a run: replay, adder, learner, policy, counters and RNGs, so a run can be resumed.

A checkpoint is a directory ``<checkpoint_dir>/step-<env steps>`` holding

- ``replay.ckpt``: the store and the table (:mod:`rlflow.replay.checkpoint`: every row, item, priority,
  selector and RNG state, and rate-limiter counter);
- ``run.pt``: the adder's lanes, the learner's and policy's ``state_dict()``, the loop's counters, its
  finished episodes and evaluations, the per-lane episode statistics, and torch's global RNG state,
  saved with ``torch.save`` and loaded with ``weights_only=True`` (tensors, arrays and plain values only).

The directory is written under a temporary name and renamed into place, then ``latest`` (a one-line
file naming it) is replaced atomically: a crash while saving leaves the previous checkpoint as the
latest. Older checkpoint directories are removed after the new one is in place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlflow.replay import checkpoint as replay_checkpoint

__all__ = ["FORMAT", "VERSION", "latest", "load_run", "save_run"]

FORMAT = "rlflow.run"
VERSION = 1


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


def load_run(path: str | Path, store: Any, table: Any) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``store`` and ``table``; returns the run state (checked)."""
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
    replay_checkpoint.load(path / "replay.ckpt", store, [table])
    torch.set_rng_state(state["torch_rng"])
    return state


def to_lists(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict's numpy arrays as plain lists, which ``weights_only`` loading accepts."""
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in state.items()}
