"""Checkpoints: exact round trips, atomic saves, corrupt and mismatched files, no pickle.

A *run* is a StepStore with two tables driven by a seeded script of operations (writes that wrap the
lanes around, inserts, samples, priority updates, deletes). Row ids encode ``(lane, row)`` so every
sampled window can be checked against its item's ``(lane, start)``.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rlflow.replay import (
    CheckpointError,
    Fifo,
    MinSize,
    Prioritized,
    SampleToInsertRatio,
    StepStore,
    Table,
    Uniform,
    load,
    save,
)
from rlflow.specs import Field

SPEC = {"id": Field((), np.int64), "obs": (Field((2,), np.float32), Field((), np.uint8))}
ITEM = {"ret": Field((), np.float32), "disc": Field((2,), np.float64)}
BIG = 10**6
CAPACITY, LANES = 8, 3


# ---------------------------------------------------------------------------------------------- helpers
def row_data(lanes, rows, spec=SPEC):
    ids = np.asarray(lanes, np.int64) * BIG + np.asarray(rows, np.int64)
    obs = spec["obs"][0]
    signs = (-1) ** np.arange(obs.shape[0])
    return {"id": ids, "obs": ((ids[:, None] * signs).astype(obs.dtype), (ids % 251).astype(np.uint8))}


def write(store, lanes, first=None):
    lanes = np.asarray(lanes, np.int64)
    starts = store.count[lanes] == 0  # a lane's first row starts an episode
    first = starts if first is None else np.asarray(first) | starts
    return store.append(row_data(lanes, store.count[lanes], store.spec), lanes=lanes, first=first)


def check_sample_data(sample):
    """Every valid row of every window is the row the item names (never stale, never another lane)."""
    ids = sample.data["id"]
    expect = sample.lanes[:, None] * BIG + sample.starts[:, None] + np.arange(ids.shape[1])[None, :]
    assert np.all(np.where(sample.mask, ids == expect, ids == 0))
    assert sample.mask[:, 0].all()


def make_store(backend="memory", directory=None, *, capacity=CAPACITY, lanes=LANES, spec=SPEC):
    if backend == "disk":
        return StepStore(spec, capacity, lanes, backend="disk", directory=directory)
    return StepStore(spec, capacity, lanes)


def make_tables(store, *, prio_sampler=None, prio_max_size=12, item_spec=ITEM, uni_limiter=None,
                uni_max_times=2):
    """Table 0: prioritized sampler, item fields, Fifo remover that evicts (max_size 12).
    Table 1: uniform sampler, max_times_sampled=2, SampleToInsertRatio limiter."""
    prio = Table(store, sampler=prio_sampler if prio_sampler is not None else Prioritized(0.7, 0.5, seed=11),
                 remover=Fifo(seed=1), max_size=prio_max_size, item_spec=item_spec, rate_limiter=MinSize(2),
                 name="prio")
    uni = Table(store, sampler=Uniform(seed=5), remover=Fifo(seed=2), max_times_sampled=uni_max_times,
                rate_limiter=uni_limiter if uni_limiter is not None else SampleToInsertRatio(1.5, 3, 10.0),
                name="uni")
    return [prio, uni]


def build(backend="memory", directory=None, **table_kwargs):
    store = make_store(backend, directory)
    return store, make_tables(store, **table_kwargs)


def sample_record(s):
    return {"keys": s.keys, "probabilities": s.probabilities, "weights": s.weights,
            "times_sampled": s.times_sampled, "lanes": s.lanes, "starts": s.starts, "lengths": s.lengths,
            "mask": s.mask, "data": s.data, "fields": s.fields}


def random_windows(store, table, rng, n):
    """``n`` stored windows; about a third reuse the start row of a live item (several items per row)."""
    live = table.items()
    lanes, starts, lengths = [], [], []
    for _ in range(n):
        if live["key"].size and rng.random() < 0.35:
            j = int(rng.integers(live["key"].size))
            lane, start = int(live["lane"][j]), int(live["start"][j])
        else:
            lane = int(rng.choice(np.flatnonzero(store.count > 0)))
            count = int(store.count[lane])
            start = int(rng.integers(max(0, count - store.capacity), count))
        count = int(store.count[lane])
        lanes.append(lane)
        starts.append(start)
        lengths.append(int(rng.integers(1, min(5, count - start) + 1)))
    return np.array(lanes), np.array(starts), np.array(lengths)


def random_fields(table, rng, n):
    return {name: rng.normal(size=(n, *f.shape)).astype(f.dtype) for name, f in table.item_fields.items()}


OPS = ["append", "extend", "insert_prio", "insert_uni", "sample_prio", "sample_uni", "update", "delete"]
OP_P = [0.16, 0.02, 0.2, 0.24, 0.12, 0.14, 0.07, 0.05]


def drive(store, tables, rng, steps):
    """Apply ``steps`` random operations; return the log of everything they returned."""
    prio, uni = tables
    log = []
    seen = {prio.name: [], uni.name: []}
    recent = {prio.name: np.zeros(0, np.int64), uni.name: np.zeros(0, np.int64)}
    for step in range(steps):
        op = OPS[int(rng.choice(len(OPS), p=OP_P))]
        if store.count.max() == 0 and op != "extend":
            op = "append"
        if op == "append":
            k = int(rng.integers(1, store.num_lanes + 1))
            lanes = rng.permutation(store.num_lanes)[:k]
            out = write(store, lanes, first=rng.random(k) < 0.15)
        elif op == "extend":
            lane = int(rng.integers(store.num_lanes))
            t = int(rng.integers(1, store.capacity + 1))
            rows = store.count[lane] + np.arange(t)
            first = rng.random(t) < 0.1
            first[0] |= rows[0] == 0  # a lane's first row starts an episode
            out = store.extend(lane, row_data(np.full(t, lane), rows, store.spec), first=first)
        elif op.startswith("insert"):
            table = prio if op == "insert_prio" else uni
            n = int(rng.integers(1, 4))
            while n and not table.can_insert(n):
                n -= 1
            if not n:
                log.append((step, op, "refused"))
                continue
            lanes, starts, lengths = random_windows(store, table, rng, n)
            prios = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0.1, 3.0, n))
            fields = random_fields(table, rng, n) if table.item_fields else None
            if rng.random() < 0.5:  # one batch
                out = table.insert(lanes, starts, lengths, priorities=prios, fields=fields, timeout=0)
            else:  # one call per item: the first item of a row keeps the row's index cell
                out = np.concatenate([
                    table.insert(lanes[i:i + 1], starts[i:i + 1], lengths[i:i + 1], priorities=prios[i:i + 1],
                                 fields=None if fields is None else {k: v[i:i + 1] for k, v in fields.items()},
                                 timeout=0)
                    for i in range(n)])
            seen[table.name].extend(out.tolist())
        elif op.startswith("sample"):
            table = prio if op == "sample_prio" else uni
            bs = int(rng.integers(1, 6))
            if not table.can_sample(bs) or getattr(table.sampler, "total", 1.0) <= 0:
                log.append((step, op, "refused"))
                continue
            s = table.sample(bs, timeout=0)
            check_sample_data(s)
            recent[table.name] = s.keys
            out = sample_record(s)
        elif op == "update":
            table = tables[int(rng.integers(2))]
            pool = seen[table.name]
            stale = rng.choice(pool, size=min(2, len(pool)), replace=False) if pool else np.zeros(0, np.int64)
            keys = np.concatenate([recent[table.name], np.asarray(stale, np.int64), [10**9 + step]])
            out = table.update_priorities(keys, rng.uniform(0.0, 2.0, keys.size))
        else:  # delete
            table = tables[int(rng.integers(2))]
            live = table.items()["key"]
            pick = rng.choice(live, size=min(2, live.size), replace=False) if live.size else live
            pool = seen[table.name]
            extra = [pool[int(rng.integers(len(pool)))]] if pool else []
            out = table.delete(np.concatenate([pick, np.asarray(extra, np.int64)]))
        log.append((step, op, out))
    return log


def full_state(store, tables):
    """A copy of everything a checkpoint restores: store arrays, items, selectors, limiters."""
    out = {"store": {k: np.array(v, copy=True) for k, v in store.state_dict().items()}}
    for t in tables:
        out[t.name] = {"size": t.size, "items": t.items(), "limiter": dict(t.rate_limiter.state_dict()),
                       "sampler": json_copy(t.sampler.state_dict()), "remover": json_copy(t.remover.state_dict())}
    return out


def json_copy(state):
    return {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else json.loads(json.dumps(v))
            for k, v in state.items()}


def assert_tree_equal(a, b, path="root"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_tree_equal(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{path}: {type(b)} is not an array"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=path, strict=True)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def first_run(backend="memory", directory=None, steps=200):
    """The state every checkpoint test saves: lanes wrapped around, items evicted, deleted, sampled."""
    store, tables = build(backend, directory)
    drive(store, tables, np.random.default_rng(0), steps)
    return store, tables


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of :func:`first_run` and the state it holds."""
    path = tmp_path_factory.mktemp("ckpt") / "replay.ckpt"
    store, tables = first_run()
    save(path, store, tables)
    return path, full_state(store, tables)


