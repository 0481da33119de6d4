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
    assert "eval at 300 env steps" in out and "eval at 1500 env steps" in out
    assert out.count("mean return") == 5  # each evaluation once (every 300 steps), none repeated at the end


def code_lines(path):
    """Lines of code: not blank, not a comment, not part of a docstring."""
    import ast

    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and ast.get_docstring(node) is not None:
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docstrings)


def test_dqn_minimal_is_as_short_as_its_docstring_says():
    path = ROOT / "examples" / "dqn_minimal.py"
    n = code_lines(path)
    assert f"in {n} lines of code" in path.read_text(), n


def test_code_lines_counts_only_code(tmp_path):
    program = tmp_path / "p.py"
    program.write_text('"""Doc\nstring."""\n\nimport os  # a comment\n# only a comment\n\n\ndef f():\n'
                       '    """Its doc."""\n    return os.sep\n')
    assert code_lines(program) == 3


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
