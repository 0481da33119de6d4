"""Replay: step storage, tables of items, selectors, rate limiters and checkpoints."""

from rlflow.replay.checkpoint import CheckpointError, load, save
from rlflow.replay.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from rlflow.replay.row_table import RowTable
from rlflow.replay.sample import Sample
from rlflow.replay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform
from rlflow.replay.storage import StepStore
from rlflow.replay.table import RateLimitTimeout, Table, TableBase
from rlflow.replay.views import EpisodeView, ItemView, SequenceView, Transition, TransitionView

__all__ = [
    "CheckpointError",
    "EpisodeView",
    "Fifo",
    "ItemView",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "MinSize",
    "Prioritized",
    "Queue",
    "RateLimitTimeout",
    "RateLimiter",
    "RowTable",
    "Sample",
    "SampleToInsertRatio",
    "SequenceView",
    "Selector",
    "Stack",
    "StepStore",
    "Table",
    "TableBase",
    "Transition",
    "TransitionView",
    "Uniform",
    "load",
    "save",
]


def __getattr__(name: str) -> object:
    if name == "ReplayBuffer":  # it builds on the adders, above this package
        raise ImportError("rlflow.replay has no ReplayBuffer: it is rlflow.ReplayBuffer "
                          "(from rlflow import ReplayBuffer)")
    raise AttributeError(f"module 'rlflow.replay' has no attribute {name!r}")