def target(**table_kwargs):
    """Objects to load into, holding a state of their own (so that any change to them shows)."""
    store = make_store()
    tables = make_tables(store, **table_kwargs)
    drive(store, tables, np.random.default_rng(7), 60)
    return store, tables


# ---------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize(("src", "dst", "seed"), [
    ("memory", "memory", 1), ("memory", "memory", 2), ("memory", "memory", 3), ("disk", "disk", 4),
    ("memory", "disk", 5),
])
def test_restore_then_continue_equals_uninterrupted_run(tmp_path, src, dst, seed):
    store, tables = first_run(src, tmp_path / "src")
    prio, uni = tables
    # The saved state is not trivial: every lane wrapped, items were evicted, retired, deleted, sampled.
    assert store.count.min() > CAPACITY
    assert prio.rate_limiter.deletes > 0 and uni.rate_limiter.deletes > 0
    assert prio.rate_limiter.samples > 0 and uni.rate_limiter.samples > 0
    assert prio.size > 0 and uni.size > 0 and uni.items()["times_sampled"].max() > 0
    assert len(set(prio.items()["priority"].tolist())) > 1

    path = save(tmp_path / "ckpt" / "replay.ckpt", store, tables)
    assert path == tmp_path / "ckpt" / "replay.ckpt"
    assert sorted(p.name for p in path.parent.iterdir()) == ["replay.ckpt"]  # no temp file left behind
    before = full_state(store, tables)

    store2, tables2 = build(dst, tmp_path / "dst")
    drive(store2, tables2, np.random.default_rng(99), 30)  # a different state, overwritten by load
    load(path, store2, tables2)
    assert_tree_equal(full_state(store2, tables2), before)
    assert_tree_equal(full_state(store, tables), before)  # saving changed nothing

    # Fed the same further operations, the restored run samples exactly what the original samples; the
    # restored run is interrupted again (saved, rebuilt from scratch, loaded) after every chunk of 1 to 19
    # operations, the original never.
    rng, rng2 = np.random.default_rng(seed), np.random.default_rng(seed)
    chunks = np.random.default_rng(seed + 100).integers(1, 20, 40)
    samples = 0
    for chunk, steps in enumerate(chunks.tolist()):
        log = drive(store, tables, rng, steps)
        log2 = drive(store2, tables2, rng2, steps)
        for entry, entry2 in zip(log, log2, strict=True):
            assert_tree_equal(entry, entry2, f"chunk {chunk} step {entry[0]} {entry[1]}")
        samples += sum(entry[1].startswith("sample") and isinstance(entry[2], dict) for entry in log)
        save(path, store2, tables2)
        store2, tables2 = build(dst, tmp_path / f"dst{chunk}")
        load(path, store2, tables2)
        assert_tree_equal(full_state(store2, tables2), full_state(store, tables), f"after chunk {chunk}")
    assert samples > 40


