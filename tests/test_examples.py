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


def load_example(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def project_reference(probabilities, reward, discount, support):
    """C51's projection one atom at a time: the shifted atom's mass split between its neighbours on the support."""
    import numpy as np

    v_min, v_max, delta = support[0], support[-1], support[1] - support[0]
    target = np.zeros_like(probabilities)
    for i in range(len(probabilities)):
        for j, z in enumerate(support):
            tz = min(max(reward[i] + discount[i] * z, v_min), v_max)
            b = (tz - v_min) / delta
            low, high = int(np.floor(b)), int(np.ceil(b))
            if low == high:
                target[i, low] += probabilities[i, j]
            else:
                target[i, low] += probabilities[i, j] * (high - b)
                target[i, high] += probabilities[i, j] * (b - low)
    return target


def test_rainbow_projection_matches_a_per_atom_reference():
    import numpy as np
    import torch

    project = load_example("rainbow").project
    rng = np.random.default_rng(0)
    support = np.linspace(-10.0, 10.0, 11)
    probabilities = rng.dirichlet(np.ones(11), size=64)
    # rewards that land between atoms, on atoms, and beyond both ends; discounts 0 (terminal), gamma^n and 1
    reward = np.concatenate([rng.uniform(-30, 30, 40), [0.0, 2.0, -4.0, 10.0, -10.0, 50.0, -50.0, 3.0] * 3])
    discount = np.concatenate([rng.choice([0.0, 0.97, 1.0], 40), np.repeat([0.0, 0.97, 1.0], 8)])
    got = project(*(torch.as_tensor(x, dtype=torch.float64) for x in (probabilities, reward, discount, support)))
    want = project_reference(probabilities, reward, discount, support)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    np.testing.assert_allclose(got.sum(1).numpy(), 1.0, atol=1e-12)  # no mass lost at the ends
    # atoms that land exactly on the support keep their whole mass there
    np.testing.assert_allclose(got[56].numpy(), probabilities[56], atol=1e-12)  # reward 0, discount 1


def test_rainbow_example_runs_and_updates_priorities():
    out = run_example("rainbow.py", "--steps", "1500", "--learning-starts", "500", "--capacity", "1000")
    assert "eval at 150 env steps" in out and "eval at 1500 env steps" in out


def test_rainbow_is_as_short_as_its_docstring_says():
    path = ROOT / "examples" / "rainbow.py"
    n = code_lines(path)
    assert f"in {n} lines of code" in path.read_text(), n
