"""Where the loop's metrics go: CSV files, TensorBoard, or both.

A logger receives rows of numbers under a *stream* name (``"train"`` for episodes, ``"learner"`` for
learner steps, ``"eval"`` for evaluations), each with the env step it belongs to::

    logger = make_logger("runs/dqn")            # CSV and TensorBoard under runs/dqn
    logger.write("train", 10_000, {"return": 187.5, "length": 187})
    logger.close()

:class:`CsvLogger` writes one file per stream, ``<logdir>/<stream>.csv``, with a header of ``step`` and
the keys of the first row; a later row with new keys rewrites the file with the wider header (earlier
rows get empty cells). Integers (Python's, numpy's, and bools as 0 and 1) are written as integers,
every other value as a float. :class:`TensorBoardLogger` writes scalars ``<stream>/<key>`` with
``torch.utils.tensorboard``.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

__all__ = ["CsvLogger", "Logger", "MultiLogger", "TensorBoardLogger", "WandbLogger", "make_logger", "read_csv"]


class Logger(Protocol):
    """What the loop logs to: a :class:`CsvLogger`, a :class:`TensorBoardLogger`, several at once
    (:class:`MultiLogger`), or any object of your own with these two methods."""

    def write(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` of ``stream`` at env step ``step``."""

    def close(self) -> None:
        """Flush and release files."""


