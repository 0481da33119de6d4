"""Rows whose ``id`` encodes ``(lane, row)``: a store of them, written a row per lane at a time, lets a test
check that every sampled window shows exactly the rows its item names (table and row-table tests)."""

import numpy as np

from rlflow.specs import Field

SPEC = {"id": Field((), np.int64), "obs": Field((2,), np.float32)}
ITEM = {"ret": Field((), np.float32)}
BIG = 10**6  # ids lane * BIG + row


def row_data(lanes, rows):
    ids = np.asarray(lanes) * BIG + np.asarray(rows)
    return {"id": ids, "obs": np.stack([ids, -ids], -1).astype(np.float32)}


def write(store, lanes=None, first=None):
    """One row on each of ``lanes`` (default: every lane), ``first[i]`` starting an episode."""
    lanes = np.arange(store.num_lanes) if lanes is None else np.asarray(lanes)
    starts = store.count[lanes] == 0  # a lane's first row starts an episode
    first = starts if first is None else np.asarray(first) | starts
    return store.append(row_data(lanes, store.count[lanes]), lanes=lanes, first=first)


def check_sample_data(sample):
    """Every valid row of every window is the row the item names (never stale, never another lane)."""
    ids = sample.data["id"]
    expect = sample.lanes[:, None] * BIG + sample.starts[:, None] + np.arange(ids.shape[1])[None, :]
    assert np.all(np.where(sample.mask, ids == expect, ids == 0))

