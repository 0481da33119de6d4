"""Checkpoints of a run: replay, adder, learner, policy, counters and RNGs, so a run can be resumed.

A checkpoint is a directory ``<checkpoint_dir>/step-<env steps>`` holding

- ``replay.ckpt``: the store and the table (:mod:`rlflow.replay.checkpoint`: every row, item, priority,
  selector and RNG state, and rate-limiter counter);
- ``run.pt``: the adder's state (its lanes' positions, its staged steps and the settings of its items,
  checked on load before anything changes), the learner's and policy's ``state_dict()``, the variable
  client's last pull, the loop's counters, its finished episodes and evaluations, the per-lane episode
  statistics in progress, the policy's recurrent state, the env's state (:mod:`rlflow.envs.state`; None
  when it cannot be saved) with the timestep the loop acts on next, and torch's global RNG state,
  saved with ``torch.save`` and loaded with ``weights_only=True``. State dicts may hold tensors, numpy
  arrays and scalars of numbers, and plain values (numbers, strings, None) in dicts, lists and tuples.
  Numpy values are stored as their bytes (a uint8 tensor), dtype and shape, and come back as numpy
  values of the same dtype, shape and type. A numpy array of objects is refused when saving, naming
  where it is, and the previous checkpoint stays the latest; other objects fail the loading.

The directory is written under a temporary name (``.step-<env steps>.tmp``), flushed to disk and renamed
into place, then ``latest`` (a one-line file naming it) is replaced atomically: a crash while saving
leaves the previous checkpoint as the latest. Older checkpoint directories (``step-<digits>``) are removed
after the new one is in place, and so are the temporary directories of earlier saves that were killed
before their rename; nothing else under ``checkpoint_dir`` is touched.

Loading checks the zip CRCs of ``run.pt`` (``torch.load`` does not) and every value inside it before
anything changes: a corrupt, truncated or foreign file raises :class:`CheckpointError`, and the store,
the table and torch's RNG stay as they were. :func:`check_run_state` checks the keys ``rlflow.run`` reads.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rlflow.atomic_files import atomic_write, fsync_dir
from rlflow.replay import checkpoint as replay_checkpoint

if TYPE_CHECKING:
    from rlflow.adders.base import Adder
    from rlflow.replay.storage import StepStore
    from rlflow.replay.table import TableBase

__all__ = ["FORMAT", "VERSION", "CheckpointError", "check_run_state", "latest", "load_run", "load_state", "save_run",
           "save_state"]

FORMAT = "rlflow.run"
VERSION = 3  # 3: evaluations are (env step, mean return, std)
CheckpointError = replay_checkpoint.CheckpointError
_STEP = re.compile(r"step-\d{12,}")  # a checkpoint directory
_DOS_DIRECTORY = 0x10  # zip external attribute bit that torch's reader takes for a directory (read as empty)
_STEP_TMP = re.compile(r"\.step-\d{12,}\.tmp")  # one being written (or left by a save that was killed)


def latest(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``checkpoint_dir`` (None if none was ever written there).

    A ``latest`` pointer that names no complete checkpoint raises :class:`CheckpointError`: starting
    afresh would remove the checkpoints that are there at the first save."""
    pointer = Path(checkpoint_dir) / "latest"
    if not pointer.exists():
        return None
    name = pointer.read_bytes().decode("ascii", errors="replace").strip()
    path = Path(checkpoint_dir) / name
    if not _STEP.fullmatch(name) or not ((path / "run.pt").is_file() and (path / "replay.ckpt").is_file()):
        raise CheckpointError(f"{pointer}: expected the name of a complete checkpoint directory step-<env steps> "
                              f"beside it, got {name[:80]!r}; point it at one of "
                              f"{sorted(p.name for p in Path(checkpoint_dir).iterdir() if _STEP.fullmatch(p.name))} "
                              "or remove the directory to start afresh")
    return path


