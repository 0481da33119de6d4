"""Minibatch indices for on-policy rollouts ``[T, E, ...]`` (time, envs, ...).

- :func:`feedforward` shuffles single steps: each epoch yields ``(t, e)`` index arrays ``[M]`` covering
  every (valid) step exactly once.
- :func:`recurrent_chunks` cuts every lane (env) into chunks of ``L`` consecutive steps, never across
  lanes, and shuffles whole chunks: each epoch yields :class:`Chunks` with ``(t, e)`` indices ``[M, L]``,
  each chunk's first step (to take its initial RNN state from the states stored during the rollout) and a
  mask ``[M, L]`` for the last, partial chunk of a lane when ``T`` is not a multiple of ``L``.
- :func:`naive_recurrent` shuffles whole lanes: each epoch yields ``(t, e)`` indices ``[T, M]`` of ``M``
  whole lanes per minibatch, every lane exactly once (HARL's naive recurrent generator).
- :func:`take` gathers nested dicts (lists, tuples) of numpy arrays or torch tensors with those indices.
- :func:`feedforward_batches` is :func:`feedforward`'s epoch gathered: each leaf of a rollout taken once in
  the epoch's order, each minibatch a view of consecutive rows of that copy.

An agent axis ``[T, E, A, ...]`` comes along as data (the gathered leaves are ``[M, A, ...]``, one
minibatch holds all agents of a step, as MAPPO's shared critic wants), or becomes lanes: reshape every
array to ``[T, E * A, ...]`` and pass ``E * A`` (one RNN stream per agent, independent sampling).

Indices are built at the call, so a bad argument raises there, and one call is one epoch: call again
(with the same generator) for the next epoch.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow import _core
from rlflow.replay.sample import map_structure

__all__ = ["Chunks", "chunk_resets", "feedforward", "feedforward_batches", "naive_recurrent", "recurrent_chunks",
           "take"]


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def _numpy(x: Any) -> np.ndarray:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _permutation(values: int | np.ndarray, rng: np.random.Generator | int | None) -> np.ndarray:
    """``values`` (an int64 array, or ``arange(n)`` for an int) in a random order drawn from ``rng``: the
    generator's uniforms drive the compiled core's Fisher-Yates shuffle (``csrc/shuffle.h``)."""
    out = np.arange(values, dtype=np.int64) if isinstance(values, int) else np.array(values, np.int64)
    _core.shuffle(out, np.random.default_rng(rng).random(out.size))
    return out


def _split(n: int, k: int) -> list[tuple[int, int]]:
    """``[0, n)`` cut into ``k`` consecutive ranges ``[a, b)`` whose sizes differ by at most one (the longer
    first), as ``np.array_split`` cuts it, without its per-piece overhead."""
    size, longer = divmod(n, k)
    ends = [i * size + min(i, longer) for i in range(1, k + 1)]
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _time_and_lane(flat: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions ``t * E + e`` as ``(t, e)`` (an integer division, several times faster than
    ``np.divmod``)."""
    t = flat // E
    return t, flat - t * E


