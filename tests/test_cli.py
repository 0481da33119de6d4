"""The ``rlflow`` command runs baselines by name."""

from rlflow import cli
from rlflow.loggers import read_csv


def test_lists_the_baselines(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "dqn, mappo, ppo, qmix, sac, selfplay_dqn, td3" in out


def test_unknown_baseline_is_refused(capsys):
    assert cli.main(["nope"]) == 2
    assert "unknown baseline 'nope'" in capsys.readouterr().err


def test_runs_a_baseline_with_its_flags(tmp_path, capsys):
    assert cli.main(["dqn", "--total-steps", "300", "--learning-starts", "100", "--eval-every", "300",
                     "--eval-episodes", "1", "--hidden", "8", "--logdir", str(tmp_path), "--no-progress"]) == 0
    assert "final evaluation" in capsys.readouterr().out
    assert [r["step"] for r in read_csv(tmp_path / "eval.csv")] == ["300"]