def test_restore_keeps_removal_order_of_items_sharing_a_start_row(tmp_path):
    """Items removed together by one overwrite free their slots in the same order in both runs.

    Lane 0, row 0 holds items ``a`` then ``b`` (inserted one by one, so ``a`` keeps the row's index
    cell); ``a`` is deleted. Lane 1, row 0 holds ``c``, inserted first. One append overwrites row 0 of
    both lanes, removing ``b`` and ``c``: the slots they free are reused by the next inserts, so the
    next keys (and the uniform sampler's draws) depend on the order of removal.
    """
    def setup():
        store = StepStore({"id": Field((), np.int64)}, capacity=4, lanes=2)
        table = Table(store, sampler=Uniform(seed=3), max_size=20)
        for i in range(4):
            store.append({"id": np.array([i, BIG + i])}, first=np.array([i == 0, i == 0]))
        return store, table

    def cont(store, table):
        store.append({"id": np.array([4, BIG + 4])})
        keys = table.insert([0, 0], [1, 2], [1, 1])
        return keys, [table.sample(8).keys for _ in range(3)]

    store, table = setup()
    for lane, start, length in [(1, 0, 1), (0, 0, 1), (0, 0, 2), (0, 1, 1), (1, 1, 1), (1, 2, 1)]:
        table.insert([lane], [start], [length])
    table.delete(table.items()["key"][1:2])  # a
    save(tmp_path / "c.ckpt", store, [table])
    store2, table2 = setup()
    load(tmp_path / "c.ckpt", store2, [table2])
    assert_tree_equal(full_state(store2, [table2]), full_state(store, [table]))
    assert_tree_equal(cont(store2, table2), cont(store, table))


