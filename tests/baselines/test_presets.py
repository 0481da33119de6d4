"""Per-env presets of the baselines (baselines/presets/NAME.yaml): picked by the env's name, flags win over them,
``--preset none``, a notice for an env without one, ``--list-presets``, and ``config.json`` round trips."""

import dataclasses
import importlib
import json

import pytest

from baselines import _presets, dqn, ppo, sac, selfplay_dqn, td3
from rlflow import cli

BASELINES = ["dqn", "ppo", "sac", "td3", "mappo", "qmix", "selfplay_dqn", "hatd3"]


@pytest.mark.parametrize("name", BASELINES)
def test_every_preset_sets_flags_of_its_baseline_and_names_its_source(name):
    module = importlib.import_module(f"baselines.{name}")
    presets = _presets.load(name, module.Args)  # raises on a setting that is not a flag, or a missing source
    assert presets, name
    defaults = module.Args()
    env_field = "game" if name == "selfplay_dqn" else "env_id"
    assert getattr(defaults, env_field) in presets  # the default env has its entry (the defaults' own source)
    for env_id, entry in presets.items():
        assert len(entry["source"]) > 20, env_id
        args = module.parse_args([f"--{env_field.replace('_', '-')}", env_id])
        for flag, value in entry["flags"].items():
            got = getattr(args, flag)
            assert got == (tuple(value) if isinstance(value, list) else value), (env_id, flag)
            assert type(got) is type(getattr(defaults, flag)) or isinstance(value, float), (env_id, flag)


def test_env_id_applies_that_envs_preset(capsys):
    args = dqn.parse_args(["--env-id", "LunarLander-v3"])
    assert (args.learning_rate, args.batch_size, args.n_step, args.double_q, args.hidden) == (
        6.3e-4, 128, 1, False, (256, 256))
    assert args.target_update_period == 250 and args.total_steps == 100_000 and args.preset == "auto"
    out = capsys.readouterr().out
    assert out.startswith("preset: LunarLander-v3 (RL Baselines3 Zoo's DQN settings") and "command line" not in out


def test_a_flag_on_the_command_line_wins_over_the_preset(capsys):
    args = dqn.parse_args(["--env-id", "LunarLander-v3", "--learning-rate", "1e-3", "--double-q"])
    assert args.learning_rate == 1e-3 and args.double_q is True
    assert args.batch_size == 128 and args.n_step == 1  # the rest of the preset stays
    assert "the command line sets double_q, learning_rate" in capsys.readouterr().out


def test_acrobot_epsilon_comes_from_its_preset():
    assert dqn.parse_args(["--env-id", "Acrobot-v1"]).exploration_final_eps == 0.1
    assert dqn.parse_args(["--env-id", "Acrobot-v1", "--exploration-final-eps", "0.2"]).exploration_final_eps == 0.2
    assert dqn.parse_args(["--env-id", "Acrobot-v1", "--preset", "none"]).exploration_final_eps == 0.04
    assert dqn.parse_args([]).exploration_final_eps == 0.04  # CartPole-v1


def test_preset_none_runs_the_plain_defaults(capsys):
    args = ppo.parse_args(["--env-id", "LunarLander-v3", "--preset", "none"])
    assert args == dataclasses.replace(ppo.Args(), env_id="LunarLander-v3", preset="none")
    assert capsys.readouterr().out == "preset: none (the plain defaults)\n"


def test_preset_names_another_envs_preset():
    args = td3.parse_args(["--env-id", "LunarLanderContinuous-v3", "--preset", "Pendulum-v1"])
    assert args.env_id == "LunarLanderContinuous-v3" and args.total_steps == td3.Args().total_steps
    args = sac.parse_args(["--env-id", "MountainCarContinuous-v0", "--preset", "LunarLanderContinuous-v3"])
    assert args.hidden == (400, 300) and args.tau == 0.01


def test_an_env_without_a_preset_gets_the_defaults_and_a_notice(capsys):
    args = sac.parse_args(["--env-id", "MountainCarContinuous-v0"])
    assert args == dataclasses.replace(sac.Args(), env_id="MountainCarContinuous-v0")
    out = capsys.readouterr().out
    assert out.startswith("no preset for MountainCarContinuous-v0: the defaults (presets: Pendulum-v1, ")
    assert "--learning-rate" in out and "--samples-per-insert" in out and out.count("\n") == 1


def test_an_unknown_preset_is_refused_naming_the_choices():
    with pytest.raises(SystemExit, match=r"--preset Breakout: expected auto, none or one of \['Acrobot-v1'"):
        dqn.parse_args(["--preset", "Breakout"])


