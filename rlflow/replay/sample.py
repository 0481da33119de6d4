"""Sample: what :meth:`rlflow.replay.Table.sample` returns."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

__all__ = ["Sample", "map_structure", "to_torch"]


def map_structure(fn: Any, tree: Any) -> Any:
    """Apply ``fn`` to every array leaf of nested dicts/tuples/lists (``None`` stays ``None``)."""
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {k: map_structure(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple such as Transition
        return type(tree)(*(map_structure(fn, v) for v in tree))
    if isinstance(tree, tuple | list):
        return type(tree)(map_structure(fn, v) for v in tree)
    return fn(tree)


def to_torch(tree: Any, device: Any = None, *, pin_memory: bool = False) -> Any:
    """Every numpy array in ``tree`` (nested dicts, tuples and lists; ``None`` stays ``None``) as a torch tensor,
    sharing memory with the array when it stays on the CPU (a non-contiguous array is copied).

    ``pin_memory`` copies into page-locked memory (for fast, asynchronous host-to-GPU copies); with a CUDA
    ``device`` the copy is then made with ``non_blocking=True``. :meth:`Sample.to_torch` converts a sample so.
    """
    import torch

    if pin_memory and not torch.cuda.is_available():
        raise RuntimeError("pin_memory=True needs a CUDA device and a CUDA build of torch; none is available "
                           "(pass pin_memory=False)")

    def convert(a: Any) -> Any:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if pin_memory:
            t = t.pin_memory()
        if device is not None:
            t = t.to(device, non_blocking=pin_memory)
        return t

    return map_structure(convert, tree)


@dataclass
class Sample:
    """A batch of ``B`` items.

    Attributes:
        keys: ``[B]`` int64 item keys (pass them to ``update_priorities``).
        probabilities: ``[B]`` float64, the probability with which each item was drawn, over the items
            in the table at its draw (an item that reached ``max_times_sampled`` earlier in the batch
            is out); 1.0 for deterministic selectors.
        weights: ``[B]`` float32 importance weights (1.0 unless the sampler is prioritized).
        times_sampled: ``[B]`` int64, how many times each item has been sampled, this draw included.
        lanes, starts, lengths: ``[B]`` int64, each item's window of rows.
        data: the batch, shaped by the table's item view (:mod:`rlflow.replay.views`): without one,
            the window's rows in the store's spec nesting, each leaf ``[B, L, ...]``; a
            :class:`~rlflow.replay.views.Transition` for transition items; ``[B, L, ...]`` for
            sequences; padded or ragged episodes.
        mask: ``[B, L]`` bool, True where a row belongs to the window (and its episode); ``None`` for
            transitions and ragged episodes.
        fields: the item fields in the table's ``item_spec`` nesting, each leaf ``[B, ...]``
            (``None`` when the table has no item fields).
    """

    keys: Any
    probabilities: Any
    weights: Any
    times_sampled: Any
    lanes: Any
    starts: Any
    lengths: Any
    data: Any
    mask: Any
    fields: Any = None

    def __len__(self) -> int:
        return len(self.keys)

    def copy(self) -> Sample:
        """The same sample with every array a writable copy (a sample received from another process comes as
        read-only views of Ray's object store)."""
        return replace(self, **{f.name: map_structure(np.array, getattr(self, f.name)) for f in fields(self)})

    def to_torch(self, device: Any = None, *, pin_memory: bool = False) -> Sample:
        """The same sample as torch tensors (sharing memory with the numpy arrays when on the CPU): every field
        through :func:`to_torch`, with ``device`` and ``pin_memory``."""
        return replace(self, **{f.name: to_torch(getattr(self, f.name), device, pin_memory=pin_memory)
                                for f in fields(self)})
