"""Checkpoints of a StepStore and its Tables: one file, written atomically, no pickle.

The file is a zip of ``.npy`` arrays (numpy's ``.npz`` layout) plus a JSON manifest stored as a byte
array. It holds every row and cursor of the store, and of each table its items, priorities, item fields,
free-slot order, selector structures and RNG states, and rate-limiter counters: a restored table samples
exactly what the original would have sampled next.

- Atomic: written to a temporary file beside the target (``.<name>.tmp-<pid>``), flushed to disk, then
  renamed over it; a crash mid-save leaves the previous checkpoint as it was. A save removes the
  temporary files of earlier saves of the same path whose process no longer runs.
- Safe: nothing is unpickled (arrays of objects are refused); the manifest is JSON. Each member must be
  an uncompressed, unencrypted ``.npy`` inside the file, its header is checked against its size before
  its memory is allocated, and its bytes are CRC-checked by the zip reader.
- Versioned: the manifest names the format and its version; another version is refused.
- Checked: the store's and tables' configuration (capacity, lanes, fields, selectors, limiters, sizes)
  must match the objects loaded into; every array is read and checked before anything is changed, so a
  corrupt or mismatched checkpoint raises :class:`CheckpointError` and leaves the objects as they were.

Usage::

    save("replay.ckpt", store, [table])
    # ... later, in a new process, after building the same store and tables:
    load("replay.ckpt", store, [table])
"""

from __future__ import annotations

import copy
import json
import math
import os
import struct
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from rlflow.atomic_files import atomic_write
from rlflow.replay.storage import StepStore
from rlflow.replay.table import TableBase

__all__ = ["FORMAT", "VERSION", "CheckpointError", "load", "save"]

FORMAT = "rlflow.replay.checkpoint"
VERSION = 1
_MANIFEST = "__manifest__"
ENCRYPTED_FLAGS = 0x41  # zip flag bits 0 (encrypted) and 6 (strong encryption)
_CHUNK = 1 << 24  # bytes read at a time into an array


class CheckpointError(RuntimeError):
    """A checkpoint is unreadable, corrupt, of another version, or does not match the objects."""


