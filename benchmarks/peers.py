"""Peer side of the replay-buffer speed benchmark.

Each adapter drives one replay library (cpprb, TorchRL, Tianshou, Stable-Baselines3, flexibuff) through
the benchmark cases with that library's fastest public, documented API for the case, and the ``numpy``
adapter gives the physical limit: plain preallocated arrays doing nothing but the memory traffic.

Rules every adapter follows:

* The library is imported lazily inside the adapter, so a missing library only disables that adapter.
* Random input data is generated once per case (``get_pool``) outside the timed region; adapters convert
  it to their library's native input container (dicts of arrays, ``Batch``, tuples of tensors, ...) in
  ``setup`` and cycle through the converted items in ``run_once``.
* ``setup`` fills the buffer to capacity (untimed, in large batches where the library has a batch add),
  so every case, the add cases included, measures a full ring buffer in steady state.
* ``run_once`` is one timed operation: one add call, one sample, or one sample plus priority update.

Run ``python benchmarks/peers.py`` (in the peer venv, see README.md) for a table of medians.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

try:
    import torch
except ImportError:  # torch-based peers then report themselves unavailable
    torch = None  # type: ignore[assignment]
else:
    # One intra-op thread for every torch-based peer: the benchmark compares single-threaded buffer code,
    # and the numpy limit and the numpy-based peers run on one thread too.
    torch.set_num_threads(1)

# Prioritized replay parameters shared by every PER adapter.
PER_ALPHA = 0.6
PER_BETA = 0.4

# Rows in the pre-generated input pool per case kind (obs of row i is frame i, next_obs is frame i + 1).
VECTOR_POOL_ROWS = 16_384
PIXEL_POOL_ROWS = 1_024
# Distinct single transitions ``add_one`` cycles through (pre-converted per adapter).
ADD_ONE_CYCLE = 1_024
# Distinct vectors of fresh priorities the ``per`` case cycles through.
PRIORITY_CYCLE = 64
# Probability that a generated transition ends its episode.
DONE_PROBABILITY = 1e-3


@dataclass(frozen=True)
class Case:
    """One benchmark case: what is stored and which operation is timed."""

    name: str
    obs_shape: tuple[int, ...]
    obs_dtype: type[np.generic]
    act_dim: int
    act_dtype: type[np.generic]
    capacity: int
    batch: int  # transitions per add call (add cases) or per sample (sample cases)
    op: str  # "add", "sample" or "per"

    @property
    def obs_nbytes(self) -> int:
        """Bytes of one observation."""
        return int(np.prod(self.obs_shape)) * np.dtype(self.obs_dtype).itemsize

    @property
    def pixel(self) -> bool:
        """True for image observations (uint8 frames)."""
        return len(self.obs_shape) > 1


CASES: dict[str, Case] = {
    "add_one": Case("add_one", (17,), np.float32, 6, np.float32, 1_000_000, 1, "add"),
    "add_batch": Case("add_batch", (17,), np.float32, 6, np.float32, 1_000_000, 256, "add"),
    "sample": Case("sample", (17,), np.float32, 6, np.float32, 1_000_000, 256, "sample"),
    "per": Case("per", (17,), np.float32, 6, np.float32, 1_000_000, 256, "per"),
    "pixel": Case("pixel", (84, 84, 4), np.uint8, 1, np.int64, 100_000, 32, "sample"),
}


@dataclass
class Pool:
    """Pre-generated random input data that the adapters cycle through."""

    frames: npt.NDArray[Any]  # (rows + 1, *obs_shape): obs of row i is frames[i], next_obs is frames[i + 1]
    act: npt.NDArray[Any]  # (rows, act_dim)
    rew: npt.NDArray[np.float32]  # (rows,)
    done: npt.NDArray[np.bool_]  # (rows,)
    priorities: npt.NDArray[np.float32]  # (PRIORITY_CYCLE, batch), strictly positive
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = len(self.act)

    def obs(self, start: int, n: int) -> npt.NDArray[Any]:
        """Observations of rows [start, start + n) (a view)."""
        return self.frames[start : start + n]

    def next_obs(self, start: int, n: int) -> npt.NDArray[Any]:
        """Next observations of rows [start, start + n) (a view)."""
        return self.frames[start + 1 : start + n + 1]

    def n_batches(self, batch: int) -> int:
        """Number of distinct ``batch``-row slices the add cases cycle through."""
        return self.rows // batch


_POOLS: dict[str, Pool] = {}


def get_pool(case: Case) -> Pool:
    """The input pool of ``case``, generated once with a fixed seed."""
    pool = _POOLS.get(case.name)
    if pool is None:
        rng = np.random.default_rng(12_345)
        rows = PIXEL_POOL_ROWS if case.pixel else VECTOR_POOL_ROWS
        if case.pixel:
            frames = rng.integers(0, 256, size=(rows + 1, *case.obs_shape), dtype=np.uint8)
            act = rng.integers(0, 18, size=(rows, case.act_dim), dtype=np.int64)
        else:
            frames = rng.standard_normal((rows + 1, *case.obs_shape), dtype=np.float32)
            act = rng.uniform(-1.0, 1.0, size=(rows, case.act_dim)).astype(case.act_dtype)
        pool = Pool(
            frames=frames.astype(case.obs_dtype, copy=False),
            act=act,
            rew=rng.standard_normal(rows, dtype=np.float32),
            done=rng.random(rows) < DONE_PROBABILITY,
            priorities=rng.uniform(0.01, 2.0, size=(PRIORITY_CYCLE, case.batch)).astype(np.float32),
        )
        _POOLS[case.name] = pool
    return pool


def fill_chunks(total: int, chunk: int, pool_rows: int) -> Iterator[tuple[int, int]]:
    """(pool_start, n) slices covering ``total`` rows, at most ``chunk`` rows each, cycling the pool."""
    step = min(chunk, pool_rows)
    done = 0
    while done < total:
        n = min(step, total - done)
        yield 0, n
        done += n


def _import(module: str) -> tuple[Any, str | None]:
    """Import ``module``; return (module, None) or (None, reason)."""
    try:
        return importlib.import_module(module), None
    except Exception as exc:  # any import failure disables only this adapter
        return None, f"not installable: {type(exc).__name__}: {exc}"


class PeerAdapter(Protocol):
    """What the benchmark runner needs from one library."""

    name: str

    def available(self) -> str | None:
        """None if the library imports, else the reason it cannot be benchmarked."""
        ...

    def supports(self, case: Case) -> bool:
        """Whether the library has an API for ``case``."""
        ...

    def describe(self, case: Case) -> str:
        """The API used for ``case``, or why ``case`` is unsupported."""
        ...

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        """Build the buffer and fill it to capacity (not timed)."""
        ...

    def run_once(self, case: Case) -> None:
        """One timed operation."""
        ...

    def teardown(self) -> None:
        """Drop every reference to the buffer and its inputs."""
        ...


class _Base:
    """Shared cursor bookkeeping for cycling through pre-converted inputs."""

    name = "base"

    def __init__(self) -> None:
        self._step = 0
        self._items: list[Any] = []
        self._prios: list[Any] = []
        self.buf: Any = None

    def _next_item(self) -> Any:
        item = self._items[self._step % len(self._items)]
        self._step += 1
        return item

    def _next_prio(self) -> Any:
        return self._prios[self._step % len(self._prios)]

    def teardown(self) -> None:
        self.buf = None
        self._items = []
        self._prios = []
        self._step = 0


# ---------------------------------------------------------------------------------------------------------
# numpy: the physical limit
# ---------------------------------------------------------------------------------------------------------


class NumpyLimit(_Base):
    """Plain preallocated arrays: the memory traffic of each operation and nothing else.

    add: slice assignment of obs, act, rew, next_obs, done at a cursor.
    sample: ``rng.integers`` indices, then a fancy-index gather of obs, act, rew, next_obs, done.
    per: the same as sample: fresh uniform indices and the gather (the limit of sample + update is the
    gather of the same bytes; no priority bookkeeping at all). Indices are drawn fresh on every call
    because a small pre-drawn index pool would keep the gathered rows warm in the CPU cache.
    pixel: one copy of the frames; gather of obs[idx] and obs[idx + 1] (the next_obs) plus act, rew, done.
    """

    name = "numpy"

    def available(self) -> str | None:
        return None

    def supports(self, case: Case) -> bool:
        return True

    def describe(self, case: Case) -> str:
        if case.pixel:
            return "single frame array; gather obs[idx] and obs[idx+1]"
        return {
            "add": "slice assignment at a cursor",
            "sample": "rng.integers + fancy-index gather",
            "per": "rng.integers + fancy-index gather (no priority work)",
        }[case.op]

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        pool = get_pool(case)
        cap = case.capacity
        self._rng = rng
        self._cap = cap
        self._batch = case.batch
        self.obs = np.empty((cap, *case.obs_shape), dtype=case.obs_dtype)
        self.next_obs = None if case.pixel else np.empty((cap, *case.obs_shape), dtype=case.obs_dtype)
        self.act = np.empty((cap, case.act_dim), dtype=case.act_dtype)
        self.rew = np.empty(cap, dtype=np.float32)
        self.done = np.empty(cap, dtype=np.bool_)
        pos = 0
        for start, n in fill_chunks(cap, pool.rows, pool.rows):
            self.obs[pos : pos + n] = pool.obs(start, n)
            if self.next_obs is not None:
                self.next_obs[pos : pos + n] = pool.next_obs(start, n)
            self.act[pos : pos + n] = pool.act[start : start + n]
            self.rew[pos : pos + n] = pool.rew[start : start + n]
            self.done[pos : pos + n] = pool.done[start : start + n]
            pos += n
        self._cursor = 0
        if case.op == "add" and case.batch == 1:
            self._items = [
                (pool.frames[i], pool.act[i], pool.rew[i], pool.frames[i + 1], pool.done[i])
                for i in range(ADD_ONE_CYCLE)
            ]
        elif case.op == "add":
            b = case.batch
            self._items = [
                (
                    pool.obs(k * b, b),
                    pool.act[k * b : (k + 1) * b],
                    pool.rew[k * b : (k + 1) * b],
                    pool.next_obs(k * b, b),
                    pool.done[k * b : (k + 1) * b],
                )
                for k in range(pool.n_batches(b))
            ]

    def run_once(self, case: Case) -> None:
        if case.op == "add":
            obs, act, rew, next_obs, done = self._next_item()
            c = self._cursor
            n = self._batch
            if c + n > self._cap:
                c = 0
            if n == 1:
                self.obs[c] = obs
                self.act[c] = act
                self.rew[c] = rew
                self.next_obs[c] = next_obs  # type: ignore[index]
                self.done[c] = done
            else:
                self.obs[c : c + n] = obs
                self.act[c : c + n] = act
                self.rew[c : c + n] = rew
                self.next_obs[c : c + n] = next_obs  # type: ignore[index]
                self.done[c : c + n] = done
            self._cursor = c + n
            return
        if case.pixel:
            idx = self._rng.integers(0, self._cap - 1, self._batch)
            self._out = (self.obs[idx], self.act[idx], self.rew[idx], self.obs[idx + 1], self.done[idx])
        else:
            idx = self._rng.integers(0, self._cap, self._batch)
            self._out = (
                self.obs[idx],
                self.act[idx],
                self.rew[idx],
                self.next_obs[idx],  # type: ignore[index]
                self.done[idx],
            )

    def teardown(self) -> None:
        super().teardown()
        self.obs = self.next_obs = self.act = self.rew = self.done = None  # type: ignore[assignment]
        self._out = None


# ---------------------------------------------------------------------------------------------------------
# cpprb
# ---------------------------------------------------------------------------------------------------------


class CpprbAdapter(_Base):
    """cpprb: C++/Cython ring buffer (ReplayBuffer / PrioritizedReplayBuffer) fed with numpy arrays.

    add: ``rb.add(**transition)`` (one row or a batch of rows per call).
    sample: ``rb.sample(batch)`` -> dict of numpy copies.
    per: ``PrioritizedReplayBuffer(alpha=0.6).sample(batch, beta=0.4)`` (returns ``weights`` and
    ``indexes``) + ``update_priorities(indexes, priorities)``; segment trees in C++.
    pixel: ``next_of="obs"`` so next_obs shares the obs memory (one copy of the frames).
    """

    name = "cpprb"

    def available(self) -> str | None:
        return _import("cpprb")[1]

    def supports(self, case: Case) -> bool:
        return True

    def describe(self, case: Case) -> str:
        if case.pixel:
            return "ReplayBuffer(next_of='obs').sample"
        return {
            "add": "ReplayBuffer.add(**kwargs)",
            "sample": "ReplayBuffer.sample",
            "per": "PrioritizedReplayBuffer.sample(beta) + update_priorities",
        }[case.op]

    def _env_dict(self, case: Case) -> dict[str, dict[str, Any]]:
        env: dict[str, dict[str, Any]] = {
            "obs": {"shape": case.obs_shape, "dtype": case.obs_dtype},
            "act": {"shape": case.act_dim, "dtype": case.act_dtype},
            "rew": {"dtype": np.float32},
            "done": {"dtype": np.float32},
        }
        if not case.pixel:
            env["next_obs"] = {"shape": case.obs_shape, "dtype": case.obs_dtype}
        return env

    @staticmethod
    def _kwargs(pool: Pool, start: int, n: int) -> dict[str, Any]:
        return {
            "obs": pool.obs(start, n),
            "act": pool.act[start : start + n],
            "rew": pool.rew[start : start + n],
            "next_obs": pool.next_obs(start, n),
            "done": pool.done[start : start + n].astype(np.float32),
        }

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        cpprb = importlib.import_module("cpprb")
        pool = get_pool(case)
        if case.op == "per":
            self.buf = cpprb.PrioritizedReplayBuffer(case.capacity, self._env_dict(case), alpha=PER_ALPHA)
        elif case.pixel:
            self.buf = cpprb.ReplayBuffer(case.capacity, self._env_dict(case), next_of="obs")
        else:
            self.buf = cpprb.ReplayBuffer(case.capacity, self._env_dict(case))
        for start, n in fill_chunks(case.capacity, pool.rows, pool.rows):
            self.buf.add(**self._kwargs(pool, start, n))
        if case.op == "add" and case.batch == 1:
            self._items = [
                {
                    "obs": pool.frames[i],
                    "act": pool.act[i],
                    "rew": pool.rew[i],
                    "next_obs": pool.frames[i + 1],
                    "done": float(pool.done[i]),
                }
                for i in range(ADD_ONE_CYCLE)
            ]
        elif case.op == "add":
            b = case.batch
            self._items = [self._kwargs(pool, k * b, b) for k in range(pool.n_batches(b))]
        elif case.op == "per":
            self._prios = list(pool.priorities)

    def run_once(self, case: Case) -> None:
        if case.op == "add":
            self.buf.add(**self._next_item())
        elif case.op == "per":
            out = self.buf.sample(case.batch, beta=PER_BETA)
            self.buf.update_priorities(out["indexes"], self._next_prio())
            self._step += 1
        else:
            self.buf.sample(case.batch)


# ---------------------------------------------------------------------------------------------------------
# TorchRL
# ---------------------------------------------------------------------------------------------------------


class TorchRLAdapter(_Base):
    """TorchRL: ``ReplayBuffer(storage=LazyTensorStorage(capacity))`` holding a tuple (PyTree) of tensors.

    A flat tuple of tensors is TorchRL's fastest documented data layout here; a TensorDict in the usual
    nested ("next", ...) layout costs about twice as much per add.
    add: ``rb.add(transition)`` / ``rb.extend(batch)``.
    sample: ``rb.sample()`` (batch size fixed at construction) -> tuple of tensors (gathered copies).
    per: ``PrioritizedReplayBuffer(alpha, beta)``, ``rb.sample(return_info=True)`` (info holds ``index``
    and ``priority_weight``) + ``rb.update_priority(index, priority)``; needs the C++ extension
    ``torchrl._torchrl`` (segment trees).
    pixel: obs and next_obs are separate tensors (two copies of the frames).
    """

    name = "torchrl"

    def available(self) -> str | None:
        for module in ("tensordict", "torchrl"):
            reason = _import(module)[1]
            if reason is not None:
                return reason
        return None

    def _extension_error(self) -> str | None:
        try:
            importlib.import_module("torchrl._torchrl")
        except Exception as exc:  # wheel built against a different torch ABI
            return f"{type(exc).__name__}: {str(exc)[:120]}"
        return None

    def supports(self, case: Case) -> bool:
        return case.op != "per" or self._extension_error() is None

    def describe(self, case: Case) -> str:
        if case.op == "per":
            err = self._extension_error()
            if err is not None:
                return (
                    "unsupported here: PrioritizedSampler needs the torchrl C++ extension, which fails "
                    f"to load ({err}); rebuild it as in README.md"
                )
            return "PrioritizedReplayBuffer.sample(return_info=True) + update_priority"
        return {
            "add": "ReplayBuffer.add" if case.batch == 1 else "ReplayBuffer.extend",
            "sample": "ReplayBuffer.sample",
        }[case.op]

    def _tensors(self, pool: Pool, start: int, n: int) -> tuple[Any, ...]:
        t = torch
        return (
            t.from_numpy(pool.obs(start, n)),
            t.from_numpy(pool.act[start : start + n]),
            t.from_numpy(pool.rew[start : start + n]),
            t.from_numpy(pool.next_obs(start, n)),
            t.from_numpy(pool.done[start : start + n]),
        )

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        logging.getLogger("torchrl").setLevel(logging.WARNING)
        data = importlib.import_module("torchrl.data")
        pool = get_pool(case)
        storage = data.LazyTensorStorage(case.capacity, device="cpu")
        if case.op == "per":
            self.buf = data.PrioritizedReplayBuffer(
                alpha=PER_ALPHA, beta=PER_BETA, storage=storage, batch_size=case.batch
            )
        else:
            self.buf = data.ReplayBuffer(storage=storage, batch_size=case.batch)
        for start, n in fill_chunks(case.capacity, pool.rows, pool.rows):
            self.buf.extend(self._tensors(pool, start, n))
        if case.op == "add" and case.batch == 1:
            whole = self._tensors(pool, 0, ADD_ONE_CYCLE)
            self._items = [tuple(x[i] for x in whole) for i in range(ADD_ONE_CYCLE)]
        elif case.op == "add":
            b = case.batch
            self._items = [self._tensors(pool, k * b, b) for k in range(pool.n_batches(b))]
        elif case.op == "per":
            self._prios = [torch.from_numpy(p) for p in pool.priorities]

    def run_once(self, case: Case) -> None:
        if case.op == "add":
            if case.batch == 1:
                self.buf.add(self._next_item())
            else:
                self.buf.extend(self._next_item())
        elif case.op == "per":
            _, info = self.buf.sample(return_info=True)
            self.buf.update_priority(info["index"], self._next_prio())
            self._step += 1
        else:
            self.buf.sample()


# ---------------------------------------------------------------------------------------------------------
# Tianshou
# ---------------------------------------------------------------------------------------------------------


class TianshouAdapter(_Base):
    """Tianshou: ``ReplayBuffer`` / ``VectorReplayBuffer`` / ``PrioritizedReplayBuffer`` over ``Batch``.

    add_one: ``ReplayBuffer.add(Batch)`` (one transition).
    add_batch: ``VectorReplayBuffer(capacity, 256).add(Batch, buffer_ids=range(256))``: Tianshou's only
    batched add (one sub-buffer per env); it loops over the 256 sub-buffers in Python for bookkeeping.
    sample: ``ReplayBuffer.sample(batch)`` -> (Batch of numpy copies, indices).
    per: ``PrioritizedReplayBuffer(alpha, beta).sample`` (adds ``weight``) + ``update_weight``;
    numpy segment tree, vectorised.
    pixel: ``ignore_obs_next=True`` (next obs gathered from obs[next(idx)]: one copy of the frames).
    Fills: ``buffer.update(ReplayBuffer.from_data(...))`` for the 1M-row cases, single adds for pixel.
    """

    name = "tianshou"

    def available(self) -> str | None:
        return _import("tianshou.data")[1]

    def supports(self, case: Case) -> bool:
        return True

    def describe(self, case: Case) -> str:
        if case.pixel:
            return "ReplayBuffer(ignore_obs_next=True).sample"
        if case.op == "add":
            if case.batch == 1:
                return "ReplayBuffer.add(Batch)"
            return "VectorReplayBuffer.add(Batch, buffer_ids)"
        return {"sample": "ReplayBuffer.sample", "per": "PrioritizedReplayBuffer.sample + update_weight"}[case.op]

    @staticmethod
    def _batch(ts: Any, pool: Pool, start: int, n: int) -> Any:
        return ts.Batch(
            obs=pool.obs(start, n),
            act=pool.act[start : start + n],
            rew=pool.rew[start : start + n],
            terminated=pool.done[start : start + n],
            truncated=np.zeros(n, dtype=np.bool_),
            obs_next=pool.next_obs(start, n),
        )

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        ts = importlib.import_module("tianshou.data")
        pool = get_pool(case)
        cap = case.capacity
        if case.op == "add" and case.batch > 1:
            b = case.batch
            self.buf = ts.VectorReplayBuffer(cap, b)
            self._ids = np.arange(b)
            self._items = [self._batch(ts, pool, k * b, b) for k in range(pool.n_batches(b))]
            for _ in range(0, cap, b):
                self.buf.add(self._next_item(), buffer_ids=self._ids)
            return
        singles = [
            ts.Batch(
                obs=pool.frames[i],
                act=pool.act[i],
                rew=pool.rew[i],
                terminated=pool.done[i],
                truncated=False,
                obs_next=pool.frames[i + 1],
            )
            for i in range(ADD_ONE_CYCLE)
        ]
        if case.pixel:
            self.buf = ts.ReplayBuffer(cap, ignore_obs_next=True)
            for i in range(cap):
                self.buf.add(singles[i % ADD_ONE_CYCLE])
            return
        if case.op == "per":
            self.buf = ts.PrioritizedReplayBuffer(cap, alpha=PER_ALPHA, beta=PER_BETA)
            self._prios = list(pool.priorities)
        else:
            self.buf = ts.ReplayBuffer(cap)
        # Same dtypes as Tianshou's own add path allocates (reward as float, flags as bool).
        rew = pool.rew.astype(np.float64)
        trunc = np.zeros(pool.rows, dtype=np.bool_)
        source = ts.ReplayBuffer.from_data(
            pool.obs(0, pool.rows),
            pool.act,
            rew,
            pool.done,
            trunc,
            pool.done.copy(),
            pool.next_obs(0, pool.rows),
        )
        for _ in fill_chunks(cap, pool.rows, pool.rows):
            self.buf.update(source)
        if case.op == "add":
            self._items = singles

    def run_once(self, case: Case) -> None:
        if case.op == "add":
            if case.batch == 1:
                self.buf.add(self._next_item())
            else:
                self.buf.add(self._next_item(), buffer_ids=self._ids)
        elif case.op == "per":
            _, idx = self.buf.sample(case.batch)
            self.buf.update_weight(idx, self._next_prio())
            self._step += 1
        else:
            self.buf.sample(case.batch)


# ---------------------------------------------------------------------------------------------------------
# Stable-Baselines3
# ---------------------------------------------------------------------------------------------------------


class SB3Adapter(_Base):
    """Stable-Baselines3: ``stable_baselines3.common.buffers.ReplayBuffer`` (numpy storage, torch output).

    add_one: ``n_envs=1``, ``rb.add(obs, next_obs, action, reward, done, infos)``.
    add_batch: ``n_envs=256`` (SB3's vectorised-env layout), one ``add`` writes 256 rows.
    sample: ``n_envs=256`` buffer (filled with 256-row adds), ``rb.sample(batch)`` -> torch tensors; the
    gather is copied a second time into new tensors (``th.tensor``).
    per: no prioritized replay in SB3.
    pixel: ``n_envs=1``, ``optimize_memory_usage=True`` (next obs is obs[idx + 1]: one copy of the frames),
    which requires ``handle_timeout_termination=False``.
    """

    name = "sb3"

    def available(self) -> str | None:
        return _import("stable_baselines3.common.buffers")[1]

    def supports(self, case: Case) -> bool:
        return case.op != "per"

    def describe(self, case: Case) -> str:
        if case.op == "per":
            return "unsupported: Stable-Baselines3 has no prioritized replay buffer"
        if case.pixel:
            return "ReplayBuffer(optimize_memory_usage=True).sample"
        if case.op == "add":
            return "ReplayBuffer.add (n_envs=1)" if case.batch == 1 else "ReplayBuffer.add (n_envs=256)"
        return "ReplayBuffer.sample (n_envs=256)"

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        buffers = importlib.import_module("stable_baselines3.common.buffers")
        spaces = importlib.import_module("gymnasium.spaces")
        pool = get_pool(case)
        if case.pixel:
            obs_space = spaces.Box(0, 255, case.obs_shape, np.uint8)
            act_space = spaces.Discrete(18)
        else:
            obs_space = spaces.Box(-np.inf, np.inf, case.obs_shape, np.float32)
            act_space = spaces.Box(-1.0, 1.0, (case.act_dim,), np.float32)
        n_envs = 1 if (case.pixel or case.batch == 1) else 256
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.buf = buffers.ReplayBuffer(
                case.capacity,
                obs_space,
                act_space,
                device="cpu",
                n_envs=n_envs,
                optimize_memory_usage=case.pixel,
                handle_timeout_termination=not case.pixel,
            )
        infos = [{} for _ in range(n_envs)]
        if n_envs == 1:
            self._items = [
                (
                    pool.obs(i, 1),
                    pool.next_obs(i, 1),
                    pool.act[i : i + 1],
                    pool.rew[i : i + 1],
                    pool.done[i : i + 1],
                    infos,
                )
                for i in range(ADD_ONE_CYCLE)
            ]
        else:
            b = n_envs
            self._items = [
                (
                    pool.obs(k * b, b),
                    pool.next_obs(k * b, b),
                    pool.act[k * b : (k + 1) * b],
                    pool.rew[k * b : (k + 1) * b],
                    pool.done[k * b : (k + 1) * b],
                    infos,
                )
                for k in range(pool.n_batches(b))
            ]
        for _ in range(self.buf.buffer_size):
            self.buf.add(*self._next_item())

    def run_once(self, case: Case) -> None:
        if case.op == "add":
            self.buf.add(*self._next_item())
        else:
            self.buf.sample(case.batch)


# ---------------------------------------------------------------------------------------------------------
# flexibuff
# ---------------------------------------------------------------------------------------------------------


class FlexibuffAdapter(_Base):
    """flexibuff: ``FlexibleBuffer`` with obs, obs_, act, rew registered as global (single-agent) values.

    add: ``save_transition(terminated, registered_vals)``, one transition per call; flexibuff has no batch
    add, so add_batch is a Python loop of 256 calls and the fill is a loop of single adds.
    sample / pixel: ``sample_transitions(batch)`` -> FlexiBatch of numpy copies; indices come from
    ``np.random.choice(n, batch, replace=False)``, which permutes all n stored indices on every call.
    per: no prioritized replay (``memory_weights`` gives weighted sampling without priority updates,
    segment trees or importance weights).
    pixel: obs and obs_ are separate arrays (two copies of the frames).
    """

    name = "flexibuff"

    def available(self) -> str | None:
        return _import("flexibuff")[1]

    def supports(self, case: Case) -> bool:
        return case.op != "per"

    def describe(self, case: Case) -> str:
        if case.op == "per":
            return "unsupported: flexibuff has no prioritized replay"
        if case.op == "add":
            return "save_transition" if case.batch == 1 else "256 x save_transition (no batch add)"
        return "sample_transitions"

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        flexibuff = importlib.import_module("flexibuff")
        pool = get_pool(case)
        shape = list(case.obs_shape)
        self.buf = flexibuff.FlexibleBuffer(
            num_steps=case.capacity,
            n_agents=1,
            global_registered_vars={
                "obs": (shape, case.obs_dtype),
                "obs_": (shape, case.obs_dtype),
                "act": ([case.act_dim], case.act_dtype),
                "rew": (None, np.float32),
            },
            individual_registered_vars={},
            track_truncation=False,
        )
        self._items = [
            (
                bool(pool.done[i]),
                {"obs": pool.frames[i], "obs_": pool.frames[i + 1], "act": pool.act[i], "rew": pool.rew[i]},
            )
            for i in range(ADD_ONE_CYCLE)
        ]
        save = self.buf.save_transition
        for i in range(case.capacity):
            terminated, vals = self._items[i % ADD_ONE_CYCLE]
            save(terminated=terminated, registered_vals=vals)

    def run_once(self, case: Case) -> None:
        if case.op == "add":
            save = self.buf.save_transition
            for _ in range(case.batch):
                terminated, vals = self._next_item()
                save(terminated=terminated, registered_vals=vals)
        else:
            self.buf.sample_transitions(case.batch, as_torch=False)


ADAPTERS: dict[str, type[_Base]] = {
    "numpy": NumpyLimit,
    "cpprb": CpprbAdapter,
    "torchrl": TorchRLAdapter,
    "tianshou": TianshouAdapter,
    "sb3": SB3Adapter,
    "flexibuff": FlexibuffAdapter,
}


def time_adapter(
    adapter: PeerAdapter,
    case: Case,
    repeats: int = 7,
    inner: int | None = None,
    target_s: float = 0.1,
    warmup: int = 3,
) -> list[float]:
    """Seconds per operation, one entry per repeat; each repeat times ``inner`` calls of ``run_once``.

    The adapter must already be set up. After ``warmup`` untimed calls, ``inner`` (when None) is chosen
    so that one repeat lasts about ``target_s`` seconds.
    """
    for _ in range(warmup):
        adapter.run_once(case)
    if inner is None:
        n = 0
        t0 = time.perf_counter()
        while True:
            adapter.run_once(case)
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= target_s / 5 or n >= 20_000:
                break
        inner = max(1, min(200_000, round(target_s / (elapsed / n))))
    out: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            adapter.run_once(case)
        out.append((time.perf_counter() - t0) / inner)
    return out


def rss_bytes() -> int:
    """Resident set size of this process (psutil)."""
    psutil = importlib.import_module("psutil")
    return int(psutil.Process().memory_info().rss)


def huge_page_bytes() -> int | None:
    """Anonymous transparent-huge-page memory of this process (Linux), None where unknown.

    Random gathers from a buffer backed by 2 MiB pages miss the TLB far less than from 4 KiB pages, so
    this is reported next to every timing: numpy asks the kernel for huge pages on large arrays, torch's
    allocator does not, and under memory fragmentation the kernel may not provide them at all.
    """
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Result:
    """One (case, peer) measurement, or the reason there is none."""

    case: str
    peer: str
    times: list[float] = field(default_factory=list)
    rss_growth: int | None = None
    huge_growth: int | None = None
    setup_s: float = 0.0
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def best(self) -> float | None:
        return min(self.times) if self.times else None


def warm_allocator() -> None:
    """Put glibc malloc into the state of a long-running process before anything is timed.

    glibc serves allocations above a dynamic threshold (128 KiB at start) with fresh mmap pages, and
    raises the threshold (up to 32 MiB) when such a block is freed. Until then every sampled batch larger
    than the threshold (a 32-frame pixel batch is 0.9 MB) pays page faults and zeroing, so whichever peer
    happens to run first in a process looks several times slower. Freeing one ~30 MiB block up front
    raises the threshold once, for every peer alike.
    """
    block = np.ones(30 * 2**20, dtype=np.uint8)
    del block


def run_case(adapter: PeerAdapter, case: Case, repeats: int, target_s: float, seed: int = 0) -> Result:
    """Set up, time and tear down one adapter on one case; RSS growth is measured across the fill."""
    res = Result(case.name, adapter.name)
    reason = adapter.available()
    if reason is not None:
        res.note = reason
        return res
    if not adapter.supports(case):
        res.note = adapter.describe(case)
        return res
    get_pool(case)
    warm_allocator()
    gc.collect()
    before = rss_bytes()
    huge_before = huge_page_bytes()
    t0 = time.perf_counter()
    try:
        adapter.setup(case, np.random.default_rng(seed))
        res.setup_s = time.perf_counter() - t0
        res.rss_growth = rss_bytes() - before
        huge_after = huge_page_bytes()
        if huge_before is not None and huge_after is not None:
            res.huge_growth = huge_after - huge_before
        res.times = time_adapter(adapter, case, repeats=repeats, target_s=target_s)
        res.note = adapter.describe(case)
    except Exception as exc:  # a peer failing on one case is reported, not fatal
        res.note = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        adapter.teardown()
        gc.collect()
    return res


def format_table(results: list[Result]) -> str:
    """Medians (and best repeat) in microseconds, ratio to the numpy limit, fill time and memory.

    ``RSS`` is the resident-memory growth across ``setup`` (pixel case: also as a multiple of one copy of
    the observations); ``THP`` is the share of that growth backed by transparent huge pages.
    """
    limit = {r.case: r.median for r in results if r.peer == "numpy" and r.median}
    header = (
        f"{'case':<10} {'peer':<10} {'median us':>10} {'best us':>10} {'x numpy':>8} {'fill s':>7} "
        f"{'RSS':>18} {'THP':>5}"
    )
    lines = [f"{header}  api / note", "-" * 120]
    for r in results:
        med = r.median
        case = CASES[r.case]
        if med is None or r.best is None:
            lines.append(
                f"{r.case:<10} {r.peer:<10} {'-':>10} {'-':>10} {'-':>8} {'-':>7} {'-':>18} {'-':>5}  {r.note}"
            )
            continue
        ratio = f"{med / limit[r.case]:.1f}x" if r.case in limit else "-"
        rss = "-"
        thp = "-"
        if r.rss_growth is not None:
            rss = f"{r.rss_growth / 2**30:.2f} GiB"
            if case.pixel:
                rss += f" {r.rss_growth / (case.capacity * case.obs_nbytes):.2f}x"
            if r.huge_growth is not None and r.rss_growth > 0:
                thp = f"{min(1.0, max(0.0, r.huge_growth / r.rss_growth)):.0%}"
        lines.append(
            f"{r.case:<10} {r.peer:<10} {med * 1e6:>10.1f} {r.best * 1e6:>10.1f} {ratio:>8} "
            f"{r.setup_s:>7.1f} {rss:>18} {thp:>5}  {r.note}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay-buffer peers vs the numpy limit.")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--peers", nargs="*", default=list(ADAPTERS), choices=list(ADAPTERS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target-s", type=float, default=0.1, help="seconds per timed repeat")
    args = parser.parse_args(argv)
    one_copy = CASES["pixel"].capacity * CASES["pixel"].obs_nbytes
    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, "
        f"torch {torch.__version__ if torch is not None else 'missing'} (1 thread); "
        f"pixel one copy of obs = {one_copy / 2**30:.2f} GiB",
        flush=True,
    )
    results: list[Result] = []
    for case_name in args.cases:
        case = CASES[case_name]
        for peer in args.peers:
            res = run_case(ADAPTERS[peer](), case, args.repeats, args.target_s)
            med = f"{res.median * 1e6:.1f} us" if res.median is not None else res.note
            print(f"  {case_name:<10} {peer:<10} {med}  (fill {res.setup_s:.1f} s)", flush=True)
            results.append(res)
        _POOLS.pop(case_name, None)
        gc.collect()
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