def feedforward(
    T: int,
    E: int,
    num_minibatches: int | None = None,
    *,
    minibatch_size: int | None = None,
    rng: np.random.Generator | int | None = None,
    mask: Any = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled minibatches of single steps.

    Args:
        T: the rollout's time steps.
        E: the rollout's envs (lanes).
        num_minibatches: split the valid steps into this many minibatches, whose sizes differ by at most
            one. Give this or ``minibatch_size``.
        minibatch_size: minibatches of this many steps; the last one holds the rest (may be smaller).
        rng: a numpy Generator, or a seed for one.
        mask: ``[T, E]`` bool (numpy or torch); only steps marked True are yielded.

    Returns:
        An iterator of ``(t, e)``: int64 arrays ``[M]``; ``take(rollout, (t, e))`` gives ``[M, ...]``.
    """
    order, bounds = _feedforward_order(T, E, num_minibatches, minibatch_size, rng, mask)
    return iter([_time_and_lane(order[a:b], E) for a, b in bounds])


def feedforward_batches(
    tree: Any,
    T: int,
    E: int,
    num_minibatches: int | None = None,
    *,
    minibatch_size: int | None = None,
    rng: np.random.Generator | int | None = None,
    mask: Any = None,
) -> Iterator[Any]:
    """One epoch of shuffled minibatches of single steps, gathered: the minibatches of
    ``take(tree, idx) for idx in feedforward(T, E, ...)`` (the same ones, from the same generator state),
    with each leaf gathered once in the epoch's order and each minibatch a view of consecutive rows of that
    copy: every step's bytes move once, in one gather per leaf rather than one per leaf and minibatch.

    Args:
        tree: numpy arrays or torch tensors ``[T, E, ...]`` (or longer on the time axis, e.g. ``T + 1``
            observations: steps past ``T`` are never taken) nested in dicts, lists and tuples (None stays None).
        T: the rollout's time steps.
        E: the rollout's envs (lanes).
        num_minibatches: as :func:`feedforward`'s (give this or ``minibatch_size``).
        minibatch_size: as :func:`feedforward`'s.
        rng: a numpy Generator, or a seed for one.
        mask: ``[T, E]`` bool (numpy or torch); only steps marked True are taken.

    Returns:
        An iterator of trees of ``[M, ...]`` leaves (views of one copy, made at the call).
    """
    order, bounds = _feedforward_order(T, E, num_minibatches, minibatch_size, rng, mask)
    # the order is the flat rows of the [T, E] leaves; (t, e) is made only if a leaf needs it
    whole = _take(tree, lambda: _time_and_lane(order, E), 2, {(T, E): order})
    return iter([map_structure(lambda leaf, a=a, b=b: leaf[a:b], whole) for a, b in bounds])


def _feedforward_order(T: int, E: int, num_minibatches: int | None, minibatch_size: int | None,
                       rng: np.random.Generator | int | None, mask: Any) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The epoch's order of the valid steps' flat positions ``t * E + e``, and each minibatch's ``[a, b)`` in it."""
    T, E = _positive("T", T), _positive("E", E)
    if (num_minibatches is None) == (minibatch_size is None):
        raise ValueError(f"expected exactly one of num_minibatches and minibatch_size, "
                         f"got num_minibatches={num_minibatches!r} and minibatch_size={minibatch_size!r}")
    if mask is None:
        # permutation(n) shuffles arange(n): the same order as the masked path with all True
        valid: int | np.ndarray = T * E
    else:
        m = _numpy(mask)
        if m.shape != (T, E):
            raise ValueError(f"mask: expected shape ({T}, {E}), got {m.shape}")
        valid = np.flatnonzero(m.astype(bool))
    order = _permutation(valid, rng)
    if num_minibatches is not None:
        k = _positive("num_minibatches", num_minibatches)
        if k > order.size:
            raise ValueError(f"num_minibatches: expected at most the {order.size} valid steps, got {k}")
        return order, _split(order.size, k)
    size = _positive("minibatch_size", minibatch_size)
    return order, [(i, min(i + size, order.size)) for i in range(0, order.size, size)]


def naive_recurrent(T: int, E: int, num_minibatches: int, *, rng: np.random.Generator | int | None = None
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled minibatches of whole lanes, for recurrent policies run over the full rollout.

    The ``E`` lanes are shuffled and split into ``num_minibatches`` groups whose sizes differ by at most one;
    each minibatch is ``(t, e)``, int64 ``[T, M]`` (time-major: column ``j`` is lane ``e[0, j]`` from step 0
    to ``T - 1``), so ``take(rollout, (t, e))`` gives ``[T, M, ...]`` and the initial RNN states are
    ``take(rnn_states, (t[0], e[0]))``.
    """
    T, E = _positive("T", T), _positive("E", E)
    k = _positive("num_minibatches", num_minibatches)
    if k > E:
        raise ValueError(f"num_minibatches: expected at most the {E} lanes, got {k}")
    order = _permutation(E, rng)
    steps = np.arange(T)[:, None]
    lanes = [order[a:b] for a, b in _split(order.size, k)]
    return iter([(np.broadcast_to(steps, (T, b.size)).copy(), np.broadcast_to(b, (T, b.size)).copy()) for b in lanes])


@dataclass(frozen=True)
class Chunks:
    """One minibatch of ``M`` chunks of ``L`` steps.

    Attributes:
        index: ``(t, e)``, int64 ``[M, L]``: the steps of each chunk, all in lane ``e[i, 0]``. Past the
            rollout's end ``t`` repeats the lane's last step (and ``mask`` is False).
        start: ``(t, e)``, int64 ``[M]``: each chunk's first step; ``take(rnn_states, chunks.start)`` gives
            the initial RNN state of every chunk from the states stored during the rollout.
        mask: ``[M, L]`` bool, False past the rollout's end.
    """

    index: tuple[np.ndarray, np.ndarray]
    start: tuple[np.ndarray, np.ndarray]
    mask: np.ndarray


def recurrent_chunks(
    T: int, E: int, chunk_length: int, num_minibatches: int, *, rng: np.random.Generator | int | None = None
) -> Iterator[Chunks]:
    """One epoch of shuffled minibatches of chunks of consecutive steps, for recurrent policies.

    Each lane is cut at ``0, L, 2L, ...`` into ``ceil(T / L)`` chunks (the last is partial when ``L`` does
    not divide ``T``); the ``E * ceil(T / L)`` chunks are shuffled and split into ``num_minibatches``
    minibatches whose sizes differ by at most one. Chunks may contain episode starts: reset the RNN state
    there (:func:`chunk_resets`).

    Args:
        T: the rollout's time steps.
        E: the rollout's envs (lanes).
        chunk_length: ``L``, steps per chunk.
        num_minibatches: at most the number of chunks.
        rng: a numpy Generator, or a seed for one.

    Returns:
        An iterator of :class:`Chunks`.
    """
    T, E, L = _positive("T", T), _positive("E", E), _positive("chunk_length", chunk_length)
    k = _positive("num_minibatches", num_minibatches)
    per_lane = -(-T // L)
    if k > E * per_lane:
        raise ValueError(f"num_minibatches: expected at most the {E * per_lane} chunks "
                         f"({E} lanes x ceil({T} / {L})), got {k}")
    order = _permutation(E * per_lane, rng)
    out = []
    for a, z in _split(order.size, k):
        b = order[a:z]
        t0, e0 = (b % per_lane) * L, b // per_lane
        t = t0[:, None] + np.arange(L)
        e = np.broadcast_to(e0[:, None], t.shape).copy()
        out.append(Chunks((np.minimum(t, T - 1), e), (t0, e0), t < T))
    return iter(out)


def chunk_resets(first: Any, chunks: Chunks) -> Any:
    """``[M, L]`` bool: where to reset the RNN state to the initial state before processing a step.

    ``first [T, E]`` marks steps that start an episode (``first[t] = terminated[t-1] | truncated[t-1]``
    for ``t > 0``, and at ``t = 0`` whether the rollout's first step starts one). A reset at a chunk's
    first step is harmless when the stored state there is already the reset state. Returns the type of
    ``first`` (numpy or torch, on its device); False where ``chunks.mask`` is.
    """
    got = take(first, chunks.index)
    if isinstance(got, np.ndarray):
        return got & chunks.mask
    return got & sys.modules["torch"].as_tensor(chunks.mask, device=got.device)


def _flat_rows(index: tuple[np.ndarray, ...], lead: tuple[int, ...]) -> np.ndarray | None:
    """The flat row positions of ``index`` into leading axes ``lead`` (``np.ravel_multi_index``), or None where
    numpy's own indexing must decide: negative or boolean indices (counted from the end or masks there) and
    out-of-range ones (its IndexError)."""
    try:
        return np.ravel_multi_index(index, lead)
    except (TypeError, ValueError):
        return None


def take(tree: Any, index: Any) -> Any:
    """Gather every leaf of nested dicts/lists/tuples: ``leaf[index]``.

    Args:
        tree: numpy arrays or torch tensors, nested in dicts, lists and tuples (NamedTuples kept; None stays
            None).
        index: a tuple of integer arrays indexing the leading axes, e.g. ``(t, e)`` from the iterators.
            Torch leaves are indexed with the indices moved to their device.

    Returns:
        The same nesting, each leaf ``leaf[index]`` (a copy).
    """
    index = tuple(index) if isinstance(index, tuple | list) else (index,)
    return _take(tree, lambda: index, len(index), {})


def _take(tree: Any, make_index: Any, k: int, flat_index: dict[tuple[int, ...], Any]) -> Any:
    """:func:`take` of the index ``make_index()`` returns (a tuple of ``k`` arrays), made only when a leaf
    needs it: a torch leaf, a numpy leaf not C-contiguous, or one whose leading shape ``flat_index`` lacks
    (``flat_index`` maps leading shapes to the index's flat row positions, ``{(T, E): t * E + e}``, or None
    where numpy's indexing must decide; the caller gives those it knows, the others are added)."""
    torch = sys.modules.get("torch")
    as_numpy: list[tuple[np.ndarray, ...]] = []  # the index as numpy arrays, once made
    on_device: dict[Any, tuple[Any, ...]] = {}  # the index per torch device

    def numpy_index() -> tuple[np.ndarray, ...]:
        if not as_numpy:
            as_numpy.append(tuple(_numpy(i) for i in make_index()))
        return as_numpy[0]

    def gather(node: Any) -> Any:
        if isinstance(node, np.ndarray):  # the leaves first: most of the calls
            if k == 1 and node.ndim and numpy_index()[0].dtype.kind in "iu":  # rows: np.take (faster)
                return node.take(numpy_index()[0], axis=0)
            if 1 < k <= node.ndim:  # whole rows, one np.take of their flat positions where in range
                lead = node.shape[:k]
                flat = flat_index.get(lead, False)
                if flat is False:
                    flat = flat_index[lead] = _flat_rows(numpy_index(), lead)
                if flat is not None and node.flags.c_contiguous:
                    return node.reshape((-1, *node.shape[k:])).take(flat, axis=0)
            return node[numpy_index()]
        if isinstance(node, dict):
            return {key: gather(v) for key, v in node.items()}
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            return type(node)(*(gather(v) for v in node))
        if isinstance(node, tuple | list):
            return type(node)(gather(v) for v in node)
        if node is None:
            return None
        if torch is not None and isinstance(node, torch.Tensor):
            if node.device not in on_device:
                on_device[node.device] = tuple(torch.as_tensor(i, device=node.device) for i in make_index())
            return node[on_device[node.device]]
        raise TypeError(f"take: expected numpy arrays or torch tensors in nested dicts/lists/tuples, "
                        f"got {type(node).__name__}")

    return gather(tree)
