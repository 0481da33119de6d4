"""Corrupt replay checkpoints, byte by byte: every damaged zip header, npy header or truncation of a real
checkpoint either raises ``CheckpointError`` and leaves the objects as they were, or loads exactly the
data that was saved (a byte the readers never use, such as a timestamp).

The zip structure is parsed from the raw bytes (``tests/zip_layout.py``), so the fields flipped are the
ones the format defines.
"""

import copy
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from checkpointed_parts import assert_same
from damaged_file import DamagedFile
from zip_layout import CENTRAL_FIELDS, END_FIELDS, LOCAL_FIELDS, zip_headers

from rlflow.replay import CheckpointError, Prioritized, StepStore, Table, load, save
from rlflow.specs import Field


def build(seed):
    store = StepStore({"obs": Field((2,), np.float32)}, capacity=6)
    table = Table(store, sampler=Prioritized(0.7, 0.5, seed=3), max_size=5, name="prio")
    rng = np.random.default_rng(seed)
    rows = store.extend(0, {"obs": rng.normal(size=(5 + seed, 2)).astype(np.float32)}, first=np.arange(5 + seed) == 0)
    table.insert(np.zeros(4, np.int64), rows[-5:-1], 1, priorities=rng.uniform(0.5, 2.0, 4))
    table.sample(3)
    return store, [table]


def state(store, tables):
    """A copy of everything a load may change."""
    out = {f"store/{k}": np.array(v, copy=True) for k, v in store.state_dict().items()}
    for t in tables:
        st = t.state_dict()
        out.update({f"{t.name}/{k}": np.array(v, copy=True) for k, v in st["arrays"].items()})
        for role in ("sampler", "remover"):
            out.update({f"{t.name}/{role}/{k}": np.array(v, copy=True) if isinstance(v, np.ndarray) else repr(v)
                        for k, v in st[role].items()})
        out[f"{t.name}/limiter"] = repr(st["rate_limiter"])
        out[f"{t.name}/next_seq"] = st["next_seq"]
    return out


def npy_headers(raw):
    """``(start, length)`` of every member's ``.npy`` header (magic, version, header length, header)."""
    out = []
    for kind, start, length in zip_headers(raw):
        if kind == "local":
            data = start + length
            assert raw[data: data + 6] == b"\x93NUMPY" and raw[data + 6] == 1
            out.append((data, 10 + struct.unpack("<H", raw[data + 8: data + 10])[0]))
    return out


class Loader(DamagedFile):
    """Loads damaged copies of a checkpoint into one set of objects, checking each outcome."""

    def __init__(self, tmp_path: Path):
        good = tmp_path / "good.ckpt"
        saved = build(0)
        save(good, *saved)
        raw = good.read_bytes()
        self.saved = state(*saved)
        self.objects = build(1)
        self.before = state(*self.objects)
        store, tables = self.objects
        self.restore = (copy.deepcopy(store.state_dict()), [copy.deepcopy(t.state_dict()) for t in tables])
        bad = tmp_path / "bad.ckpt"
        bad.write_bytes(raw)
        super().__init__(bad, raw)

    def check(self, what: str) -> None:
        try:
            load(self.path, *self.objects)
        except CheckpointError:
            self.refused += 1
            assert_same(state(*self.objects), self.before, f"{what}: ")
            return
        self.loaded += 1
        assert_same(state(*self.objects), self.saved, f"{what}: ")
        store, tables = self.objects
        store.load_state_dict(self.restore[0])
        for t, st in zip(tables, self.restore[1], strict=True):
            t.load_state_dict(st)


def test_every_zip_header_byte_flipped(tmp_path):
    loader = Loader(tmp_path)
    headers = zip_headers(loader.raw)
    assert len(headers) == 2 * 14 + 1  # the store's 6 arrays, the table's 4, its selectors' 3, the manifest
    for kind, start, length in headers:
        for at in range(start, start + length):
            loader.flipped(at, 0xFF, f"{kind} header byte {at - start}")
    assert loader.refused > len(headers) * 30  # most header bytes matter


@pytest.mark.parametrize(("kind", "flipped"), [
    pytest.param("local", {"flags": 16}, id="local"),
    pytest.param("central", {"flags": 16, "method": 16, "crc": 8, "compressed size": 8, "size": 8, "offset": 8},
                 id="central"),
    pytest.param("end", {name: 8 * size for name, (_, size) in END_FIELDS.items()}, id="end"),
])
def test_every_bit_of_zip_header_fields_flipped(tmp_path, kind, flipped):
    """One bit at a time, in every header: each bit of the flags (bit 0: encrypted, 3: sizes after the
    data, 5: patch data, 6: strong encryption, 11: UTF-8 names) and of the compression method, the 8 low
    bits of the CRC, sizes and offset (the test above flips each of their bytes whole), and every bit of
    the end record. A local header's flags, method, CRC and sizes are not read (the central directory's
    are): those flips load the data saved."""
    loader = Loader(tmp_path)
    fields = {"local": LOCAL_FIELDS, "central": CENTRAL_FIELDS, "end": END_FIELDS}[kind]
    for _, start, _ in (h for h in zip_headers(loader.raw) if h[0] == kind):
        for name, bits in flipped.items():
            for bit in range(bits):
                loader.flipped(start + fields[name][0] + bit // 8, 1 << bit % 8, f"{kind} header {name} bit {bit}")
    if kind == "local":  # not read: every flip loads the data saved (``check`` compares it)
        assert loader.refused == 0 and loader.loaded == 14 * 16
    else:
        assert loader.refused


def test_every_npy_header_byte_flipped(tmp_path):
    """A member's npy header is read before its CRC is checked: a damaged one is refused, never trusted
    (its shape could ask for more memory than the file holds)."""
    loader = Loader(tmp_path)
    for start, length in npy_headers(loader.raw):
        for at in range(start, start + length):
            loader.flipped(at, 0xFF, f"npy header byte {at - start}")
    assert loader.loaded == 0


def test_truncated_at_many_lengths(tmp_path):
    """Every length that cuts the central directory or the end record, and every 7th before them."""
    loader = Loader(tmp_path)
    loader.truncated_at_many_lengths()
    assert loader.loaded == 0


@pytest.mark.parametrize(("header", "match"), [
    pytest.param({"descr": "<f4", "fortran_order": False, "shape": (10**15, 2)},
                 r"store/column/obs.*float32\(1000000000000000, 2\) does not fit", id="huge-shape"),
    pytest.param({"descr": "|O", "fortran_order": False, "shape": (6, 2)}, "store/column/obs.*objects",
                 id="objects"),
])
def test_a_forged_npy_header_is_refused_before_its_memory_is_allocated(tmp_path, header, match):
    """A member whose CRC matches but whose header declares more data than it holds, or objects (which
    would need unpickling), is refused before anything that size is allocated."""
    loader = Loader(tmp_path)
    with np.load(tmp_path / "good.ckpt", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    with zipfile.ZipFile(loader.path, "w") as zf:
        for name, arr in arrays.items():
            with zf.open(f"{name}.npy", "w") as f:
                if name == "store/column/obs":
                    np.lib.format.write_array_header_1_0(f, header)
                    f.write(arr.tobytes())
                else:
                    np.lib.format.write_array(f, arr)
    with pytest.raises(CheckpointError, match=match):
        load(loader.path, *loader.objects)
    assert_same(state(*loader.objects), loader.before, "forged header")
