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
* The n-step cases (``Case.nstep > 1``) go through each peer's own n-step machinery, wherever the peer
  computes the return (at add, at sample, or in its algorithm code). The pool's ``done`` flags are
  terminations (episode ends that are not time limits); every peer is fed them as its own done /
  terminated input, with no truncations. Each adapter's docstring states how the peer treats episode
  ends inside the n steps, as verified against the installed version.

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
# Discount of the n-step cases.
NSTEP_GAMMA = 0.99


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
    nstep: int = 1  # > 1: n-step transitions (return over nstep rewards, next obs nstep steps ahead)
    gamma: float = NSTEP_GAMMA  # discount of the n-step return (unused when nstep == 1)
    facade: bool = False  # rlflow through ReplayBuffer.add / extend (the peers time their own adds as usual)
    prioritized: bool = False  # an add case into a prioritized buffer (new items enter a sum tree)

    @property
    def obs_nbytes(self) -> int:
        """Bytes of one observation."""
        return int(np.prod(self.obs_shape)) * np.dtype(self.obs_dtype).itemsize

    @property
    def pixel(self) -> bool:
        """True for image observations (uint8 frames)."""
        return len(self.obs_shape) > 1


CASES: dict[str, Case] = {
    "add_one": Case("add_one", (17,), np.float32, 6, np.float32, 1_000_000, 1, "add", facade=True),
    "add_batch": Case("add_batch", (17,), np.float32, 6, np.float32, 1_000_000, 256, "add"),
    "sample": Case("sample", (17,), np.float32, 6, np.float32, 1_000_000, 256, "sample"),
    "per": Case("per", (17,), np.float32, 6, np.float32, 1_000_000, 256, "per"),
    "pixel": Case("pixel", (84, 84, 4), np.uint8, 1, np.int64, 100_000, 32, "sample"),
    "add_nstep3": Case("add_nstep3", (17,), np.float32, 6, np.float32, 1_000_000, 256, "add", nstep=3),
    "add_one_nstep3": Case("add_one_nstep3", (17,), np.float32, 6, np.float32, 1_000_000, 1, "add", nstep=3,
                           facade=True),
    "extend": Case("extend", (17,), np.float32, 6, np.float32, 1_000_000, 256, "add", facade=True),
    "extend_nstep3": Case("extend_nstep3", (17,), np.float32, 6, np.float32, 1_000_000, 256, "add", nstep=3,
                          facade=True),
    "extend_per": Case("extend_per", (17,), np.float32, 6, np.float32, 1_000_000, 256, "add", facade=True,
                       prioritized=True),
    "sample_nstep3": Case("sample_nstep3", (17,), np.float32, 6, np.float32, 1_000_000, 256, "sample", nstep=3),
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
    # How the batched add cases hand over their 256 transitions: "stream" (256 consecutive transitions of
    # one env) or "envs" (one transition of each of 256 envs, a vector env's step).
    add_layout = "stream"

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
    add_nstep3: the add limit (slice writes of the rows): the n-step return can be left to sample time.
    sample_nstep3: gather of obs, act, the n-step return, the bootstrap discount (float32,
    gamma**k * (1 - terminal)) and the n-step next_obs, stored as precomputed columns: the bytes any
    n-step sample returns, with no return arithmetic at all.
    """

    name = "numpy"

    def available(self) -> str | None:
        return None

    def supports(self, case: Case) -> bool:
        return True

    def describe(self, case: Case) -> str:
        if case.pixel:
            return "single frame array; gather obs[idx] and obs[idx+1]"
        if case.nstep > 1 and case.op == "sample":
            return "rng.integers + gather of obs, act, n-step return, discount, n-step next_obs"
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
        # n-step sample: rew holds the return column and disc the bootstrap discount column (values are
        # stand-ins; only the gathered bytes matter).
        self.disc = None
        if case.nstep > 1 and case.op == "sample":
            self.disc = np.where(self.done, np.float32(0.0), np.float32(case.gamma**case.nstep))
            self.done = None  # type: ignore[assignment]
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
        elif self.disc is not None:
            idx = self._rng.integers(0, self._cap, self._batch)
            self._out = (
                self.obs[idx],
                self.act[idx],
                self.rew[idx],
                self.disc[idx],
                self.next_obs[idx],  # type: ignore[index]
            )
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
        self.obs = self.next_obs = self.act = self.rew = self.done = self.disc = None  # type: ignore[assignment]
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
    add_nstep3 / sample_nstep3: ``ReplayBuffer(Nstep={"size": 3, "gamma": 0.99, "rew": "rew",
    "next": "next_obs"})``. The return is computed at add: a Python/numpy ``NstepBuffer`` holds the last
    n - 1 transitions and each ``add`` releases the transitions whose window is complete (so stored rows
    lag the input by n - 1). The sample is the plain ``rb.sample(batch)``. Stored per row: ``rew`` is
    sum_k gamma^k r_{t+k}, each term masked by the ``done`` flags before it (no reward leaks past an
    episode end); ``next_obs`` is next_obs_{t+n-1} whatever the episode ends (masked by ``done``);
    ``done`` is the *sum* d_t + ... + d_{t+n-2}. No discount is stored: the user bootstraps with
    gamma^n * (1 - done). Verified against cpprb 11 with a 10-step probe:

    * the window's last step is left out of ``done``: when the episode terminates at step t+n-1, the row
      has done = 0 and next_obs = the terminal observation, so the target bootstraps from a terminal
      state;
    * ``done`` is a count, so two episode ends in one window (a one-step episode) give done = 2 and
      (1 - done) = -1;
    * there is no truncation input: ``on_episode_end()`` flushes the last n - 1 rows of an episode with
      shortened returns, done = 0 and next_obs never written (the local buffer's fill value, 1.0), and the
      fixed gamma^n bootstrap is then wrong too. The benchmark has terminations only and never calls
      ``on_episode_end`` (a batched add cannot end an episode in its middle; ``done`` carries the ends);
    * ``add`` writes partial returns into the caller's ``rew`` array when it already is float32 (cpprb
      converts its inputs without copying when no conversion is needed). The adapter therefore passes
      float64 rewards, which cpprb casts into a fresh float32 array, so the pool (shared with the other
      peers) and the cycled items stay intact; the cast of 256 values is part of the timed add.
    """

    name = "cpprb"

    def available(self) -> str | None:
        return _import("cpprb")[1]

    def supports(self, case: Case) -> bool:
        return True

    def describe(self, case: Case) -> str:
        if case.pixel:
            return "ReplayBuffer(next_of='obs').sample"
        if case.prioritized:
            return "PrioritizedReplayBuffer.add(**kwargs): new items at the largest priority"
        if case.nstep > 1:
            if case.op == "add":
                return "ReplayBuffer(Nstep).add(**kwargs): return summed at add"
            return "ReplayBuffer(Nstep).sample (return summed at add)"
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
    def _kwargs(pool: Pool, start: int, n: int, nstep: bool = False) -> dict[str, Any]:
        rew = pool.rew[start : start + n]
        return {
            "obs": pool.obs(start, n),
            "act": pool.act[start : start + n],
            # float64: cpprb's n-step add would otherwise write into the float32 array it is given.
            "rew": rew.astype(np.float64) if nstep else rew,
            "next_obs": pool.next_obs(start, n),
            "done": pool.done[start : start + n].astype(np.float32),
        }

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        cpprb = importlib.import_module("cpprb")
        pool = get_pool(case)
        nstep = case.nstep > 1
        if case.op == "per" or case.prioritized:
            self.buf = cpprb.PrioritizedReplayBuffer(case.capacity, self._env_dict(case), alpha=PER_ALPHA)
        elif case.pixel:
            self.buf = cpprb.ReplayBuffer(case.capacity, self._env_dict(case), next_of="obs")
        elif nstep:
            spec = {"size": case.nstep, "gamma": case.gamma, "rew": "rew", "next": "next_obs"}
            self.buf = cpprb.ReplayBuffer(case.capacity, self._env_dict(case), Nstep=spec)
        else:
            self.buf = cpprb.ReplayBuffer(case.capacity, self._env_dict(case))
        # The n-step buffer holds back n - 1 transitions: feed that many more to fill the ring.
        total = case.capacity + (case.nstep if nstep else 0)
        for start, n in fill_chunks(total, pool.rows, pool.rows):
            self.buf.add(**self._kwargs(pool, start, n, nstep))
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
            self._items = [self._kwargs(pool, k * b, b, nstep) for k in range(pool.n_batches(b))]
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
    add_nstep3 / sample_nstep3: ``ReplayBuffer(storage=LazyTensorStorage(capacity),
    transform=MultiStepTransform(n_steps=3, gamma=0.99))``, TorchRL's documented n-step path for replay
    buffers (``torchrl.envs.transforms``; the ``MultiStep`` postproc is for collectors). The transform
    needs a TensorDict in the nested ("next", ...) layout: observation, action, ("next", observation /
    reward / done / terminated / truncated), each flag shaped (B, 1); the pool's done flags go to done
    and terminated, truncated is all False. The return is computed at ``extend`` (inverse transform):
    the transform keeps the last n rows, concatenates them with the new batch, computes with
    ``_multi_step_func`` and stores all but the last n rows (stored rows lag the input by n, so no
    window is cut short at the write end). The sample is the plain ``rb.sample()`` of a TensorDict
    holding, besides the inputs, ("next", "reward") (the return), ("next", "original_reward"),
    ``steps_to_next_obs`` (int64), ``gamma`` (gamma^k) and ``nonterminal``.
    Semantics (verified on torchrl 0.14.1 with a 10-step probe): ("next", "done") splits trajectories;
    the return sums rewards up to and including the first done step within n steps; ("next",
    "observation") is that step's next observation; ``steps_to_next_obs`` = k and ``gamma`` = gamma^k
    count the steps actually taken, so truncation (done without terminated) is handled right. But the
    done keys are left untouched (the docstring: entries "not part of the done_keys or reward_keys will
    be mapped"): ("next", "terminated") stays the flag of step t itself, so a row whose episode
    terminates at t+1 .. t+n-1 has terminated = False, nonterminal = True and the terminal observation
    as next observation, and TorchRL's losses (which mask the bootstrap with ("next", "terminated") and
    discount with gamma ** steps_to_next_obs) then bootstrap from a terminal state.
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
        return not case.prioritized and (case.op != "per" or self._extension_error() is None)

    def describe(self, case: Case) -> str:
        if case.prioritized:
            return "not measured: the prioritized add case covers cpprb"
        if case.op == "per":
            err = self._extension_error()
            if err is not None:
                return (
                    "unsupported here: PrioritizedSampler needs the torchrl C++ extension, which fails "
                    f"to load ({err}); rebuild it as in README.md"
                )
            return "PrioritizedReplayBuffer.sample(return_info=True) + update_priority"
        if case.nstep > 1:
            if case.op == "add":
                return "ReplayBuffer(transform=MultiStepTransform).extend(TensorDict): return at extend"
            return "ReplayBuffer(transform=MultiStepTransform).sample (return computed at extend)"
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

    @staticmethod
    def _tensordict(pool: Pool, start: int, n: int) -> Any:
        """Rows [start, start + n) in the nested ("next", ...) layout ``MultiStepTransform`` reads."""
        tensordict = importlib.import_module("tensordict")
        t = torch
        done = t.from_numpy(pool.done[start : start + n]).unsqueeze(-1)
        nxt = tensordict.TensorDict(
            {
                "observation": t.from_numpy(pool.next_obs(start, n)),
                "reward": t.from_numpy(pool.rew[start : start + n]).unsqueeze(-1),
                "done": done,
                "terminated": done.clone(),
                "truncated": t.zeros_like(done),
            },
            batch_size=[n],
        )
        return tensordict.TensorDict(
            {
                "observation": t.from_numpy(pool.obs(start, n)),
                "action": t.from_numpy(pool.act[start : start + n]),
                "next": nxt,
            },
            batch_size=[n],
        )

    def _setup_nstep(self, case: Case, data: Any, storage: Any) -> None:
        transforms = importlib.import_module("torchrl.envs.transforms")
        pool = get_pool(case)
        self.buf = data.ReplayBuffer(
            storage=storage,
            batch_size=case.batch,
            transform=transforms.MultiStepTransform(n_steps=case.nstep, gamma=case.gamma),
        )
        # The transform holds back n rows: feed that many more to fill the ring.
        for start, n in fill_chunks(case.capacity + case.nstep, pool.rows, pool.rows):
            self.buf.extend(self._tensordict(pool, start, n))
        if case.op == "add":
            b = case.batch
            self._items = [self._tensordict(pool, k * b, b) for k in range(pool.n_batches(b))]

    def setup(self, case: Case, rng: np.random.Generator) -> None:
        logging.getLogger("torchrl").setLevel(logging.WARNING)
        data = importlib.import_module("torchrl.data")
        pool = get_pool(case)
        storage = data.LazyTensorStorage(case.capacity, device="cpu")
        if case.nstep > 1:
            self._setup_nstep(case, data, storage)
            return
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
                self.buf.extend(self._next_item())  # n-step: the transform computes the return here
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
    add_nstep3 / sample_nstep3: Tianshou's buffers know nothing of n-step returns; they are computed at
    sample time by ``Algorithm.compute_nstep_return(batch, buffer, indices, target_q_fn, gamma, n_step)``
    (a public static method, what DQN / DDPG / TD3 / SAC call on every sampled batch). It only reads the
    buffer, so it is comparable with SB3's sample-time n-step; it needs no policy, only ``target_q_fn``,
    which gets the buffer and the indices n steps ahead. The adapter passes a stub that gathers
    ``buffer.obs_next`` at those indices (the n-step next obs, the data a target network would read) and
    returns zero Q values (Tianshou's own ``_target_q`` methods read ``buffer[indices].obs_next``, a
    gather of every key), so the timed work is the buffer side: ``buffer.sample(batch)`` (obs, act, the
    1-step rew / flags and obs_next at t), n - 1 ``buffer.next`` calls, the gather, a copy of the whole
    ``buffer.done`` array (1M bools, on every call) and the numba ``_nstep_return`` kernel. The output
    folds the discount into the return (``returns`` = n-step return + gamma^k * (1 - terminated) * Q), so
    no separate discount is returned. add_nstep3 is therefore the same ``VectorReplayBuffer.add`` as
    add_batch. Semantics (verified on 2.0.1 with a 10-step probe): ``buffer.next`` stops at ``done``
    (terminated or truncated) and at the newest row (never past the write cursor); the return sums
    rewards up to the first done; the bootstrap uses obs_next of the window's last step, gamma^k with k
    the steps taken, and is masked by that step's ``terminated`` only, so truncation is handled right.
    """

    name = "tianshou"
    add_layout = "envs"

    def available(self) -> str | None:
        return _import("tianshou.data")[1]

    def supports(self, case: Case) -> bool:
        return not case.prioritized

    def describe(self, case: Case) -> str:
        if case.prioritized:
            return "not measured: the prioritized add case covers cpprb"
        if case.pixel:
            return "ReplayBuffer(ignore_obs_next=True).sample"
        if case.op == "add":
            if case.batch == 1:
                return "ReplayBuffer.add(Batch)"
            if case.nstep > 1:
                return "VectorReplayBuffer.add(Batch, buffer_ids): plain add, return computed at sample"
            return "VectorReplayBuffer.add(Batch, buffer_ids)"
        if case.nstep > 1:
            return "ReplayBuffer.sample + Algorithm.compute_nstep_return (stub target Q: obs_next gather)"
        return {"sample": "ReplayBuffer.sample", "per": "PrioritizedReplayBuffer.sample + update_weight"}[case.op]

    def _target_q(self, buffer: Any, indices: npt.NDArray[np.int64]) -> Any:
        """Stub target Q for ``compute_nstep_return``: gather the n-step next obs, return zero values."""
        self._next_obs = buffer.obs_next[indices]
        return torch.zeros((len(indices), 1), dtype=torch.float32)

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
        elif case.nstep > 1:
            self._algorithm = importlib.import_module("tianshou.algorithm").Algorithm
            self.run_once(case)  # compiles the numba kernel outside the timed region

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
        elif case.nstep > 1:
            batch, idx = self.buf.sample(case.batch)
            self._out = self._algorithm.compute_nstep_return(
                batch, self.buf, idx, self._target_q, gamma=case.gamma, n_step=case.nstep
            )
        else:
            self.buf.sample(case.batch)

    def teardown(self) -> None:
        super().teardown()
        self._out = self._next_obs = None


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
    add_nstep3 / sample_nstep3: ``NStepReplayBuffer(n_steps=3, gamma=0.99)`` (SB3 >= 2.7), ``n_envs=256``
    as in add_batch / sample (pool row k * 256 + e is step k of env column e),
    ``handle_timeout_termination=True``; the pool's done flags are ``dones`` and no info carries
    ``TimeLimit.truncated``. The add is the plain ``ReplayBuffer.add`` (nothing
    n-step happens there); the return is computed at sample time, vectorised: for each sampled (row,
    env) it gathers the next n rewards / dones / timeouts of the same env column, cuts the window at the
    first done or timeout (inclusive), and returns ``rewards`` = sum_k gamma^k r_{t+k} over the window,
    ``discounts`` = gamma^k (k = steps in the window), ``next_observations`` = the next obs of the
    window's last step and ``dones`` = that step's done * (1 - timeout). The newest row (pos - 1) is
    temporarily marked as a timeout so windows never run past the write cursor into the oldest rows.
    Verified with a 10-step probe: terminations and truncations inside the window are both handled right
    (gamma^k, not a fixed gamma^n, on truncated windows).
    """

    name = "sb3"
    add_layout = "envs"

    def available(self) -> str | None:
        return _import("stable_baselines3.common.buffers")[1]

    @staticmethod
    def _has_nstep() -> bool:
        return hasattr(importlib.import_module("stable_baselines3.common.buffers"), "NStepReplayBuffer")

    def supports(self, case: Case) -> bool:
        if case.nstep > 1:
            return self._has_nstep()
        return case.op != "per" and not case.prioritized

    def describe(self, case: Case) -> str:
        if case.op == "per" or case.prioritized:
            return "unsupported: Stable-Baselines3 has no prioritized replay buffer"
        if case.nstep > 1:
            if not self._has_nstep():
                return "unsupported: this Stable-Baselines3 has no NStepReplayBuffer (added in 2.7)"
            if case.op == "add":
                return "NStepReplayBuffer.add (n_envs=256): plain add, return computed at sample"
            return "NStepReplayBuffer.sample (n_envs=256): return computed at sample"
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
        cls = buffers.NStepReplayBuffer if case.nstep > 1 else buffers.ReplayBuffer
        extra = {"n_steps": case.nstep, "gamma": case.gamma} if case.nstep > 1 else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.buf = cls(
                case.capacity,
                obs_space,
                act_space,
                device="cpu",
                n_envs=n_envs,
                optimize_memory_usage=case.pixel,
                handle_timeout_termination=not case.pixel,
                **extra,
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
    add_nstep3 / sample_nstep3: unsupported. flexibuff has no n-step transitions: ``K_Step_TD(rewards,
    values, terminated, ...)`` is a static helper computing k-step TD targets over one contiguous
    trajectory tensor (from ``sample_episodes``) with caller-supplied values, in a Python loop per step;
    nothing samples n-step transitions from the buffer.
    """

    name = "flexibuff"

    def available(self) -> str | None:
        return _import("flexibuff")[1]

    def supports(self, case: Case) -> bool:
        return case.op != "per" and case.nstep == 1 and not case.prioritized

    def describe(self, case: Case) -> str:
        if case.op == "per" or case.prioritized:
            return "unsupported: flexibuff has no prioritized replay"
        if case.nstep > 1:
            return (
                "unsupported: flexibuff has no n-step transition replay (K_Step_TD only computes k-step "
                "TD targets over a whole episode tensor with given values)"
            )
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
    cw = max([10, *(len(r.case) for r in results)])
    header = (
        f"{'case':<{cw}} {'peer':<10} {'median us':>10} {'best us':>10} {'x numpy':>8} {'fill s':>7} "
        f"{'RSS':>18} {'THP':>5}"
    )
    lines = [f"{header}  api / note", "-" * 120]
    for r in results:
        med = r.median
        case = CASES[r.case]
        if med is None or r.best is None:
            lines.append(
                f"{r.case:<{cw}} {r.peer:<10} {'-':>10} {'-':>10} {'-':>8} {'-':>7} {'-':>18} {'-':>5}  {r.note}"
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
            f"{r.case:<{cw}} {r.peer:<10} {med * 1e6:>10.1f} {r.best * 1e6:>10.1f} {ratio:>8} "
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
            print(f"  {case_name:<13} {peer:<10} {med}  (fill {res.setup_s:.1f} s)", flush=True)
            results.append(res)
        _POOLS.pop(case_name, None)
        gc.collect()
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