class CsvLogger:
    """One CSV file per stream under ``logdir`` (see the module docstring).

    ``resume_at``: continue files written before, keeping their rows up to that env step (a run resumed
    from a checkpoint drops what it logged after the checkpoint); ``None`` starts new files.
    """

    def __init__(self, logdir: str | Path, *, resume_at: int | None = None) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, Any] = {}
        self._writers: dict[str, csv.DictWriter] = {}
        self._resume_at = resume_at

    def write(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": int(step), **{k: _cell(v) for k, v in metrics.items()}}
        writer = self._writers.get(stream)
        if writer is None or not set(row) <= set(writer.fieldnames):
            writer = self._open(stream, row)
        writer.writerow(row)
        self._files[stream].flush()

    def _open(self, stream: str, row: Mapping[str, Any]) -> csv.DictWriter:
        path = self.logdir / f"{stream}.csv"
        old: list[dict[str, str]] = []
        fields = ["step"]
        if stream in self._files:  # new keys: rewrite the file with the wider header
            self._files.pop(stream).close()
            old, fields = read_csv(path), list(self._writers[stream].fieldnames)
        elif self._resume_at is not None and path.exists():  # a resumed run: keep the rows up to its start
            old = [r for r in read_csv(path) if int(r["step"]) <= self._resume_at]
            with path.open(newline="") as f:
                fields = next(csv.reader(f), []) or ["step"]
        fields += [k for k in row if k not in fields]
        f = path.open("w", newline="")
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(old)
        self._files[stream], self._writers[stream] = f, writer
        return writer

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self._writers.clear()


def _cell(value: Any) -> int | float:
    """A CSV cell: integers (bools as 0 and 1) as they are, anything else as a float."""
    import numpy as np

    if isinstance(value, int | np.integer | np.bool_):
        return int(value)
    return float(value)


class TensorBoardLogger:
    """Scalars ``<stream>/<key>`` in a TensorBoard event file under ``logdir``."""

    def __init__(self, logdir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(logdir))

    def write(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(f"{stream}/{key}", float(value), int(step))

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """Rows to Weights & Biases (``pip install "rlflow[wandb]"``): each metric as ``<stream>/<key>``, plotted
    against ``env_step``.

    It is an observer of a run (``rlflow.run(..., observers=[WandbLogger(project="cartpole")])``) as well as
    a :class:`Logger`. Every metric is defined against the ``env_step`` metric it logs with each row, so rows
    that come late (a distributed run's evaluations, logged at the env step they were asked at) land at
    their own step instead of being dropped. :meth:`close` finishes the W&B run.

    Args:
        project: the W&B project.
        name: the run's name in W&B (None: W&B picks one).
        config: the run's settings, shown and searchable in W&B (e.g. a baseline's flags).
        dir: where W&B writes its files (None: ``./wandb``).
        mode: ``"online"``, ``"offline"`` (written locally, ``wandb sync`` uploads it later) or ``"disabled"``;
            None: W&B's default (the ``WANDB_MODE`` environment variable, else online).
        run: an existing W&B run to log to, instead of starting one (the other arguments are then unused).
        **init_options: further keywords of ``wandb.init`` (``entity``, ``group``, ``tags``, ...).
    """

    def __init__(self, project: str | None = None, *, name: str | None = None,
                 config: Mapping[str, Any] | None = None, dir: str | Path | None = None,
                 mode: Literal["online", "offline", "disabled"] | None = None, run: Any = None,
                 **init_options: Any) -> None:
        if run is None:
            try:
                import wandb
            except ImportError:
                raise ImportError('WandbLogger needs the wandb package: pip install "rlflow[wandb]"') from None
            run = wandb.init(project=project, name=name, config=dict(config or {}),
                             dir=None if dir is None else str(dir), mode=mode, **init_options)
        self.run = run
        run.define_metric("env_step")
        run.define_metric("*", step_metric="env_step")

    def write(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({"env_step": int(step), **{f"{stream}/{key}": _cell(v) for key, v in metrics.items()}})

    def __call__(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        """As an observer of a run: the same as :meth:`write`."""
        self.write(stream, step, metrics)

    def close(self) -> None:
        """Finish the W&B run (uploads what is left; an offline run is complete on disk)."""
        self.run.finish()


class MultiLogger:
    """Writes every row to each of ``loggers``."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        self.loggers = list(loggers)

    def write(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        for logger in self.loggers:
            logger.write(stream, step, metrics)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def make_logger(logdir: str | Path | None, *, tensorboard: bool = True, resume_at: int | None = None) -> MultiLogger:
    """CSV (and TensorBoard unless ``tensorboard=False``) under ``logdir``; no logger for ``None``.

    ``resume_at``: see :class:`CsvLogger`.
    """
    if logdir is None:
        return MultiLogger([])
    loggers: list[Logger] = [CsvLogger(logdir, resume_at=resume_at)]
    if tensorboard:
        loggers.append(TensorBoardLogger(logdir))
    return MultiLogger(loggers)


def read_csv(path: str | Path) -> list[dict[str, str]]:
    """The rows of a CSV file written by :class:`CsvLogger` (values as strings; empty cells as '')."""
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def evaluation_line(env_steps: int, mean: float, std: float, episodes: int) -> str:
    """The line a run prints for an evaluation of ``episodes`` episodes."""
    return f"eval at {env_steps} env steps: mean return {mean:.2f} (std {std:.2f}) over {episodes} episodes"


# Seconds between a progress bar's redraws when its output is a file or a pipe, not a terminal: each redraw
# then adds a line to the log, so a run logs its progress a few times a minute instead of ten times a second.
PROGRESS_LOG_INTERVAL = 30.0


def progress_bar(total: int, *, initial: int = 0, unit: str = "step", enabled: bool = True) -> Any:
    """The run's progress bar (tqdm): counts as integers, redrawn at most every
    :data:`PROGRESS_LOG_INTERVAL` seconds when standard error is not a terminal (a log file)."""
    import sys

    from tqdm.auto import tqdm

    stream = sys.stderr
    interactive = hasattr(stream, "isatty") and stream.isatty()
    interval = 0.1 if interactive else PROGRESS_LOG_INTERVAL
    return tqdm(total=int(total), initial=int(initial), unit=unit, disable=not enabled, dynamic_ncols=interactive,
                mininterval=interval, maxinterval=max(10.0, interval), file=stream)
