"""The ``rlflow`` command runs baselines by name."""

import subprocess
import sys

import rlflow
from rlflow import cli
from rlflow.loggers import read_csv


def test_lists_the_baselines(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "dqn, hatd3, mappo, ppo, qmix, sac, selfplay_dqn, td3" in out


def test_help_is_plain_text_with_the_usage_and_the_baselines(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rlflow: run one of rlflow's baselines by name.\n")
    assert "usage: rlflow NAME [--flag value ...]" in out and "baselines: dqn, hatd3, mappo, ppo" in out
    assert "``" not in out and ":class:" not in out  # no docstring markup


def test_a_bare_command_prints_the_usage_and_fails(capsys):
    assert cli.main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "usage: rlflow NAME" in captured.err and "baselines: dqn" in captured.err


def test_version():
    for flag in ("--version", "-V"):
        out = subprocess.run([sys.executable, "-m", "rlflow.cli", flag], capture_output=True, text=True, check=True)
        assert out.stdout == f"rlflow {rlflow.__version__}\n"
    from importlib.metadata import version

    assert version("rlflow") == rlflow.__version__  # the package's metadata reads the same attribute


def test_unknown_baseline_is_refused(capsys):
    assert cli.main(["nope"]) == 2
    assert "unknown baseline 'nope'" in capsys.readouterr().err


def test_runs_a_baseline_with_its_flags(tmp_path, capsys):
    assert cli.main(["dqn", "--total-steps", "300", "--learning-starts", "100", "--eval-every", "300",
                     "--eval-episodes", "1", "--hidden", "8", "--logdir", str(tmp_path), "--no-progress"]) == 0
    assert "eval at 300 env steps" in capsys.readouterr().out
    assert [r["step"] for r in read_csv(tmp_path / "eval.csv")] == ["300"]


def undescribed_flags(module_name: str) -> list[str]:
    """The fields of a baseline's ``Args`` (and the dataclasses it inherits from baselines) with no description:
    a comment on the field's line, or a docstring under it, is what ``--help`` shows for the flag."""
    import ast
    import importlib
    import inspect

    module = importlib.import_module(module_name)
    missing = []
    for cls in module.Args.__mro__:
        if not cls.__module__.startswith("baselines") or cls is object:
            continue
        source = inspect.getsource(cls)
        lines = source.splitlines()
        body = ast.parse(source).body[0].body
        for i, node in enumerate(body):
            if not isinstance(node, ast.AnnAssign):
                continue
            after = body[i + 1] if i + 1 < len(body) else None
            docstring = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            if "#" not in lines[node.end_lineno - 1] and not docstring:
                missing.append(f"{cls.__name__}.{node.target.id}")
    return sorted(set(missing))


def test_every_baseline_flag_has_a_description(capsys):
    names = cli.available()
    assert names
    assert {name: undescribed_flags(f"baselines.{name}") for name in names} == {name: [] for name in names}
    # and --help shows it
    import pytest

    with pytest.raises(SystemExit):
        cli.main(["dqn", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "the seed of the envs, the networks and the replay" in out