def test_checkpoint_holds_no_pickle(saved):
    path, _ = saved
    with np.load(path, allow_pickle=False) as npz:
        names = npz.files
        assert "__manifest__" in names and len(names) > 10
        for name in names:
            arr = npz[name]  # raises if a member needs pickle
            assert arr.dtype != object and not arr.dtype.hasobject, name
        manifest = json.loads(npz["__manifest__"].tobytes().decode())
    assert isinstance(manifest, dict) and manifest["format"] and manifest["version"] == 1
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None
        assert sorted(n.removesuffix(".npy") for n in zf.namelist()) == sorted(names)


# ---------------------------------------------------------------------------------------------- crash
_CHILD = r"""
import importlib.util, os, sys, time
import numpy as np
spec = importlib.util.spec_from_file_location("ckpt_test", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
target, marker = sys.argv[2], sys.argv[3]
store, tables = mod.first_run()
mod.save(target, store, tables)
limit = os.path.getsize(target) // 2
mod.drive(store, tables, np.random.default_rng(1), 100)

class Stalling:
    # Passes writes through to the temp file until half a checkpoint is written, then stalls for good.
    def __init__(self, f):
        self._f, self._written = f, 0
    def write(self, b):
        n = self._f.write(b)
        self._written += n
        if self._written >= limit:
            self._f.flush()
            os.fsync(self._f.fileno())
            with open(marker, "w") as m:
                m.write(self._f.name)
            while True:
                time.sleep(60)
        return n
    def __getattr__(self, name):
        return getattr(self._f, name)

real_savez = np.savez
np.savez = lambda f, **arrays: real_savez(Stalling(f), **arrays)
mod.save(target, store, tables)
sys.exit(3)  # never reached: the parent kills this process mid-save
"""