def save_run(checkpoint_dir: str | Path, env_steps: int, store: StepStore, table: TableBase | Sequence[TableBase],
             state: dict[str, Any]) -> Path:
    """Write a checkpoint of ``store``, ``table`` (a table on it, or a list of them) and the run ``state``;
    returns its directory."""
    import torch

    state = _walk(state, _encode_numpy, "state")  # before anything is written: a refusal keeps the last checkpoint
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{env_steps:012d}"
    for left in root.iterdir():  # earlier saves killed before their rename
        if _STEP_TMP.fullmatch(left.name) and left.is_dir():
            shutil.rmtree(left)
    tmp = root / f".{name}.tmp"
    tmp.mkdir()
    try:
        replay_checkpoint.save(tmp / "replay.ckpt", store, _tables(table))
        payload = {"format": FORMAT, "version": VERSION, **state, "torch_rng": torch.get_rng_state()}
        with (tmp / "run.pt").open("wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        final = root / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pointer = root / ".latest.tmp"
    with pointer.open("w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(root)  # the new directory's rename first: latest never names a directory a crash could lose
    os.replace(pointer, root / "latest")
    fsync_dir(root)
    for old in root.iterdir():
        if _STEP.fullmatch(old.name) and old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _load_torch(path: Path, what: str) -> Any:
    """``torch.load(path, weights_only=True)`` after checking the file's zip CRCs, which torch skips; any
    failure raises :class:`CheckpointError`. Where torch has no CUDA device, tensors saved on one load on the
    CPU (``map_location="cpu"``); elsewhere each loads on the device it was saved from."""
    import torch

    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():  # torch writes files, stored, unencrypted
                encrypted = info.flag_bits & replay_checkpoint.ENCRYPTED_FLAGS
                if info.is_dir() or info.external_attr & _DOS_DIRECTORY or encrypted:
                    raise CheckpointError(f"{path}: corrupt {what}: member {info.filename!r} is marked as a "
                                          f"directory or encrypted (attributes {info.external_attr:#x}, flags "
                                          f"{info.flag_bits:#x}); torch writes plain files")
            bad = zf.testzip()
        if bad is not None:
            raise CheckpointError(f"{path}: corrupt {what}: member {bad!r} fails its CRC check")
        return torch.load(path, weights_only=True, map_location=None if torch.cuda.is_available() else "cpu")
    except CheckpointError:
        raise
    except Exception as exc:  # unreadable, truncated, or holding objects other than plain data
        raise CheckpointError(f"{path}: cannot be read as a {what}: {type(exc).__name__}: {exc}") from None


def load_run(path: str | Path, store: StepStore, table: TableBase | Sequence[TableBase], adder: Adder | None = None,
             before_replay: Callable[[dict[str, Any]], None] | None = None,
             check: Callable[[dict[str, Any], str], None] | None = None) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``store`` and ``table`` (a table, or a list of them, as saved);
    returns the run state (checked).

    ``run.pt`` is read and checked in full first, then ``check(state, where)`` is called (it raises
    :class:`CheckpointError` for a state its caller cannot use, e.g. :func:`check_run_state`). With
    ``adder``, the checkpoint's adder state is checked next (a dict under ``adder``; ``adder.check_state``:
    every setting that shapes items must match). Then
    ``before_replay(state)`` is called with the run state before the store and table change (e.g. to
    restore the env, which raises when it was built otherwise), then the replay checkpoint is loaded
    (it changes nothing unless it loads), and torch's RNG state is set last."""
    import torch

    path = Path(path)
    state = _load_torch(path / "run.pt", "run checkpoint")
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") != VERSION:
        got = (state.get("format"), state.get("version")) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path / 'run.pt'}: expected format {FORMAT!r} version {VERSION}, got {got}")
    state = _walk(state, _decode_numpy, f"{path / 'run.pt'}: state")
    rng = state.get("torch_rng")
    try:
        torch.Generator().set_state(rng)  # the checks set_rng_state makes, on a generator of its own
    except (TypeError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{path / 'run.pt'}: torch_rng is not a torch RNG state ({type(exc).__name__}: "
                              f"{exc})") from None
    if check is not None:
        check(state, str(path / "run.pt"))
    if adder is not None:
        if not isinstance(state.get("adder"), dict):
            raise CheckpointError(f"{path / 'run.pt'}: key 'adder': expected the adder's state (a dict), got "
                                  f"{_described(state.get('adder', _MISSING))}")
        adder.check_state(state["adder"])
    if before_replay is not None:
        before_replay(state)
    replay_checkpoint.load(path / "replay.ckpt", store, _tables(table))
    torch.set_rng_state(rng)
    return state


_MISSING = object()


def _tables(table: TableBase | Sequence[TableBase]) -> list[TableBase]:
    return list(table) if isinstance(table, list | tuple) else [cast("TableBase", table)]
_COUNTERS = ("next_eval", "next_log", "next_checkpoint")


def _described(value: Any) -> str:
    return "nothing (the key is missing)" if value is _MISSING else f"{type(value).__name__} {str(value)[:80]}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _is_rows(value: Any, width: int) -> bool:
    return isinstance(value, list) and all(
        isinstance(row, list | tuple) and len(row) == width and all(map(_is_number, row)) for row in value)


def _is_lane_counts(value: Any, lanes: int) -> bool:
    return isinstance(value, dict) and all(
        isinstance(value.get(k), np.ndarray) and value[k].shape == (lanes,) and value[k].dtype.kind in "iuf"
        for k in ("returns", "lengths"))


def _is_timestep(value: Any) -> bool:
    from rlflow.types import TimeStep

    fields = {f.name for f in dataclasses.fields(TimeStep)} - {"info"}
    return isinstance(value, dict) and set(value) == fields


def check_run_state(state: dict[str, Any], where: str, lanes: int) -> None:
    """Raise :class:`CheckpointError` naming the first key of ``rlflow.run``'s state (in ``run.pt``) that is
    missing or holds a value of another type or shape (``lanes``: the run's env lanes); changes nothing."""
    env = state.get("env", _MISSING)
    expected: dict[str, tuple[str, Callable[[Any], bool]]] = {
        "env_steps": ("an integer >= 0", lambda v: _is_int(v) and v >= 0),
        "learner_steps": ("an integer >= 0", lambda v: _is_int(v) and v >= 0),
        "episodes": ("a list of (env step, return, length)", lambda v: _is_rows(v, 3)),
        "evaluations": ("a list of (env step, mean return, std)", lambda v: _is_rows(v, 3)),
        "learner_metrics": ("a dict of numbers by name", lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and _is_number(x) for k, x in v.items())),
        "counters": (f"a dict of {list(_COUNTERS)}, each a number or None", lambda v: isinstance(v, dict)
                     and set(v) == set(_COUNTERS) and all(x is None or _is_number(x) for x in v.values())),
        "adder": ("the adder's state (a dict)", lambda v: isinstance(v, dict)),
        "learner": ("the learner's state_dict (a dict)", lambda v: isinstance(v, dict)),
        "policy": ("the policy's state_dict (a dict)", lambda v: isinstance(v, dict)),
        "env": ("the env's state (a dict) or None", lambda v: v is None or isinstance(v, dict)),
        "timestep": ("None (no env state)" if env is None else "the timestep's arrays by field (a dict)",
                     lambda v: v is None if env is None else _is_timestep(v)),
        "episode_stats": (f"a dict of 'returns' and 'lengths', {lanes} numbers each (one per lane)",
                          lambda v: _is_lane_counts(v, lanes)),
        "actor": ("the policy's recurrent state under 'state' (a dict)",
                  lambda v: isinstance(v, dict) and "state" in v),
        "variable_client": ("None or a dict of 'last_pull' (an integer or None)", lambda v: v is None or (
            isinstance(v, dict) and set(v) == {"last_pull"} and (v["last_pull"] is None or _is_int(v["last_pull"])))),
    }
    # The learner's turn of a run with bursts; checkpoints written before rlflow saved it lack it (False).
    optional = {"learning": ("a bool (whether the learner had the turn of a run with bursts)",
                             lambda v: isinstance(v, bool | np.bool_))}
    for key, (what, ok) in {**expected, **optional}.items():
        value = state.get(key, _MISSING)
        if (value is _MISSING and key not in optional) or (value is not _MISSING and not ok(value)):
            raise CheckpointError(f"{where}: key {key!r}: expected {what}, got {_described(value)}; this is not a "
                                  "checkpoint rlflow.run can resume from (resume from another, or start a new run)")


