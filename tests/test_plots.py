"""plot_run: training episodes, their running mean, evaluations in a band of one standard deviation, a title."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np

import rlflow
from rlflow.plots import figure


def result(evaluations):
    episodes = [(10 * i, float(i % 7), 5) for i in range(1, 41)]
    return rlflow.RunResult(env_steps=400, learner_steps=12_345, episodes=episodes, evaluations=evaluations)


def test_evaluations_are_drawn_in_a_band_of_one_standard_deviation():
    fig = figure(result([(100, 2.0, 0.5), (200, 4.0, 1.0), (400, 3.0, 0.0)]), window=4)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"training episode", "training, mean of 4", "evaluation (mean)"}
    assert list(lines["evaluation (mean)"].get_xdata()) == [100, 200, 400]
    assert list(lines["evaluation (mean)"].get_ydata()) == [2.0, 4.0, 3.0]
    np.testing.assert_allclose(lines["training, mean of 4"].get_ydata()[0], np.mean([1, 2, 3, 4]))
    (band,) = ax.collections
    verts = band.get_paths()[0].vertices
    lower = {(x, y) for x, y in verts[1:4]}  # fill_between traces the lower edge, then the upper one back
    upper = {(x, y) for x, y in verts[5:8]}
    assert lower == {(100, 1.5), (200, 3.0), (400, 3.0)} and upper == {(100, 2.5), (200, 5.0), (400, 3.0)}
    assert ax.get_title() == "400 env steps, 12,345 learner steps"  # a title for any run
    plt.close(fig)


def test_a_given_title_and_evaluations_without_a_spread():
    fig = figure(result([(100, 2.0, math.nan)]), title="DQN on CartPole-v1")
    ax = fig.axes[0]
    assert ax.get_title() == "DQN on CartPole-v1" and not ax.collections  # no std known: no band
    plt.close(fig)


def test_plot_run_writes_a_png(tmp_path):
    path = rlflow.plot_run(result([(100, 2.0, 0.5)]), tmp_path / "deep" / "curve.png")
    assert path == tmp_path / "deep" / "curve.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