def test_list_presets_prints_each_env_its_flags_and_source(capsys):
    with pytest.raises(SystemExit) as stop:
        dqn.parse_args(["--list-presets"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "  LunarLander-v3: --total-steps 100000 --learning-rate 0.00063" in out
    assert "--no-double-q --no-anneal-lr" in out and "--hidden 256 256" in out
    assert "  CartPole-v1: (the defaults)" in out and out.count("source: ") == len(_presets.load("dqn"))


def test_the_rlflow_command_lists_presets_and_applies_them(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["ppo", "--list-presets"])
    assert "ppo presets" in capsys.readouterr().out
    assert cli.main(["dqn", "--env-id", "Acrobot-v1", "--total-steps", "200", "--learning-starts", "64",
                     "--eval-every", "0", "--eval-episodes", "1", "--hidden", "8", "--logdir", str(tmp_path),
                     "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("preset: Acrobot-v1 (")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["env_id"] == "Acrobot-v1" and saved["exploration_final_eps"] == 0.1 and saved["total_steps"] == 200
    assert saved["hidden"] == [8]


def test_a_runs_config_json_runs_the_same_settings_again(tmp_path, capsys):
    args = dqn.parse_args(["--env-id", "LunarLander-v3", "--seed", "7", "--hidden", "64", "32",
                           "--logdir", str(tmp_path)])
    path = _presets.write_config(args)
    assert path == tmp_path / "config.json"
    again = dqn.parse_args(["--config", str(path)])
    assert again == dataclasses.replace(args, config=str(path))
    assert again.hidden == (64, 32)  # a tuple again, as the flag gives it
    assert capsys.readouterr().out.endswith(f"config: {path} (its settings; the command line's flags win)\n")
    changed = dqn.parse_args(["--config", str(path), "--seed", "8"])
    assert changed.seed == 8 and changed.learning_rate == 6.3e-4


def test_a_config_of_another_baseline_or_no_config_is_refused(tmp_path):
    path = _presets.write_config(dataclasses.replace(ppo.Args(), logdir=str(tmp_path)))
    with pytest.raises(SystemExit, match=r"settings \['anneal', .* are not flags of this baseline"):
        dqn.parse_args(["--config", str(path)])
    with pytest.raises(SystemExit, match=r"expected a run's config\.json, got FileNotFoundError"):
        dqn.parse_args(["--config", str(tmp_path / "missing.json")])
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match=r"expected a run's config\.json \(an object"):
        dqn.parse_args(["--config", str(tmp_path / "list.json")])


def test_a_preset_file_with_a_flag_the_baseline_lacks_or_no_source_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(_presets, "PRESETS_DIR", tmp_path)
    (tmp_path / "dqn.yaml").write_text("CartPole-v1:\n  source: a test's own numbers\n  learning_rat: 0.1\n")
    with pytest.raises(ValueError, match=r"the preset of CartPole-v1 sets \['learning_rat'\], which are not flags"):
        dqn.parse_args([])
    (tmp_path / "dqn.yaml").write_text("CartPole-v1:\n  learning_rate: 0.1\n")
    with pytest.raises(ValueError, match="the preset of CartPole-v1 has no source"):
        dqn.parse_args([])
    for setting, value in [("learning_rate", "'fast'"), ("double_q", "1"), ("n_step", "3.0"), ("hidden", "64")]:
        (tmp_path / "dqn.yaml").write_text(f"CartPole-v1:\n  source: a test's own numbers\n  {setting}: {value}\n")
        with pytest.raises(ValueError, match=f"the preset of CartPole-v1 sets {setting} to .*; expected a value like"):
            dqn.parse_args([])
    (tmp_path / "dqn.yaml").write_text("CartPole-v1:\n  source: a test's own numbers\n  learning_rate: 1\n")
    assert dqn.parse_args([]).learning_rate == 1  # an int where a float is


def test_the_self_play_baseline_picks_its_preset_by_game(capsys):
    args = selfplay_dqn.parse_args(["--game", "tictactoe_v3"])
    assert args == dataclasses.replace(selfplay_dqn.Args(), game="tictactoe_v3")
    assert capsys.readouterr().out.startswith("preset: tictactoe_v3 (rlflow's defaults")
    with pytest.raises(SystemExit):
        selfplay_dqn.parse_args(["--list-presets"])
    assert "--game NAME applies NAME's" in capsys.readouterr().out
    selfplay_dqn.parse_args(["--game", "connect_four_v3"])
    assert capsys.readouterr().out.startswith("no preset for connect_four_v3: the defaults (presets: tictactoe_v3;")


def test_the_learning_benchmark_runs_a_preset_by_name(tmp_path, capsys):
    """benchmarks/learning.py's rlflow side, end to end on a short run: the preset's flags reach the baseline and
    the table and plot are written (SB3's side needs the bench extra)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        learning = importlib.import_module("learning")
    finally:
        sys.path.pop(0)
    assert learning.CONFIGS["dqn-acrobot"].rlflow == {"exploration_final_eps": 0.1}
    assert learning.CONFIGS["dqn-lunarlander"].rlflow["hidden"] == (256, 256)
    assert learning.main(["--configs", "dqn-acrobot", "--seeds", "0", "--steps", "500", "--no-sb3",
                          "--out", str(tmp_path)]) == 0
    table = (tmp_path / "learning.md").read_text()
    assert "| DQN | Acrobot-v1 | 500 | -100 |" in table and (tmp_path / "learning.png").exists()
    saved = json.loads((tmp_path / "dqn-Acrobot-v1-rlflow-0" / "config.json").read_text())
    assert saved["exploration_final_eps"] == 0.1 and saved["total_steps"] == 500
