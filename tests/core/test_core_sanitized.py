"""The compiled core built with AddressSanitizer and UndefinedBehaviorSanitizer (``-DRLFLOW_SANITIZE=ON``), under
the tests of every part that calls it: an out-of-bounds read or write, a use after free or undefined behaviour in
the core ends the run with the sanitizer's report instead of passing unseen."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the tests of the parts that call the core (selectors, tables, minibatches, threads, the flexibuff facade, the
# block filler and writer with frame stacks and multi-agent rows, the n-step items, ReplayBuffer and its call
# classifier)
CALLERS = ["tests/replay/test_selectors.py", "tests/replay/test_sequential_draws.py", "tests/replay/test_table.py",
           "tests/test_minibatches.py", "tests/replay/test_threads.py", "tests/adders/test_priority_fns.py",
           "tests/compat/test_compat_flexibuff.py", "tests/adders/test_step_block.py",
           "tests/replay/test_frame_stacks.py", "tests/adders/test_multiagent.py", "tests/test_replay_buffer.py",
           "tests/test_replay_buffer_streams.py", "tests/adders/test_adders.py", "tests/replay/test_storage.py",
           "tests/replay/test_row_table.py", "tests/core/test_core_boundaries.py", "tests/replay/test_checkpoint.py"]


def _runtime(name: str) -> str:
    return subprocess.run(["c++", f"-print-file-name={name}"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.timeout(1500)
@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("cmake") is None, reason="needs c++ and cmake")
def test_the_callers_tests_pass_on_a_sanitized_core(tmp_path):
    import nanobind

    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug", "-DRLFLOW_SANITIZE=ON",
                    f"-Dnanobind_DIR={nanobind.cmake_dir()}", f"-DPython_EXECUTABLE={sys.executable}"],
                   check=True, capture_output=True, timeout=300)
    subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, capture_output=True, timeout=900)
    (core,) = build.glob("_core*.so")
    # reports go to files (pytest captures what the tests write to stderr, and the run stops at the first one)
    logs = tmp_path / "sanitizer"
    env = dict(os.environ, LD_PRELOAD=f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
               ASAN_OPTIONS=f"detect_leaks=0:abort_on_error=1:log_path={logs}",
               UBSAN_OPTIONS=f"halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path={logs}")
    runner = Path(__file__).resolve().parent / "sanitized_pytest.py"
    done = subprocess.run([sys.executable, str(runner), str(core), "-q", "-x",
                           "-p", "no:cacheprovider", *CALLERS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    reports = "".join(f.read_text()[:4000] for f in sorted(tmp_path.glob("sanitizer*")))
    assert done.returncode == 0 and not reports, reports or (done.stdout[-4000:], done.stderr[-4000:])