def test_killed_mid_save_leaves_previous_checkpoint(tmp_path):
    path = tmp_path / "replay.ckpt"
    marker = tmp_path / "stalled"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, __file__, str(path), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(12000):  # bounded wait for the child to stall mid-save (not a timing assertion)
            if (marker.exists() and marker.read_text()) or proc.poll() is not None:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"child exited early: {proc.communicate()}"
        assert marker.exists(), "child never reached the middle of its second save"
        tmp = Path(marker.read_text())
        assert tmp.parent == tmp_path and tmp.name.startswith(".replay.ckpt.tmp-") and tmp.exists()
        assert tmp.stat().st_size > 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    store, tables = first_run()
    expected = full_state(store, tables)
    store2, tables2 = target()
    load(path, store2, tables2)
    assert_tree_equal(full_state(store2, tables2), expected)
    # The half-written temp file is not a checkpoint, and a later save still works beside it.
    store3, tables3 = target()
    untouched = full_state(store3, tables3)
    with pytest.raises(CheckpointError, match="corrupt"):
        load(tmp, store3, tables3)
    assert_tree_equal(full_state(store3, tables3), untouched)
    drive(store, tables, np.random.default_rng(2), 20)
    save(path, store, tables)
    load(path, store3, tables3)
    assert_tree_equal(full_state(store3, tables3), full_state(store, tables))
    assert not tmp.exists()  # the killed save's temporary file went with the next save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.ckpt", "stalled"]