def _split(state: dict[str, Any], prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Move array values of ``state`` into ``arrays`` under ``prefix``; return the rest."""
    rest = {}
    for k, v in state.items():
        if isinstance(v, np.ndarray):
            arrays[f"{prefix}{k}"] = v
        else:
            rest[k] = v
    return rest


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def save(path: str | os.PathLike[str], store: StepStore, tables: Sequence[TableBase] = ()) -> Path:
    """Write ``store`` and ``tables`` (which must all reference ``store``) to ``path`` atomically."""
    path = Path(path)
    for t in tables:
        if t.store is not store:
            raise ValueError(f"table {t.name!r} references another store")
    with store.lock:
        arrays: dict[str, np.ndarray] = {}
        manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION, "store": store.config(), "tables": []}
        _split(store.state_dict(), "store/", arrays)
        for i, t in enumerate(tables):
            st = t.state_dict()
            entry = {
                "config": st["config"],
                "next_seq": st["next_seq"],
                "rate_limiter": st["rate_limiter"],
                "sampler": _split(st["sampler"], f"table/{i}/sampler/", arrays),
                "remover": _split(st["remover"], f"table/{i}/remover/", arrays),
            }
            _split(st["arrays"], f"table/{i}/", arrays)
            manifest["tables"].append(entry)
        arrays[_MANIFEST] = np.frombuffer(json.dumps(manifest).encode(), np.uint8)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]  # (numpy's stubs)
    return path


def _read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                raise CheckpointError(f"{path}: not an rlflow checkpoint (not a zip of arrays)")
            file_size = os.fstat(f.fileno()).st_size
        arrays = _read_arrays(path, file_size)
        if _MANIFEST not in arrays:
            raise CheckpointError(f"{path}: not an rlflow checkpoint (no manifest)")
        manifest = json.loads(arrays.pop(_MANIFEST).tobytes().decode())
        if not isinstance(manifest, dict):
            raise CheckpointError(f"{path}: corrupt checkpoint: the manifest is not a JSON object")
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"{path}: expected format {FORMAT!r}, got {manifest.get('format')!r}")
        if manifest.get("version") != VERSION:
            raise CheckpointError(
                f"{path}: checkpoint version {manifest.get('version')!r}, this rlflow reads version {VERSION}"
            )
    except (CheckpointError, FileNotFoundError):
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, RuntimeError, struct.error,
            OverflowError) as e:
        # What the zip, npy and JSON readers raise on bytes that are not what save wrote (RuntimeError and its
        # NotImplementedError: a member marked encrypted, a zip version or method not supported;
        # RecursionError: JSON nested too deep).
        raise CheckpointError(f"{path}: corrupt or unreadable checkpoint ({type(e).__name__}: {e})") from e
    return manifest, arrays


def _read_arrays(path: Path, file_size: int) -> dict[str, np.ndarray]:
    """Every member of the zip at ``path`` as an array, each checked against what :func:`save` writes
    (stored uncompressed and unencrypted, a ``.npy`` of numbers within the file) and CRC-checked."""
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename.removesuffix(".npy")
            if (info.compress_type != zipfile.ZIP_STORED or info.flag_bits & ENCRYPTED_FLAGS
                    or info.compress_size != info.file_size or info.header_offset + info.file_size > file_size
                    or name == info.filename or name in arrays):
                raise CheckpointError(
                    f"{path}: corrupt checkpoint: member {info.filename!r} is not an array as rlflow writes them "
                    f"(compression {info.compress_type}, flags {info.flag_bits:#x}, {info.compress_size} bytes "
                    f"stored for {info.file_size} at offset {info.header_offset} of {file_size}); expected "
                    "uncompressed, unencrypted, distinct .npy members inside the file")
            arrays[name] = _read_array(zf, info)
    return arrays


def _read_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """The ``.npy`` member ``info``; its header is checked against the member's size before anything is
    allocated, and the zip reader checks the CRC as the last byte is read."""
    with cast(zipfile.ZipExtFile, zf.open(info)) as f:  # (typed IO[bytes], which has no readinto)
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"member {info.filename!r}: .npy version {version}, expected 1.0 or 2.0")
        if dtype.hasobject:
            raise ValueError(f"member {info.filename!r}: an array of objects ({dtype}), expected numbers")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > info.file_size:
            raise ValueError(f"member {info.filename!r}: an array of {dtype}{shape} does not fit its "
                             f"{info.file_size} bytes")
        raw = np.empty(nbytes, np.uint8)
        into = raw.data  # (a memoryview)
        done = 0
        while done < nbytes:
            got = f.readinto(into[done: done + _CHUNK])
            if not got:
                raise EOFError(f"member {info.filename!r}: {nbytes - done} bytes of array data missing")
            done += got
        if f.read(1):
            raise ValueError(f"member {info.filename!r}: bytes after the array data")
    return raw.view(dtype).reshape(shape, order="F" if fortran else "C")


def _expect(what: str, expected: Any, got: Any) -> None:
    if _json(expected) != _json(got):
        raise CheckpointError(f"checkpoint mismatch in {what}: the objects have {expected}, the file has {got}")


def _sub(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix) and "/" not in k[len(prefix):]}


def load(path: str | os.PathLike[str], store: StepStore, tables: Sequence[TableBase] = ()) -> None:
    """Restore ``store`` and ``tables`` from ``path`` (written by :func:`save` for the same set-up).

    Everything is read and checked before anything changes: on any error the objects stay as they were.
    """
    path = Path(path)
    manifest, arrays = _read(path)
    try:
        store_state, states = _prepare(manifest, arrays, store, tables)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        raise CheckpointError(f"{path}: inconsistent checkpoint ({type(e).__name__}: {e})") from e
    with store.lock:
        store.load_state_dict(store_state)
        for t, st in zip(tables, states, strict=True):
            t.load_state_dict(st)


def _prepare(manifest: dict[str, Any], arrays: dict[str, np.ndarray], store: StepStore,
             tables: Sequence[TableBase]) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """The states to apply, after checking every one of them against the objects."""
    _expect("store", store.config(), manifest["store"])
    if len(tables) != len(manifest["tables"]):
        raise CheckpointError(f"checkpoint mismatch: {len(tables)} table(s) given, the file has "
                              f"{len(manifest['tables'])}")
    store_state = {k[len("store/"):]: v for k, v in arrays.items() if k.startswith("store/")}
    for k, now in store.state_dict().items():
        got = store_state.get(k)
        if got is None or got.shape != now.shape or got.dtype != now.dtype:
            raise CheckpointError(f"checkpoint store array {k!r}: expected {now.dtype}{now.shape}, "
                                  f"got {None if got is None else f'{got.dtype}{got.shape}'}")
    states = []
    for i, (t, entry) in enumerate(zip(tables, manifest["tables"], strict=True)):
        _expect(f"table {i} configuration", t.config(), entry["config"])
        _expect(f"table {i} rate limiter", _config_of(t.rate_limiter.state_dict()),
                _config_of(entry["rate_limiter"]))
        copy.copy(t.rate_limiter).load_state_dict(entry["rate_limiter"])  # raises on impossible counters
        table_arrays = _sub(arrays, f"table/{i}/")
        table_arrays.update({f"field/{k}": v for k, v in _sub(arrays, f"table/{i}/field/").items()})
        _check_table_arrays(t, table_arrays, store_state)
        current = t.role_states()
        for role in ("sampler", "remover"):
            _check_role_arrays(t, role, current[role], entry[role], _sub(arrays, f"table/{i}/{role}/"),
                               table_arrays["slot"])
        states.append({
            "config": entry["config"], "next_seq": int(entry["next_seq"]), "arrays": table_arrays,
            "rate_limiter": entry["rate_limiter"],
            "sampler": {**entry["sampler"], **_sub(arrays, f"table/{i}/sampler/")},
            "remover": {**entry["remover"], **_sub(arrays, f"table/{i}/remover/")},
        })
    return store_state, states


def _config_of(limiter_state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in limiter_state.items() if k not in ("inserts", "samples", "deletes")}


def _check_table_arrays(t: TableBase, a: dict[str, np.ndarray], store_state: dict[str, np.ndarray]) -> None:
    names = ["slot", "meta", "priority", "free"]
    missing = [n for n in names if n not in a] + [f"field/{n}" for n in t.item_fields if f"field/{n}" not in a]
    if missing:
        raise CheckpointError(f"checkpoint table {t.name!r}: arrays missing: {missing}")
    n = a["slot"].size
    if (a["meta"].shape != (n, 6) or a["priority"].shape != (n,) or n + a["free"].size != t.max_size
            or any(a[k].dtype.kind not in "iu" for k in ("slot", "meta", "free"))):
        raise CheckpointError(f"checkpoint table {t.name!r}: inconsistent item arrays")
    slots, meta = a["slot"], a["meta"]
    every = np.concatenate([slots, a["free"]])
    if not np.array_equal(np.sort(every), np.arange(t.max_size)):
        raise CheckpointError(f"checkpoint table {t.name!r}: live and free slots do not partition 0..{t.max_size - 1}")
    lanes, starts, lengths, valid = meta[:, 1], meta[:, 2], meta[:, 3], meta[:, 4]
    store = t.store
    count = store_state["count"]
    ok = (meta[:, 0] >= 0) & (meta[:, 0] % t.max_size == slots) & (lanes >= 0) & (lanes < store.num_lanes)
    ok &= (lengths >= 1) & (lengths <= store.capacity) & (valid >= 0) & (valid <= lengths) & (meta[:, 5] >= 0)
    if n and ok.all():
        c = count[lanes]
        ok &= (starts >= np.maximum(c - store.capacity, 0)) & (starts + lengths <= c)
    if t.config().get("items") == "rows":  # a RowTable's item sits in the slot of its start row
        ok &= slots == starts % store.capacity * store.num_lanes + lanes
    if not ok.all() or not np.isfinite(a["priority"]).all() or (a["priority"] < 0).any():
        raise CheckpointError(f"checkpoint table {t.name!r}: items with impossible keys, windows or priorities")
    for name, f in t.item_fields.items():
        arr = a[f"field/{name}"]
        if arr.shape != (n, *f.shape) or arr.dtype != f.dtype:
            raise CheckpointError(f"checkpoint table {t.name!r} field {name!r}: expected {f.dtype}{(n, *f.shape)}, "
                                  f"got {arr.dtype}{arr.shape}")


def _check_role_arrays(t: TableBase, role: str, state: dict[str, Any], meta: dict[str, Any],
                       a: dict[str, np.ndarray], live: np.ndarray) -> None:
    """Check the file's ``role`` entry (``meta``, arrays ``a``) against the table's current ``state`` of it."""
    current = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
    size = meta.get("size")
    if set(a) != set(current) or not isinstance(size, int) or size != live.size:
        raise CheckpointError(f"checkpoint table {t.name!r} {role}: expected arrays {sorted(current)} and size "
                              f"{live.size}, got {sorted(a)} and {size!r}")
    for k, v in current.items():
        expected = (size,) if k in ("items", "order", "seqs") else v.shape
        if a[k].shape != expected or a[k].dtype != v.dtype:
            raise CheckpointError(f"checkpoint table {t.name!r} {role} array {k!r}: expected {v.dtype}{expected}, "
                                  f"got {a[k].dtype}{a[k].shape}")
    for k in ("items", "order"):
        if k in a and not np.array_equal(np.sort(a[k]), np.sort(live)):
            raise CheckpointError(f"checkpoint table {t.name!r} {role}: {k} do not match the live items")
    if "rng" in state:
        generator = getattr(np.random, state["rng"]["bit_generator"])()
        generator.state = meta["rng"]  # raises on a malformed state
