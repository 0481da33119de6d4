"""Kernels are compiled (or loaded from numba's cache) when a program first calls them, never on import, and
only those its path calls: a uniform ReplayBuffer (a RowTable) reaches no item-table or selector kernel, and a
prioritized one (a Table) no RowTable kernel.

Each case runs in a fresh interpreter, which knows only what that program called: a numba dispatcher
lists a signature once it was compiled or loaded from the cache for a call.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = r"""
import json, sys
import numpy as np
from numba.core.registry import CPUDispatcher

def called():
    out = []
    for name, module in list(sys.modules.items()):
        if name.startswith("rlflow"):
            out += [f"{v.py_func.__module__}.{v.py_func.__qualname__}" for v in vars(module).values()
                    if isinstance(v, CPUDispatcher) and v.signatures]
    return sorted(set(out))

import rlflow
from rlflow import ReplayBuffer, specs
from rlflow.kernels import items, prefetch
from rlflow.kernels import rows, selection
from rlflow.replay import sum_tree
imported = called()

buffer = ReplayBuffer(specs.Field((3,), np.float32), specs.Field((), np.int64, low=0, high=3), capacity=64,
                      prioritized=sys.argv[1] == "prioritized")
obs = np.zeros(3, np.float32)
for i in range(int(sys.argv[2])):
    next_obs = np.full(3, i + 1, np.float32)
    buffer.add(obs, i % 4, 1.0, next_obs, i % 10 == 9, False)
    obs = next_obs
buffer.sample(8)
print(json.dumps({"imported": imported, "used": called()}))
"""


def _kernels_called(kind: str, adds: int) -> dict[str, list[str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-c", PROGRAM, kind, str(adds)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_import_compiles_nothing_and_a_buffer_only_what_it_calls(kind):
    called = _kernels_called(kind, 20)
    assert called["imported"] == []
    used = called["used"]
    if kind == "uniform":  # a RowTable: no item table, no selector kernel
        assert "rlflow.kernels.rows.place" in used  # the program did reach the kernels
        assert not [k for k in used if k.startswith(("rlflow.kernels.selection.", "rlflow.kernels.items.add"))]
    else:  # a Table of items (its sum tree and FIFO ring are the compiled core's, not numba kernels)
        assert {"rlflow.kernels.items.add_items", "rlflow.kernels.selection.draw_rows"} <= set(used)
        assert not [k for k in used if k.startswith("rlflow.kernels.rows.")]
