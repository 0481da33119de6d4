"""Run checkpoint files (``rlflow.loop.checkpoint``): a damaged, truncated or forged ``run.pt``, state file
or ``latest`` pointer raises ``CheckpointError`` before the store, the table or torch's RNG change; a save
removes what killed saves left, and nothing else.

``torch.load`` does not check zip CRCs: the loaders do, so a flipped data byte is refused rather than
loaded as other values.
"""

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpointed_parts import assert_same
from damaged_file import DamagedFile
from zip_layout import CENTRAL_FIELDS, zip_headers

from rlflow.loop import checkpoint as run_checkpoint
from rlflow.replay import CheckpointError, Prioritized, StepStore, Table
from rlflow.specs import Field

STATE = {"learner": {"w": torch.arange(6, dtype=torch.float32), "stats": np.arange(4, dtype=np.int64), "step": 3,
                     "scale": np.float32(0.5)}, "args": {"hidden": (8, 8), "name": "dqn"}}


def make_table(seed):
    store = StepStore({"obs": Field((2,), np.float32)}, capacity=8)
    table = Table(store, sampler=Prioritized(0.6, 0.4, seed=1), name="replay")
    rng = np.random.default_rng(seed)
    rows = store.extend(0, {"obs": rng.normal(size=(6 + seed, 2)).astype(np.float32)}, first=np.arange(6 + seed) == 0)
    table.insert(np.zeros(5, np.int64), rows[-6:-1], 1, priorities=rng.uniform(0.5, 2.0, 5))
    return table


def snapshot(table):
    """Everything a load may change: the store's and table's arrays, the selector's RNG, torch's RNG."""
    st = table.state_dict()
    out = {f"store/{k}": v.copy() for k, v in table.store.state_dict().items()}
    out.update({f"table/{k}": v.copy() for k, v in st["arrays"].items()})
    out["sampler"] = repr(st["sampler"])
    out["torch_rng"] = torch.get_rng_state().numpy().copy()
    return out


