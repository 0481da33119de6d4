"""rlflow compiles nothing at run time: its core is built when pip installs it, so a program's path from
``import rlflow`` to a first sample loads no JIT compiler (numba, llvmlite) and no compiler at all, whichever
kind of table it reaches (a uniform ReplayBuffer is a RowTable, a prioritized one a Table of items).

Each case runs in a fresh interpreter, which knows only the modules that program imported.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = r"""
import json, sys
import numpy as np
import rlflow
from rlflow import ReplayBuffer, specs

buffer = ReplayBuffer(specs.Field((3,), np.float32), specs.Field((), np.int64, low=0, high=3), capacity=64,
                      prioritized=sys.argv[1] == "prioritized", n_step=int(sys.argv[2]))
obs = np.zeros(3, np.float32)
for i in range(40):
    next_obs = np.full(3, i + 1, np.float32)
    buffer.add(obs, i % 4, 1.0, next_obs, i % 10 == 9, False)
    obs = next_obs
batch = buffer.sample(8)
print(json.dumps({"modules": sorted(sys.modules), "rewards": batch.data.reward.tolist()}))
"""


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("n_step", [1, 3])
def test_a_first_sample_loads_no_compiler(kind, n_step):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-c", PROGRAM, kind, str(n_step)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["rewards"]) == 8  # the program did sample
    loaded = {name.split(".")[0] for name in out["modules"]}
    assert not loaded & {"numba", "llvmlite", "cffi", "torch"}, loaded & {"numba", "llvmlite", "cffi", "torch"}
    assert "rlflow._core" in out["modules"]
