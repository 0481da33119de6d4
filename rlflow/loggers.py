"""Where the loop's metrics go: CSV files, TensorBoard, or both.

A logger receives rows of floats under a *stream* name (``"train"`` for episodes, ``"learner"`` for
learner steps, ``"eval"`` for evaluations), each with the env step it belongs to::

    logger = make_logger("runs/dqn")            # CSV and TensorBoard under runs/dqn
    logger.write("eval", 10_000, {"return": 187.5, "length": 187.5})
    logger.close()

:class:`CsvLogger` writes one file per stream, ``<logdir>/<stream>.csv``, with a header of ``step`` and
the keys of the first row; a later row with new keys rewrites the file with the wider header (earlier
rows get empty cells). :class:`TensorBoardLogger` writes scalars ``<stream>/<key>`` with
``torch.utils.tensorboard``.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["CsvLogger", "Logger", "MultiLogger", "TensorBoardLogger", "make_logger", "read_csv"]


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
        row = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
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
                fields = next(csv.reader(f), None) or ["step"]
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