def same_state(a, b):
    """Whether two loaded states hold equal values of the same types."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray | np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


class StateFile(DamagedFile):
    """A state file written by ``save_state``, damaged in place byte by byte."""

    def __init__(self, tmp_path: Path):
        path = tmp_path / "learner.pt"
        run_checkpoint.save_state(path, STATE)
        super().__init__(path, path.read_bytes())
        self.expected = run_checkpoint.load_state(path)

    def check(self, what: str) -> None:
        try:
            got = run_checkpoint.load_state(self.path)
        except CheckpointError:
            self.refused += 1
            return
        self.loaded += 1
        assert same_state(got, self.expected), f"{what}: loaded other values"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_every_header_byte_and_a_data_byte_of_each_member_flipped(tmp_path):
    """Every byte of the central directory, the end record and each local header's fixed part; one bit at
    a time: the flags (0: encrypted, 6: strong encryption), the compression method and the external
    attributes' directory bit (torch's reader then reads the member as empty); and the middle byte of each
    member's data (the CRC's)."""
    state = StateFile(tmp_path)
    raw = state.raw
    headers = zip_headers(raw)
    for kind, start, length in headers:
        for at in range(start, start + (30 if kind == "local" else length)):
            state.flipped(at, 0xFF, f"{kind} header byte {at - start}")
    bits = [("flags", 0), ("flags", 6), ("method", 0), ("method", 1), ("method", 3), ("external attributes", 4)]
    for kind, start, _ in headers:
        if kind == "central":
            for field, bit in bits:
                at = start + CENTRAL_FIELDS[field][0]
                state.flipped(at, 1 << bit, f"central header {field} bit {bit}")
            size = struct.unpack("<I", raw[start + 24: start + 28])[0]
            local = struct.unpack("<I", raw[start + 42: start + 46])[0]
            name, extra = struct.unpack("<HH", raw[local + 26: local + 30])
            if size:
                refused = state.refused
                state.flipped(local + 30 + name + extra + size // 2, 0x5A, "member data")
                assert state.refused == refused + 1, "a damaged data byte was loaded"
    assert state.refused > 300


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_truncated_state_file(tmp_path):
    state = StateFile(tmp_path)
    state.truncated_at_many_lengths()
    assert state.loaded == 0


# ---------------------------------------------------------------------------------------------- run.pt
def saved_run(tmp_path):
    table = make_table(0)
    return run_checkpoint.save_run(tmp_path, 100, table.store, table, {"learner": STATE["learner"]})


def test_a_saved_run_loads_back(tmp_path):
    table = make_table(0)
    torch.manual_seed(5)
    path = run_checkpoint.save_run(tmp_path, 100, table.store, table, {"learner": STATE["learner"]})
    expected = snapshot(table)
    torch.manual_seed(6)
    other = make_table(1)
    state = run_checkpoint.load_run(path, other.store, other)
    assert same_state(state["learner"], STATE["learner"])
    assert_same(snapshot(other), expected)


def _forge(path, edit):
    """Rewrite ``run.pt`` with ``edit`` applied to what it holds (a well-formed zip with right CRCs)."""
    state = torch.load(path / "run.pt", weights_only=True)
    torch.save(edit(state), path / "run.pt")


def _numpy_entry(state, **change):
    entry = dict(state["learner"]["stats"])
    entry.update(change)
    return {**state, "learner": {**state["learner"], "stats": entry}}


@pytest.mark.parametrize(("edit", "match"), [
    pytest.param(lambda s: {k: v for k, v in s.items() if k != "torch_rng"}, "torch_rng", id="no-torch-rng"),
    pytest.param(lambda s: {**s, "torch_rng": torch.zeros(7, dtype=torch.uint8)}, "torch_rng",
                 id="torch-rng-wrong-size"),
    pytest.param(lambda s: {**s, "torch_rng": [1, 2]}, "torch_rng", id="torch-rng-a-list"),
    pytest.param(lambda s: _numpy_entry(s, dtype="not a dtype"), r"\['stats'\] is not an encoded numpy value",
                 id="numpy-dtype"),
    pytest.param(lambda s: _numpy_entry(s, dtype="|O"), "not an encoded numpy value", id="numpy-objects"),
    pytest.param(lambda s: _numpy_entry(s, shape=[5]), "not an encoded numpy value", id="numpy-shape"),
    pytest.param(lambda s: _numpy_entry(s, shape=[-4]), "not an encoded numpy value", id="numpy-negative-shape"),
    pytest.param(lambda s: _numpy_entry(s, shape="4"), "not an encoded numpy value", id="numpy-shape-a-string"),
    pytest.param(lambda s: _numpy_entry(s, scalar="no"), "not an encoded numpy value", id="numpy-scalar-flag"),
    pytest.param(lambda s: _numpy_entry(s, dtype=None), "not an encoded numpy value", id="numpy-no-dtype"),
    pytest.param(lambda s: _numpy_entry(s, __rlflow_numpy__=[1, 2]), "not an encoded numpy value",
                 id="numpy-bytes-a-list"),
    pytest.param(lambda s: {**s, "version": run_checkpoint.VERSION + 1}, "expected format", id="version"),
    pytest.param(lambda s: [s], "expected format", id="not-a-dict"),
])
def test_a_forged_run_file_is_refused_before_anything_changes(tmp_path, edit, match):
    path = saved_run(tmp_path)
    _forge(path, edit)
    table = make_table(1)
    torch.manual_seed(9)
    before = snapshot(table)
    with pytest.raises(CheckpointError, match=match):
        run_checkpoint.load_run(path, table.store, table)
    assert_same(snapshot(table), before)


@pytest.mark.parametrize("member", ["run.pt", "replay.ckpt"])
def test_a_damaged_run_checkpoint_changes_nothing(tmp_path, member):
    path = saved_run(tmp_path)
    raw = bytearray((path / member).read_bytes())
    raw[len(raw) // 3] ^= 0x5A  # inside a member's data
    (path / member).write_bytes(bytes(raw))
    table = make_table(1)
    torch.manual_seed(9)
    before = snapshot(table)
    with pytest.raises(CheckpointError, match=r"CRC|corrupt"):
        run_checkpoint.load_run(path, table.store, table)
    assert_same(snapshot(table), before)


def test_a_forged_state_file_is_refused(tmp_path):
    path = tmp_path / "learner.pt"
    run_checkpoint.save_state(path, STATE)
    state = torch.load(path, weights_only=True)
    state["learner"]["stats"]["dtype"] = "not a dtype"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"state\['learner'\]\['stats'\] is not an encoded numpy value"):
        run_checkpoint.load_state(path)


# ---------------------------------------------------------------------------------------------- latest
@pytest.mark.parametrize("pointer", [
    pytest.param(b"step-000000000200\n", id="names-a-missing-checkpoint"),
    pytest.param(b"", id="empty"),
    pytest.param(b"\xff\xfe\x00", id="not-text"),
    pytest.param(b"../step-000000000100\n", id="outside"),
    pytest.param(b"/etc\n", id="absolute"),
])
def test_a_latest_pointer_naming_no_checkpoint_is_refused(tmp_path, pointer):
    """Starting afresh instead would remove the checkpoints there at the first save."""
    saved_run(tmp_path)
    (tmp_path / "latest").write_bytes(pointer)
    with pytest.raises(CheckpointError, match=r"latest: .*step-000000000100"):
        run_checkpoint.latest(tmp_path)


def test_latest_without_a_pointer_is_none_and_with_one_the_checkpoint(tmp_path):
    assert run_checkpoint.latest(tmp_path) is None
    assert run_checkpoint.latest(tmp_path / "absent") is None
    assert saved_run(tmp_path) == tmp_path / "step-000000000100"
    (tmp_path / "step-000000000100" / "run.pt").unlink()
    with pytest.raises(CheckpointError, match="complete checkpoint"):
        run_checkpoint.latest(tmp_path)


# ---------------------------------------------------------------------------------------------- leftovers
def test_a_run_save_removes_what_killed_saves_left_and_nothing_else(tmp_path):
    table = make_table(0)
    run_checkpoint.save_run(tmp_path, 100, table.store, table, {})
    for name in [".step-000000000150.tmp", ".step-000000000200.tmp"]:  # killed before their rename
        (tmp_path / name).mkdir()
        (tmp_path / name / "replay.ckpt").write_bytes(b"half a checkpoint")
        (tmp_path / name / ".replay.ckpt.tmp-1").write_bytes(b"half")
    kept_files = ["notes.txt", "step-notes.txt", ".step-abc.tmp", ".step-000000000150.tmp.keep", "step-0001"]
    kept_dirs = ["step-plots", ".step-0001.tmp", "runs"]
    for name in kept_files:
        (tmp_path / name).write_bytes(b"mine")
    for name in kept_dirs:
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_bytes(b"mine")
    final = run_checkpoint.save_run(tmp_path, 300, table.store, table, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest", final.name, *kept_files, *kept_dirs])
    assert all((tmp_path / n).read_bytes() == b"mine" for n in kept_files)
    assert all((tmp_path / n / "a.txt").read_bytes() == b"mine" for n in kept_dirs)
    assert run_checkpoint.latest(tmp_path) == final


def test_a_failed_run_save_leaves_no_temporary_directory(tmp_path, monkeypatch):
    table = make_table(0)
    first = run_checkpoint.save_run(tmp_path, 100, table.store, table, {})

    def crash(path, store, tables):  # dies after writing part of the new checkpoint's file
        path.write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(run_checkpoint.replay_checkpoint, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        run_checkpoint.save_run(tmp_path, 200, table.store, table, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", first.name]
    assert run_checkpoint.latest(tmp_path) == first


def test_a_state_save_replaces_a_killed_saves_temporary_file_and_a_failed_one_leaves_none(tmp_path, monkeypatch):
    path = tmp_path / "learner.pt"
    (tmp_path / ".learner.pt.tmp-999999999").write_bytes(b"half a state")  # a save killed mid-write (no such pid)
    (tmp_path / ".other.pt.tmp").write_bytes(b"mine")
    run_checkpoint.save_state(path, STATE)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.pt.tmp", "learner.pt"]
    before = path.read_bytes()

    def crash(obj, f):
        f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        run_checkpoint.save_state(path, STATE)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.pt.tmp", "learner.pt"]
    assert path.read_bytes() == before
