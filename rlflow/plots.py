"""A run's learning curve as a PNG: training episode returns (and their running mean) and evaluations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_run"]


def plot_run(result: Any, path: str | Path, *, title: str = "", window: int = 20) -> Path:
    """Plot ``result`` (a :class:`rlflow.RunResult`) against env steps into ``path``; returns the path.

    Training episodes are dots with their running mean over ``window`` episodes; evaluations are a line
    with markers. Uses matplotlib's non-interactive Agg backend (no display needed).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    if result.episodes:
        steps, returns = np.array([e[0] for e in result.episodes]), np.array([e[1] for e in result.episodes])
        ax.plot(steps, returns, ".", alpha=0.25, color="tab:blue", label="training episode")
        k = min(window, len(returns))
        mean = np.convolve(returns, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], mean, color="tab:blue", label=f"training, mean of {k}")
    if result.evaluations:
        ax.plot(*zip(*result.evaluations, strict=True), "o-", color="tab:red", label="evaluation (mean)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
