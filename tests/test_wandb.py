"""WandbLogger: a run's rows to Weights & Biases, as an observer, each metric against env_step (offline here)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import rlflow
from rlflow import adders, envs
from rlflow.loggers import WandbLogger, read_csv
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform


class RecordingRun:
    """What WandbLogger calls on a W&B run, recorded."""

    def __init__(self) -> None:
        self.defined: list[tuple[str, dict]] = []
        self.rows: list[dict] = []
        self.finished = False

    def define_metric(self, name, **options):
        self.defined.append((name, options))

    def log(self, row):
        self.rows.append(dict(row))

    def finish(self):
        self.finished = True


class RandomPolicy(rlflow.Policy):
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 2, len(observation)), None, state


class MeanLearner(rlflow.Learner):
    def step(self, sample):
        return {"mean_reward": float(sample.data.reward.mean()), "steps": 1}


def small_run(logdir, logger):
    env = envs.make("CartPole-v1", num_envs=2, seed=0)
    store = StepStore(env.spec, capacity=2_000, lanes=2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(),
                  rate_limiter=SampleToInsertRatio(1.0, 50, error_buffer=100))
    adder = adders.NStepTransition(store, [table], n=1, discount=0.99)
    return rlflow.run(env, RandomPolicy(), MeanLearner(), adder, table, steps=400, batch_size=16,
                      eval_env=envs.make("CartPole-v1"), eval_every=200, eval_episodes=2, logdir=logdir,
                      log_every=100, progress=False, seed=1, observers=[logger])


def test_every_row_of_every_stream_reaches_wandb_against_env_step(tmp_path):
    run = RecordingRun()
    logger = WandbLogger(run=run)
    result = small_run(tmp_path, logger)
    logger.close()
    assert run.defined == [("env_step", {}), ("*", {"step_metric": "env_step"})] and run.finished
    for stream in ("train", "learner", "eval"):
        rows = read_csv(tmp_path / f"{stream}.csv")
        logged = [r for r in run.rows if any(k.startswith(f"{stream}/") for k in r)]
        assert rows and len(logged) == len(rows)
        for csv_row, row in zip(rows, logged, strict=True):
            assert row["env_step"] == int(csv_row["step"])
            assert {k: str(v) for k, v in row.items() if k != "env_step"} == {
                f"{stream}/{k}": v for k, v in csv_row.items() if k != "step"}  # the same cells, integers kept
    assert [(r["env_step"], r["eval/return"]) for r in run.rows if "eval/return" in r] == [
        e[:2] for e in result.evaluations]


def test_an_offline_wandb_run_gets_the_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="rlflow-tests", mode="offline", dir=tmp_path, config={"seed": 1})
    result = small_run(tmp_path / "logs", logger)
    summary = dict(logger.run.summary)
    assert logger.run.config["seed"] == 1
    logger.close()
    assert (summary["eval/return"], summary["eval/return_std"]) == result.evaluations[-1][1:]
    assert summary["env_step"] == result.env_steps
    assert summary["train/length"] == result.episodes[-1][2] and isinstance(summary["train/length"], int)
    assert len(list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))) == 1


def test_without_wandb_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r'pip install "rlflow\[wandb\]"'):
        WandbLogger(project="x")


def test_a_baseline_logs_to_wandb_with_its_flags_as_config(tmp_path, monkeypatch):
    import dataclasses

    from baselines import dqn, wandb_logger_of

    monkeypatch.setenv("WANDB_SILENT", "true")
    args = dqn.Args(total_steps=300, learning_starts=100, samples_per_insert=4.0, batch_size=16, hidden=(8,),
                    eval_every=300, eval_episodes=1, logdir=str(tmp_path / "run"), progress=False,
                    wandb_project="rlflow-tests", wandb_mode="offline")
    logger = wandb_logger_of("DQN", args)
    assert logger.run.name == "DQN-CartPole-v1-seed1" and logger.run.config["hidden"] == [8]
    logger.close()
    result = dqn.main(args)
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert result.evaluations and len(runs) == 2  # the probe above and the baseline's own run
    assert wandb_logger_of("DQN", dataclasses.replace(args, wandb_project=None)) is None
