import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_prioritized_table_example_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "prioritized_table.py"), "--steps", "1500", "--capacity", "800"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    assert "env steps: 1500" in out
    assert "transition items" in out
    assert "observation (64, 2, 4)" in out


def test_dqn_minimal_example_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "dqn_minimal.py"), "--steps", "1500"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    assert "eval at 500 env steps" in out and "eval at 1500 env steps" in out and "done after 1500 env steps" in out
    assert out.count("mean return") == 3  # each evaluation once (every 500 steps), none repeated at the end


def run_example(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                          check=True, timeout=300).stdout


def test_per_learner_example_runs():
    out = run_example("per_learner.py", "--steps", "1200")
    assert "after 1200 env steps" in out and "priorities updated" in out and "mean_weight" in out


def test_recurrent_policy_example_runs():
    out = run_example("recurrent_policy.py", "--steps", "1200")
    assert "after 1200 env steps" in out and "sequences of 10 rows" in out


def test_replay_buffer_loop_example_runs():
    out = run_example("replay_buffer_loop.py", "--steps", "1200")
    assert "transitions stored" in out and "after 1200 env steps" in out