def save_state(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` (e.g. ``{"args": ..., "learner": learner.state_dict()}``) to ``path`` for
    :func:`load_state`: tensors, numbers, strings and containers as they are, numpy values encoded as in
    a run checkpoint. Written atomically (:func:`rlflow.atomic_files.atomic_write`: a temporary file beside
    ``path``, flushed to disk and renamed, so ``path`` is never half-written, and the temporary files of
    killed saves removed); a value that cannot be stored raises before anything is written."""
    import torch

    state = _walk(state, _encode_numpy, "state")
    atomic_write(Path(path), lambda f: torch.save(state, f))


def load_state(path: str | Path) -> dict[str, Any]:
    """The state :func:`save_state` wrote to ``path``, numpy values restored; read with
    ``torch.load(weights_only=True)``, so the file runs no code, after checking its zip CRCs. A file that is
    not such a state raises :class:`CheckpointError`."""
    state = _load_torch(Path(path), "saved state")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of state, got {type(state).__name__}")
    return _walk(state, _decode_numpy, f"{path}: state")


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
    """The numpy value :func:`_encode_numpy` made of it; anything else as it is. An encoding that is not
    one :func:`_encode_numpy` writes raises :class:`CheckpointError`."""
    if not (isinstance(value, dict) and _NUMPY in value):
        return value
    import torch

    raw, shape, scalar = value[_NUMPY], value.get("shape"), value.get("scalar")
    try:
        dtype = np.dtype(value.get("dtype")) if isinstance(value.get("dtype"), str) else None
    except (TypeError, ValueError):
        dtype = None
    if (not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.dim() != 1 or dtype is None
            or dtype.hasobject or dtype.names is not None or dtype.itemsize == 0 or not isinstance(shape, list)
            or not all(type(n) is int and n >= 0 for n in shape) or not isinstance(scalar, bool)
            or (scalar and shape) or raw.numel() != dtype.itemsize * math.prod(shape)):
        described = {k: type(v).__name__ if k == _NUMPY else v for k, v in value.items()}
        raise CheckpointError(f"{where} is not an encoded numpy value: expected the bytes of a numeric array "
                              f"(a uint8 tensor), its dtype, shape and scalar flag, got {str(described)[:200]}")
    arr = raw.numpy().view(dtype).reshape(shape).copy()
    return arr[()] if scalar else arr