def test_a_save_removes_temporary_files_left_by_killed_saves_of_the_same_path(tmp_path):
    """Only ``.<name>.tmp-<pid>`` files of the path saved, and only where the process is gone."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = int(gone.stdout)  # a process that has exited
    path = tmp_path / "replay.ckpt"
    leftovers = [f".replay.ckpt.tmp-{dead}", f".replay.ckpt.tmp-{os.getpid()}"]
    kept = [f".replay.ckpt.tmp-{os.getppid()}",  # a running process: may be saving right now
            f".other.ckpt.tmp-{dead}", f"replay.ckpt.tmp-{dead}", f".replay.ckpt.tmp-{dead}.keep",
            ".replay.ckpt.tmp-", ".replay.ckpt.tmp-12a", f".replay.ckptx.tmp-{dead}", "notes.txt"]
    for name in leftovers + kept:
        (tmp_path / name).write_bytes(b"half a checkpoint" * 100)
    (tmp_path / f".replay.ckpt.tmp-{dead}0").mkdir()  # a directory is never a save's temporary file
    store, tables = first_run()
    save(path, store, tables)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, f".replay.ckpt.tmp-{dead}0", "replay.ckpt"])
    for name in kept:
        assert (tmp_path / name).read_bytes() == b"half a checkpoint" * 100
    store2, tables2 = target()
    load(path, store2, tables2)
    assert_tree_equal(full_state(store2, tables2), full_state(store, tables))


# ---------------------------------------------------------------------------------------------- corrupt
def _members(path):
    """(name, offset of its npy payload in the file, payload size) of every zip member."""
    raw = path.read_bytes()
    out = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26: info.header_offset + 30])
            data = info.header_offset + 30 + name_len + extra_len
            member = zf.read(info.filename)
            major = member[6]
            header = 10 + struct.unpack("<H", member[8:10])[0] if major == 1 else \
                12 + struct.unpack("<I", member[8:12])[0]
            assert raw[data: data + len(member)] == member
            out.append((info.filename, data + header, len(member) - header))
    return out


def _rewrite(src, dst, *, manifest=None, drop=()):
    """A copy of checkpoint ``src`` written by hand with numpy.savez, its manifest replaced (str or bytes)."""
    with np.load(src, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k not in drop}
    if manifest is not None:
        raw = manifest.encode() if isinstance(manifest, str) else manifest
        arrays["__manifest__"] = np.frombuffer(raw, np.uint8)
    np.savez(dst, **arrays)
    return dst


def _manifest(path):
    with np.load(path, allow_pickle=False) as npz:
        return json.loads(npz["__manifest__"].tobytes().decode())


def _assert_load_refused(path, match, **table_kwargs):
    store, tables = target(**table_kwargs)
    before = full_state(store, tables)
    with pytest.raises(CheckpointError, match=match):
        load(path, store, tables)
    assert_tree_equal(full_state(store, tables), before)


@pytest.mark.parametrize("keep", [0.5, 0.99, 0.001])
def test_truncated_file(saved, tmp_path, keep):
    src, _ = saved
    raw = src.read_bytes()
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(raw[: max(1, int(len(raw) * keep))])
    _assert_load_refused(bad, "corrupt or unreadable")


def test_flipped_byte_in_any_member_is_caught(saved, tmp_path):
    src, _ = saved
    raw = src.read_bytes()
    members = [m for m in _members(src) if m[2] > 0]
    assert len(members) > 10
    for name, offset, size in members:
        bad = tmp_path / f"flip-{name.replace('/', '_')}"
        data = bytearray(raw)
        data[offset + size // 2] ^= 0x5A
        bad.write_bytes(bytes(data))
        _assert_load_refused(bad, f"(?s)corrupt.*CRC.*{name}")


@pytest.mark.parametrize("content", [
    pytest.param(b"", id="empty"),
    pytest.param(b"this is a text file, not a checkpoint\n" * 10, id="text"),
    pytest.param(bytes(range(256)) * 4, id="binary"),
    pytest.param("npy", id="npy-file"),
])
def test_not_a_zip(tmp_path, content):
    bad = tmp_path / "not-a-zip.ckpt"
    if content == "npy":
        with open(bad, "wb") as f:
            np.save(f, np.arange(10))  # a valid .npy array, but no zip and no manifest
    else:
        bad.write_bytes(content)
    _assert_load_refused(bad, "not an rlflow checkpoint|corrupt or unreadable")


@pytest.mark.parametrize(("edit", "match"), [
    pytest.param(lambda m: {**m, "version": 2}, "checkpoint version 2, this rlflow reads version 1", id="version"),
    pytest.param(lambda m: {**m, "version": "1"}, "checkpoint version '1', this rlflow reads version 1",
                 id="version-as-string"),
    pytest.param(lambda m: {**m, "format": "someone.else"}, "expected format .*got 'someone.else'", id="format"),
    pytest.param(lambda m: {k: v for k, v in m.items() if k != "format"}, "expected format .*got None",
                 id="no-format"),
])
def test_manifest_of_another_version_or_format(saved, tmp_path, edit, match):
    src, _ = saved
    bad = _rewrite(src, tmp_path / "other.npz", manifest=json.dumps(edit(_manifest(src))))
    _assert_load_refused(bad, match)


@pytest.mark.parametrize(("manifest", "match"), [
    pytest.param(None, "no manifest", id="missing"),
    pytest.param("{not json", "corrupt or unreadable", id="not-json"),
    pytest.param(b"\xff\xfe{}", "corrupt or unreadable", id="not-utf8"),
    pytest.param("[1, 2, 3]", "corrupt|format", id="json-list"),
])
def test_unreadable_manifest(saved, tmp_path, manifest, match):
    src, _ = saved
    dst = tmp_path / "bad-manifest.npz"
    if manifest is None:
        bad = _rewrite(src, dst, drop=("__manifest__",))
    else:
        bad = _rewrite(src, dst, manifest=manifest)
    _assert_load_refused(bad, match)


def _set_counter(m, table, key, value):
    m["tables"][table]["rate_limiter"][key] = value
    return m


@pytest.mark.parametrize("edit", [
    pytest.param(lambda m: _set_counter(m, 1, "deletes", m["tables"][1]["rate_limiter"]["inserts"] + 5),
                 id="limiter-deletes-exceed-inserts"),
    pytest.param(lambda m: _set_counter(m, 0, "inserts", -3), id="limiter-negative-inserts"),
    pytest.param(lambda m: {**m, "tables": [{**m["tables"][0], "sampler": {**m["tables"][0]["sampler"],
                 "rng": {"bit_generator": "MT19937", "state": {}}}}, m["tables"][1]]}, id="sampler-rng-state"),
])
def test_well_formed_file_with_impossible_state_changes_nothing(saved, tmp_path, edit):
    """A file that passes the zip CRCs but holds an impossible state is refused before anything changes."""
    src, _ = saved
    bad = _rewrite(src, tmp_path / "impossible.npz", manifest=json.dumps(edit(_manifest(src))))
    _assert_load_refused(bad, "checkpoint")


def test_missing_file_raises_file_not_found(tmp_path):
    store, tables = target()
    before = full_state(store, tables)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "absent.ckpt", store, tables)
    assert_tree_equal(full_state(store, tables), before)


# ---------------------------------------------------------------------------------------------- mismatch
def _store_variant(**store_kwargs):
    store = make_store(**store_kwargs)
    tables = make_tables(store)
    drive(store, tables, np.random.default_rng(7), 60)
    return store, tables


@pytest.mark.parametrize(("store_kwargs", "words"), [
    pytest.param({"capacity": 16}, ["store", "'capacity': 16", "'capacity': 8"], id="capacity"),
    pytest.param({"lanes": 2}, ["store", "'lanes': 2", "'lanes': 3"], id="lanes"),
    pytest.param({"spec": {"id": SPEC["id"], "obs": (Field((2,), np.float64), SPEC["obs"][1])}},
                 ["store", "obs/0", "<f8", "<f4"], id="field-dtype"),
    pytest.param({"spec": {"id": SPEC["id"], "obs": (Field((3,), np.float32), SPEC["obs"][1])}},
                 ["store", "obs/0", "[3]", "[2]"], id="field-shape"),
])
def test_store_mismatch(saved, store_kwargs, words):
    _assert_mismatch(saved[0], *_store_variant(**store_kwargs), words)


@pytest.mark.parametrize(("table_kwargs", "words"), [
    pytest.param(lambda: {"prio_max_size": 13}, ["table 0", "'max_size': 13", "'max_size': 12"], id="max_size"),
    pytest.param(lambda: {"prio_sampler": Uniform(seed=11)}, ["table 0", "Uniform", "Prioritized"],
                 id="sampler-class"),
    pytest.param(lambda: {"prio_sampler": Prioritized(0.6, 0.5, seed=11)}, ["table 0", "'alpha': 0.6", "'alpha': 0.7"],
                 id="alpha"),
    pytest.param(lambda: {"prio_sampler": Prioritized(0.7, 0.5, seed=12)}, ["table 0", "'seed': 12", "'seed': 11"],
                 id="seed"),
    pytest.param(lambda: {"item_spec": {"ret": ITEM["ret"]}}, ["table 0", "item_fields", "disc"], id="item_spec"),
    pytest.param(lambda: {"item_spec": {"ret": Field((), np.float64), "disc": ITEM["disc"]}},
                 ["table 0", "item_fields", "<f8", "<f4"], id="item-dtype"),
    pytest.param(lambda: {"uni_max_times": 3}, ["table 1", "'max_times_sampled': 3", "'max_times_sampled': 2"],
                 id="max_times_sampled"),
    pytest.param(lambda: {"uni_limiter": SampleToInsertRatio(1.5, 3, 12.0)}, ["table 1", "rate limiter", "max_diff"],
                 id="limiter"),
])
def test_table_mismatch(saved, table_kwargs, words):
    _assert_mismatch(saved[0], *target(**table_kwargs()), words)


def _assert_mismatch(path, store, tables, words):
    """Loading refuses with a message holding ``words``, and changes nothing."""
    before = full_state(store, tables)
    with pytest.raises(CheckpointError, match="mismatch") as err:
        load(path, store, tables)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert_tree_equal(full_state(store, tables), before)


@pytest.mark.parametrize("pick", [
    pytest.param(lambda t: t[:1], id="one-table"),
    pytest.param(lambda t: [], id="no-table"),
    pytest.param(lambda t: t[::-1], id="tables-swapped"),
])
def test_wrong_tables(saved, pick):
    path, _ = saved
    store, tables = target()
    before = full_state(store, tables)
    given = pick(tables)
    with pytest.raises(CheckpointError, match="mismatch") as err:
        load(path, store, given)
    if len(given) != 2:
        assert f"{len(given)} table(s) given, the file has 2" in str(err.value)
    assert_tree_equal(full_state(store, tables), before)


def test_matching_objects_load_after_refusals(saved, tmp_path):
    """A refused load leaves the objects usable: the right checkpoint still loads into them."""
    path, expected = saved
    store, tables = target()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError):
        load(bad, store, tables)
    load(path, store, tables)
    assert_tree_equal(full_state(store, tables), expected)
