"""A run's learning curve as a PNG: training episode returns (and their running mean) and evaluations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_run"]


def plot_run(result: Any, path: str | Path, *, title: str | None = None, window: int = 20) -> Path:
    """Plot ``result`` (a :class:`rlflow.RunResult`) against env steps into ``path``; returns the path.

    Training episodes are dots with their running mean over ``window`` episodes; evaluations are a line
    with markers, in a band of one standard deviation of their episodes' returns. ``title`` defaults to the
    run's counts (``"12,000 env steps, 2,750 learner steps"``). Uses matplotlib's non-interactive Agg
    backend (no display needed).
    """
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = figure(result, title=title, window=window)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def figure(result: Any, *, title: str | None = None, window: int = 20) -> Any:
    """The matplotlib figure :func:`plot_run` saves (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if result.episodes:
        steps, returns = np.array([e[0] for e in result.episodes]), np.array([e[1] for e in result.episodes])
        ax.plot(steps, returns, ".", alpha=0.25, color="tab:blue", label="training episode")
        k = min(window, len(returns))
        mean = np.convolve(returns, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], mean, color="tab:blue", label=f"training, mean of {k}")
    if result.evaluations:
        steps, means, stds = (np.array(c, np.float64) for c in zip(*result.evaluations, strict=True))
        ax.plot(steps, means, "o-", color="tab:red", label="evaluation (mean)")
        if np.isfinite(stds).any():
            ax.fill_between(steps, means - stds, means + stds, color="tab:red", alpha=0.15, linewidth=0,
                            label="evaluation (mean +- std)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    if title is None:
        title = f"{result.env_steps:,} env steps, {result.learner_steps:,} learner steps"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    return fig
