"""A drop-in for flexibuff's ``FlexibleBuffer`` (its 0.1 interface), without its bugs.

A flexibuff user switches by changing one import::

    # from flexibuff import FlexibleBuffer, FlexiBatch
    from rlflow.compat.flexibuff import FlexibleBuffer, FlexiBatch

The constructor arguments, ``save_transition``, ``sample_transitions``, ``sample_episodes``,
``FlexibleBuffer.save(fb)`` / ``FlexibleBuffer.load(path, name)``, the return helpers ``G``, ``GAE`` and
``K_Step_TD``, ``sum_batch_rewards``, ``reset`` and the buffer's arrays (``fb.obs`` is
``[n_agents, num_steps, obs_size]``, ``fb.terminated`` is ``[num_steps]``, ...) are flexibuff's. What
differs (each difference is tested; ``docs/flexibuff.md`` lists them):

- episodes are tracked by absolute write counts, so wrap-around never breaks the episode index: an
  episode is sampled only while every one of its steps is still stored;
- memory weights need not sum to 1 (they are normalised), and weighted sampling draws from a compiled
  sum tree: ``O(batch log capacity)``, where flexibuff's ``np.random.choice(..., p=...)`` is
  ``O(capacity)`` and raises unless the weights sum to 1;
- uniform sampling without replacement costs ``O(batch)``, not ``O(capacity)``;
- a missing value the buffer was built to store, or one of the wrong shape, raises a ``ValueError``
  naming it and writes nothing (flexibuff warns and stores NaN, or broadcasts);
- ``terminated=None`` means False; ``save_transition`` also takes ``truncated=`` (an episode cut short:
  it ends the episode for ``sample_episodes``, and ``G``/``GAE``/``K_Step_TD`` take ``truncated`` and
  ``bootstrap_values`` to bootstrap from its final observation);
- ``save`` writes one versioned ``.npz`` file atomically and ``load`` reads it without unpickling;
  the buffer pickles (flexibuff's later versions recurse forever on unpickling);
- ``device`` defaults to CUDA when available, else the CPU; sampling is seeded with ``seed=``.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from itertools import islice
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from rlflow import returns as _returns
from rlflow.atomic_files import atomic_write
from rlflow.replay.sum_tree import SumTree

__all__ = ["FlexiBatch", "FlexibleBuffer"]

FORMAT = "rlflow.compat.flexibuff"
VERSION = 1

# name -> (per agent, dtype, trailing shape attribute); the arrays flexibuff keeps, in its order
_ARRAYS = ("obs", "obs_", "state", "state_", "global_rewards", "global_auxiliary_rewards", "individual_rewards",
           "individual_auxiliary_rewards", "discrete_actions", "continuous_actions", "discrete_log_probs",
           "continuous_log_probs", "terminated", "truncated", "memory_weights")
# save_transition's argument for each stored array
_ARGUMENT = {"obs": "obs", "obs_": "obs_", "state": "state", "state_": "state_", "global_rewards": "global_reward",
             "global_auxiliary_rewards": "global_auxiliary_reward", "individual_rewards": "individual_rewards",
             "individual_auxiliary_rewards": "individual_auxiliary_rewards",
             "discrete_actions": "discrete_actions", "continuous_actions": "continuous_actions",
             "discrete_log_probs": "discrete_log_probs", "continuous_log_probs": "continuous_log_probs"}


class _Config(TypedDict):
    """``FlexibleBuffer.config``: the constructor's arguments, normalised (and saved with the buffer)."""

    num_steps: int
    obs_size: int
    action_mask: bool
    discrete_action_cardinalities: list[int] | None
    continuous_action_dimension: int | None
    n_agents: int
    state_size: int | None
    global_reward: bool
    global_auxiliary_reward: bool
    individual_reward: bool
    individual_auxiliary_reward: bool
    log_prob_discrete: bool
    log_prob_continuous: int
    memory_weights: bool


@dataclass
class FlexiBatch:
    """A batch of transitions in flexibuff's layout: per-agent arrays ``[n_agents, B, ...]``, global ones
    ``[B, ...]``, action masks a list (one per discrete head) of ``[n_agents, B, cardinality]``."""

    obs: Any = None
    obs_: Any = None
    state: Any = None
    state_: Any = None
    global_rewards: Any = None
    global_auxiliary_rewards: Any = None
    individual_rewards: Any = None
    individual_auxiliary_rewards: Any = None
    discrete_actions: Any = None
    continuous_actions: Any = None
    discrete_log_probs: Any = None
    continuous_log_probs: Any = None
    action_mask: list | None = None
    action_mask_: list | None = None
    terminated: Any = None
    truncated: Any = None
    memory_weights: Any = None

    def to_torch(self, device: Any = None) -> None:
        """Make every array a torch tensor on ``device`` (floats as float32, discrete actions as int64)."""
        import torch

        device = _device(device)
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name in ("action_mask", "action_mask_"):
                setattr(self, f.name, [torch.from_numpy(np.asarray(m)).float().to(device) for m in value])
            elif f.name == "discrete_actions":
                setattr(self, f.name, torch.from_numpy(np.ascontiguousarray(value)).long().to(device))
            else:
                setattr(self, f.name, torch.from_numpy(np.ascontiguousarray(value)).float().to(device))


_EMPTY_BATCH = vars(FlexiBatch())  # every field None


class _Episodes:
    """``(first step, length)`` of the ended episodes, oldest first: a list, with the episodes dropped from its
    front counted off (``_head``) rather than removed one by one, so that picking the ``j``-th is O(1)."""

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        self._pairs = list(pairs)
        self._head = 0

    def __len__(self) -> int:
        return len(self._pairs) - self._head

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return islice(self._pairs, self._head, None)

    def append(self, pair: tuple[int, int]) -> None:
        self._pairs.append(pair)

    def pick(self, positions: list[int]) -> list[tuple[int, int]]:
        """The episodes at ``positions`` (0: the oldest)."""
        pairs, head = self._pairs, self._head
        return [pairs[head + j] for j in positions]

    def drop_before(self, oldest: int) -> None:
        """Forget the episodes that start before step ``oldest``."""
        pairs, head = self._pairs, self._head
        while head < len(pairs) and pairs[head][0] < oldest:
            head += 1
        if head > 1024 and 2 * head > len(pairs):  # the list's front is mostly forgotten: cut it
            del pairs[:head]
            head = 0
        self._head = head

    def clear(self) -> None:
        self._pairs.clear()
        self._head = 0


def _split_steps(batch: FlexiBatch, lengths: list[int], per_agent: set[str]) -> list[FlexiBatch]:
    """``batch``'s steps cut into consecutive parts of ``lengths`` steps, each a FlexiBatch of views (numpy or
    torch); per-agent arrays and action masks have their steps on axis 1, the others on axis 0."""
    ends = np.cumsum(lengths).tolist()
    by_step: list[tuple[str, Any]] = []
    by_agent: list[tuple[str, Any]] = []
    masks: list[tuple[str, Any]] = []
    for name, value in vars(batch).items():
        if value is not None:
            kind = masks if name in ("action_mask", "action_mask_") else by_agent if name in per_agent else by_step
            kind.append((name, value))
    out = []
    for a, b in zip([0, *ends[:-1]], ends, strict=True):
        fields_ = dict(_EMPTY_BATCH)
        for name, value in by_step:
            fields_[name] = value[a:b]
        for name, value in by_agent:
            fields_[name] = value[:, a:b]
        for name, value in masks:
            fields_[name] = [m[:, a:b] for m in value]
        part = object.__new__(FlexiBatch)  # its fields set directly: __init__ costs more than the views
        part.__dict__ = fields_
        out.append(part)
    return out


def _flexibuff_view(rows: np.ndarray, name: str, per_agent: bool) -> np.ndarray:
    """Field ``name`` of the structured ``rows`` in flexibuff's layout: a per-agent value with its agents first
    (``[n_agents, steps, ...]``), any other ``[steps, ...]``; a view."""
    view = rows[name]
    return view.swapaxes(0, 1) if per_agent else view


class _Stored:
    """One of flexibuff's arrays on :class:`FlexibleBuffer`: a view of the buffer's rows in flexibuff's layout
    (None where the buffer was built without it). Written into, never replaced."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, fb: Any, owner: type | None = None) -> Any:
        if fb is None:
            return self
        return fb._columns.get(self._name)

    def __set__(self, fb: Any, value: Any) -> None:
        raise AttributeError(f"FlexibleBuffer.{self._name} is a view of the buffer's storage and cannot be replaced: "
                             f"write into it (fb.{self._name}[...] = values) or call save_transition")


def _device(device: Any) -> Any:
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class FlexibleBuffer:
    """flexibuff's multi-agent buffer (see the module docstring for what differs).

    Args:
        num_steps: steps stored (a ring: the oldest is overwritten).
        obs_size: the length of one agent's flat observation.
        action_mask: store a legal-action mask per discrete head, for the observation and the next one.
        discrete_action_cardinalities: the number of choices of each discrete action head.
        continuous_action_dimension: the number of continuous action values per agent.
        path: where :meth:`save` writes (``path + name``).
        name: see ``path``.
        n_agents: agents per step.
        state_size: the length of the global state (stored with the next state) or None.
        global_reward: store a team reward.
        global_auxiliary_reward: store a second team reward (e.g. human feedback).
        individual_reward: store a reward per agent.
        individual_auxiliary_reward: store a second reward per agent.
        log_prob_discrete: store a log-probability per discrete head per agent.
        log_prob_continuous: the number of continuous log-probabilities per agent (0: none).
        memory_weights: store a sampling weight per step (``sample_transitions(weighted=True)``).
        seed: seeds the sampling.
    """

    # flexibuff's arrays, in its layout: views of the rows that hold each step's values together
    obs, obs_, state, state_ = _Stored(), _Stored(), _Stored(), _Stored()
    global_rewards, global_auxiliary_rewards = _Stored(), _Stored()
    individual_rewards, individual_auxiliary_rewards = _Stored(), _Stored()
    discrete_actions, continuous_actions, discrete_log_probs, continuous_log_probs = (_Stored(), _Stored(),
                                                                                      _Stored(), _Stored())
    terminated, truncated, memory_weights, action_mask, action_mask_ = (_Stored(), _Stored(), _Stored(),
                                                                        _Stored(), _Stored())

    def __init__(self, num_steps: int = 10, obs_size: int = 1, action_mask: bool = False,
                 discrete_action_cardinalities: Any = None, continuous_action_dimension: int | None = None,
                 path: str = "./default_dir/", name: str = "flexibuff_test", n_agents: int = 1,
                 state_size: int | None = None, global_reward: bool = False, global_auxiliary_reward: bool = False,
                 individual_reward: bool = False, individual_auxiliary_reward: bool = False,
                 log_prob_discrete: bool = False, log_prob_continuous: int = 0, memory_weights: bool = False,
                 seed: int | None = None) -> None:
        if int(num_steps) < 1 or int(n_agents) < 1 or int(obs_size) < 0:
            raise ValueError(f"expected num_steps >= 1, n_agents >= 1 and obs_size >= 0, got {num_steps}, "
                             f"{n_agents} and {obs_size}")
        if (action_mask or log_prob_discrete) and discrete_action_cardinalities is None:
            raise ValueError("action_mask and log_prob_discrete need discrete_action_cardinalities")
        self.config: _Config = {
            "num_steps": int(num_steps), "obs_size": int(obs_size), "action_mask": bool(action_mask),
            "discrete_action_cardinalities": None if discrete_action_cardinalities is None else
            [int(c) for c in discrete_action_cardinalities],
            "continuous_action_dimension": None if continuous_action_dimension is None else
            int(continuous_action_dimension),
            "n_agents": int(n_agents), "state_size": None if state_size is None else int(state_size),
            "global_reward": bool(global_reward), "global_auxiliary_reward": bool(global_auxiliary_reward),
            "individual_reward": bool(individual_reward),
            "individual_auxiliary_reward": bool(individual_auxiliary_reward),
            "log_prob_discrete": bool(log_prob_discrete), "log_prob_continuous": int(log_prob_continuous),
            "memory_weights": bool(memory_weights),
        }
        self.path, self.name = path, name
        self._build(seed)

    # ------------------------------------------------------------------ layout
    def _build(self, seed: int | None) -> None:
        c = self.config
        a, n = c["n_agents"], c["num_steps"]
        self.num_agents, self.num_steps, self.mem_size = a, n, n
        self.discrete_action_cardinalities = c["discrete_action_cardinalities"]
        self.continuous_action_dimension = c["continuous_action_dimension"]
        self.state_size = c["state_size"]
        heads = c["discrete_action_cardinalities"]
        if heads is None and (c["action_mask"] or c["log_prob_discrete"]):  # a config read from a file
            raise ValueError("action_mask and log_prob_discrete need discrete_action_cardinalities")
        # name -> (shape of one step's value, dtype, per agent): what save_transition takes
        layout: dict[str, tuple[tuple[int, ...], Any, bool]] = {
            "obs": ((c["obs_size"],), np.float32, True), "obs_": ((c["obs_size"],), np.float32, True)}
        if c["state_size"] is not None:
            layout["state"] = layout["state_"] = ((c["state_size"],), np.float32, False)
        if c["global_reward"]:
            layout["global_rewards"] = ((), np.float32, False)
        if c["global_auxiliary_reward"]:
            layout["global_auxiliary_rewards"] = ((), np.float32, False)
        if c["individual_reward"]:
            layout["individual_rewards"] = ((), np.float32, True)
        if c["individual_auxiliary_reward"]:
            layout["individual_auxiliary_rewards"] = ((), np.float32, True)
        if heads is not None:
            layout["discrete_actions"] = ((len(heads),), np.int32, True)
        if c["continuous_action_dimension"] is not None:
            layout["continuous_actions"] = ((c["continuous_action_dimension"],), np.float32, True)
        if c["log_prob_discrete"] and heads is not None:  # heads is not None: checked above
            layout["discrete_log_probs"] = ((len(heads),), np.float32, True)
        if c["log_prob_continuous"] > 0:
            layout["continuous_log_probs"] = ((c["log_prob_continuous"],), np.float32, True)
        self._layout = layout
        self._per_agent = {name for name, (_, _, per_agent) in layout.items() if per_agent}
        # Every step's values are one row (a structured record), so a sample gathers whole rows: an episode's
        # steps are consecutive bytes. flexibuff's arrays are views of the rows in its layout.
        stored = dict(layout)
        stored["terminated"] = stored["truncated"] = ((), np.float32, False)
        if c["memory_weights"]:
            stored["memory_weights"] = ((), np.float32, False)
        masks = heads if c["action_mask"] and heads is not None else []  # heads is not None: checked above
        for h, cardinality in enumerate(masks):
            stored[f"action_mask{h}"] = stored[f"action_mask_{h}"] = ((cardinality,), np.float32, True)
        self._rows = np.zeros(n, np.dtype([(name, dtype, ((a,) if per_agent else ()) + shape)
                                           for name, (shape, dtype, per_agent) in stored.items()]))
        self._stored = [(name, per_agent) for name, (_, _, per_agent) in stored.items()]
        self._mask_heads = len(masks)
        for name in stored:  # flexibuff's initial values
            ones = name.startswith(("action_mask", "memory"))
            self._rows[name] = -1.0 if name.endswith("log_probs") else 1.0 if ones else 0.0
        self._columns = self._views(self._rows)
        self._tree: SumTree | None = SumTree(n) if c["memory_weights"] else None
        self.rng = np.random.default_rng(seed)
        self._count = 0  # steps ever written; step k is stored at index k % num_steps while k >= count - num_steps
        self._episode_start = 0  # the first step (absolute) of the episode in progress
        self._episodes = _Episodes()

    # ------------------------------------------------------------------ flexibuff's counters
    @property
    def idx(self) -> int:
        """Where the next step goes."""
        return self._count % self.mem_size

    @property
    def steps_recorded(self) -> int:
        """Steps stored (at most ``num_steps``)."""
        return min(self._count, self.mem_size)

    @property
    def episode_inds(self) -> list[int] | None:
        """flexibuff's attribute: the first index of each stored ended episode, oldest first, then that of the
        episode in progress (one more entry than :attr:`episode_lens`); None before an episode ended."""
        self._drop_overwritten()
        if not self._episodes:
            return None
        return [s % self.mem_size for s, _ in self._episodes] + [self._episode_start % self.mem_size]

    @property
    def episode_lens(self) -> list[int] | None:
        """The length of each stored ended episode, oldest first."""
        self._drop_overwritten()
        return [n for _, n in self._episodes] if self._episodes else None

    def _drop_overwritten(self) -> None:
        self._episodes.drop_before(self._count - self.mem_size)

    # ------------------------------------------------------------------ writing
    def save_transition(self, obs: Any = None, obs_: Any = None, terminated: Any = None, discrete_actions: Any = None,
                        continuous_actions: Any = None, global_reward: Any = None, global_auxiliary_reward: Any = None,
                        individual_rewards: Any = None, individual_auxiliary_rewards: Any = None,
                        action_mask: Any = None, action_mask_: Any = None, state: Any = None, state_: Any = None,
                        discrete_log_probs: Any = None, continuous_log_probs: Any = None, memory_weight: float = 1.0,
                        truncated: Any = False) -> None:
        """Store one step; every value the buffer was built with is required. Raises ``ValueError``
        naming the value (and writes nothing) when one is missing or of the wrong shape."""
        given = {"obs": obs, "obs_": obs_, "state": state, "state_": state_, "global_reward": global_reward,
                 "global_auxiliary_reward": global_auxiliary_reward, "individual_rewards": individual_rewards,
                 "individual_auxiliary_rewards": individual_auxiliary_rewards, "discrete_actions": discrete_actions,
                 "continuous_actions": continuous_actions, "discrete_log_probs": discrete_log_probs,
                 "continuous_log_probs": continuous_log_probs}
        a = self.num_agents
        values: dict[str, np.ndarray] = {}
        for name, (shape, dtype, per_agent) in self._layout.items():
            arg = _ARGUMENT[name]
            expected = ((a,) if per_agent else ()) + shape
            values[name] = self._checked(arg, given[arg], expected, dtype)
        if "discrete_actions" in values:  # whole numbers below each head's cardinality
            raw = np.asarray(discrete_actions)
            cards = np.asarray(self.discrete_action_cardinalities)
            d = values["discrete_actions"]
            fractional = raw.dtype.kind == "f" and not np.array_equal(raw, np.round(raw))
            if fractional or (d < 0).any() or (d >= cards).any():
                raise ValueError(f"save_transition: discrete_actions: expected whole numbers in [0, cardinality) per "
                                 f"head, cardinalities {cards.tolist()}, got {raw.tolist()}")
        extra = [k for k, v in given.items() if v is not None and all(_ARGUMENT[n] != k for n in self._layout)]
        if extra:
            raise ValueError(f"save_transition: {extra} given, but this buffer was not built to store them")
        stored_masks = self._masks()
        # (a stored [n_agents, mem_size, cardinality] mask, this step's [n_agents, cardinality] value for it)
        mask_writes: list[tuple[np.ndarray, np.ndarray]] = []
        if stored_masks is not None:
            if action_mask is None or action_mask_ is None:
                raise ValueError("save_transition: this buffer stores action masks: expected action_mask and "
                                 "action_mask_ (one [n_agents, cardinality] array per discrete head)")
            for which, given, stored in (("action_mask", action_mask, stored_masks[0]),
                                         ("action_mask_", action_mask_, stored_masks[1])):
                mask_writes += [(s, self._checked(f"{which}[{h}]", given[h] if len(given) > h else None,
                                                  (s.shape[0], s.shape[2]), np.float32)) for h, s in enumerate(stored)]
        elif action_mask is not None or action_mask_ is not None:
            raise ValueError("save_transition: action masks given, but this buffer was built with action_mask=False")
        weight = float(memory_weight)
        if not (np.isfinite(weight) and weight >= 0):
            raise ValueError(f"save_transition: memory_weight: expected a finite number >= 0, got {memory_weight}")
        term, trunc = bool(terminated) if terminated is not None else False, bool(truncated)
        # ---- every value is valid: write.
        i = self.idx
        for name, value in values.items():
            arr = getattr(self, name)
            if self._layout[name][2]:
                arr[:, i] = value
            else:
                arr[i] = value
        for mask, value in mask_writes:
            mask[:, i] = value
        if self.memory_weights is not None:
            weights, tree = self._weights()
            weights[i] = weight
            tree.update(np.array([i], np.int64), np.array([weight], np.float64))
        self.terminated[i] = term
        self.truncated[i] = trunc
        self._count += 1
        if term or trunc:
            self._episodes.append((self._episode_start, self._count - self._episode_start))
            self._episode_start = self._count
        self._drop_overwritten()

    def _views(self, rows: np.ndarray) -> dict[str, Any]:
        """The fields of the structured ``rows`` in flexibuff's layout, by flexibuff's names; action masks as
        flexibuff keeps them, a list of one array per discrete head."""
        views: dict[str, Any] = {name: _flexibuff_view(rows, name, per_agent) for name, per_agent in self._stored}
        if self._mask_heads:
            for kind in ("action_mask", "action_mask_"):  # action_mask0, action_mask1, ... -> action_mask
                views[kind] = [views.pop(f"{kind}{h}") for h in range(self._mask_heads)]
        return views

    def _masks(self) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """``(action_mask, action_mask_)``, or None when the buffer stores no action masks."""
        if self.action_mask is None:
            return None
        if self.action_mask_ is None:
            raise ValueError("this buffer has action_mask but no action_mask_ (both are built with action_mask=True)")
        return self.action_mask, self.action_mask_

    def _weights(self) -> tuple[np.ndarray, SumTree]:
        """The memory weights and their sum tree (the buffer was built with ``memory_weights=True``)."""
        if self.memory_weights is None or self._tree is None:
            raise ValueError("this buffer has no memory weights (build it with memory_weights=True)")
        return self.memory_weights, self._tree

    @staticmethod
    def _checked(name: str, value: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        if value is None:
            raise ValueError(f"save_transition: expected {name} of shape {shape}, got None (this buffer was built "
                             "to store it)")
        try:
            arr = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"save_transition: {name}: expected numbers of shape {shape}, got {exc}") from None
        if arr.shape != shape:
            raise ValueError(f"save_transition: {name}: expected shape {shape}, got {arr.shape}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ValueError(f"save_transition: {name}: expected finite values, got {arr}")
        return arr

    # ------------------------------------------------------------------ sampling
    def sample_transitions(self, batch_size: int = 256, weighted: bool = False, as_torch: bool = False,
                           device: Any = None, idx: Any = None) -> FlexiBatch:
        """``min(batch_size, steps stored)`` distinct steps, uniformly or in proportion to the memory weights
        (successive draws without replacement, as ``np.random.choice(replace=False, p=w / w.sum())``);
        or the steps at ``idx``."""
        if idx is None:
            n = self.steps_recorded
            size = min(n, int(batch_size))
            if weighted:
                if self._tree is None:
                    raise ValueError("sample_transitions(weighted=True): this buffer has no memory weights "
                                     "(build it with memory_weights=True)")
                idx = self._weighted_distinct(size)
            else:
                idx = self._uniform_distinct(n, size)
        else:
            idx = np.asarray(idx, np.int64)
            if idx.size and (idx.min() < 0 or idx.max() >= self.steps_recorded):
                raise IndexError(f"idx: expected indices in [0, {self.steps_recorded}), got {idx.min()}..{idx.max()}")
        return self._batch(idx, as_torch, device)

    def _uniform_distinct(self, n: int, size: int) -> np.ndarray:
        """``size`` distinct integers of ``[0, n)``, uniformly: draws with replacement, keeping first occurrences
        (exactly successive sampling without replacement), in ``O(size)`` when ``size`` is well below ``n``."""
        if size * 4 > n:
            return self.rng.permutation(n)[:size]
        return self._distinct(size, lambda m: self.rng.integers(0, n, m))

    def _weighted_distinct(self, size: int) -> np.ndarray:
        if size == 0:
            return np.zeros(0, np.int64)
        weights, tree = self._weights()
        if tree.total <= 0:
            raise ValueError("sample_transitions(weighted=True): every stored memory weight is 0")
        positive = int(np.count_nonzero(weights[:self.steps_recorded]))
        if positive < size:
            raise ValueError(f"sample_transitions(weighted=True): {size} distinct steps requested, only "
                             f"{positive} have a memory weight above 0")
        taken: list[np.ndarray] = []
        have = 0
        while have < size:  # draw from the weights of the steps not taken yet (taken ones are zeroed)
            new = _first_occurrences(tree.find(self.rng.random(size - have) * tree.total))[:size - have]
            taken.append(new)
            have += new.size
            tree.update(new, np.zeros(new.size))
        out = np.concatenate(taken)
        tree.update(out, weights[out].astype(np.float64))
        return out

    def _distinct(self, size: int, draw: Any) -> np.ndarray:
        out = np.zeros(0, np.int64)
        while out.size < size:
            out = _first_occurrences(np.concatenate([out, draw(size - out.size)]))
        return out[:size]

    def _batch(self, idx: np.ndarray, as_torch: bool, device: Any) -> FlexiBatch:
        batch = FlexiBatch(**self._views(self._rows.take(idx)))  # one gather of whole rows
        if as_torch:
            batch.to_torch(device)
        return batch

    def sample_episodes(self, max_batch_size: int = 256, as_torch: bool = False, device: Any = None,
                        n_episodes: int | None = None) -> list[FlexiBatch]:
        """Whole ended episodes (terminated or truncated), in random order without repeats, each a
        :class:`FlexiBatch` of its steps in time order, until they hold ``max_batch_size`` steps (the last
        one cut to fit) or ``n_episodes`` are taken. Only episodes whose every step is still stored."""
        self._drop_overwritten()
        episodes = self._episodes
        limit = len(episodes) if n_episodes is None else min(int(n_episodes), len(episodes))
        # Every episode holds a step, so at most max_batch_size are taken: draw only those, distinct, in
        # O(draws) (not a permutation of every stored episode, which cost more than the copies).
        draws = max(min(limit, int(max_batch_size)), 0)
        if not draws:
            return []
        picked = np.array(episodes.pick(self.rng.choice(len(episodes), size=draws, replace=False).tolist()),
                          np.int64).reshape(-1, 2)
        starts, sizes = picked[:, 0], picked[:, 1]
        before = np.cumsum(sizes) - sizes  # steps taken before each episode
        kept = int(np.count_nonzero(before < max_batch_size))  # episodes until max_batch_size steps, the last cut
        starts, before = starts[:kept], before[:kept]
        sizes = np.minimum(sizes[:kept], int(max_batch_size) - before)
        # One gather of every array for all the episodes, then each episode's batch is a view of its part.
        steps = np.repeat(starts - before, sizes) + np.arange(int(sizes.sum()))
        whole = self._batch(steps % self.mem_size, as_torch, device)
        return _split_steps(whole, sizes.tolist(), self._per_agent)

    def reset(self) -> None:
        """Forget every stored step (the arrays keep their contents until overwritten, as in flexibuff)."""
        self._count = 0
        self._episode_start = 0
        self._episodes.clear()
        if self._tree is not None:
            weights, tree = self._weights()
            weights[:] = 1.0
            tree.set_leaves(np.zeros(self.mem_size))

    # ------------------------------------------------------------------ returns (flexibuff's helpers)
    @staticmethod
    def G(rewards: Any, terminated: Any, last_value: Any = 0, gamma: float = 0.99, truncated: Any = None,
          bootstrap_values: Any = None) -> Any:
        """Discounted returns of one rollout ``[T]``, as ``[T, 1]``; ``last_value`` bootstraps the last step
        unless it terminated; ``truncated`` steps bootstrap from ``bootstrap_values`` (V of their final
        observation)."""
        r, term, trunc, nxt = _rollout(rewards, terminated, truncated, bootstrap_values, last_value)
        return _unsqueeze(_returns.discounted_returns(r, term, trunc, gamma, next_values=nxt))

    @staticmethod
    def GAE(rewards: Any, values: Any, terminated: Any, last_value: Any = 0, gamma: float = 0.99,
            gae_lambda: float = 0.95, truncated: Any = None, bootstrap_values: Any = None) -> tuple[Any, Any]:
        """``(returns, advantages)`` of one rollout, each ``[T, 1]`` (GAE with ``gae_lambda``)."""
        r, term, trunc, nxt = _rollout(rewards, terminated, truncated, bootstrap_values, last_value, values)
        adv, ret = _returns.gae(r, values, nxt, term, trunc, gamma, gae_lambda)
        return _unsqueeze(ret), _unsqueeze(adv)

    @staticmethod
    def K_Step_TD(rewards: Any, values: Any, terminated: Any, last_value: Any = 0, gamma: float = 0.99, k: int = 1,
                  truncated: Any = None, bootstrap_values: Any = None) -> tuple[Any, Any]:
        """``(targets, targets - values)`` of one rollout, each ``[T, 1]``: k-step TD targets."""
        r, term, trunc, nxt = _rollout(rewards, terminated, truncated, bootstrap_values, last_value, values)
        targets = _returns.nstep_targets(r, nxt, term, trunc, gamma, k)
        return _unsqueeze(targets), _unsqueeze(targets - values)

    @staticmethod
    def sum_batch_rewards(batch: FlexiBatch, agent_num: int = 0) -> Any:
        """The sum of every reward the batch holds for agent ``agent_num`` (team and individual)."""
        total: Any = 0
        for value in (batch.global_rewards, batch.global_auxiliary_rewards):
            if value is not None:
                total = total + value
        for value in (batch.individual_rewards, batch.individual_auxiliary_rewards):
            if value is not None:
                total = total + value[agent_num]
        return total

    # ------------------------------------------------------------------ save / load / pickle
    def _state(self) -> dict[str, np.ndarray]:
        arrays = {name: getattr(self, name) for name in _ARRAYS if getattr(self, name) is not None}
        masks = self._masks()
        if masks is not None:
            for h in range(len(masks[0])):
                arrays[f"action_mask{h}"] = masks[0][h]
                arrays[f"action_mask_{h}"] = masks[1][h]
        arrays["episodes"] = np.array(list(self._episodes), np.int64).reshape(-1, 2)
        meta = {"format": FORMAT, "version": VERSION, "config": self.config, "count": self._count,
                "episode_start": self._episode_start, "path": self.path, "name": self.name,
                "rng": self.rng.bit_generator.state}
        arrays["meta"] = np.array(json.dumps(meta))
        return arrays

    def _restore(self, arrays: Any) -> None:
        meta = json.loads(str(arrays["meta"]))
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} file of version {VERSION}: format {meta.get('format')!r}, "
                             f"version {meta.get('version')!r}")
        self.config = meta["config"]
        self.path, self.name = meta["path"], meta["name"]
        self._build(None)
        for name in (*_ARRAYS, *(f"action_mask{h}" for h in range(len(self.action_mask or []))),
                     *(f"action_mask_{h}" for h in range(len(self.action_mask_ or [])))):
            if name.startswith("action_mask"):
                which, h = ("action_mask_", int(name[12:])) if name.startswith("action_mask_") else \
                    ("action_mask", int(name[11:]))
                target = getattr(self, which)[h]
            else:
                target = getattr(self, name)
                if target is None:
                    continue
            if name not in arrays or arrays[name].shape != target.shape or arrays[name].dtype != target.dtype:
                got = "missing" if name not in arrays else f"{arrays[name].dtype} {arrays[name].shape}"
                raise ValueError(f"corrupt buffer file: {name}: expected {target.dtype} {target.shape}, got {got}")
            target[...] = arrays[name]
        self._count, self._episode_start = int(meta["count"]), int(meta["episode_start"])
        self._episodes = _Episodes((int(s), int(n)) for s, n in arrays["episodes"])
        self.rng.bit_generator.state = meta["rng"]
        if self._tree is not None:
            weights, tree = self._weights()
            leaves = weights.astype(np.float64)
            leaves[self.steps_recorded:] = 0.0  # rows never written are never drawn
            tree.set_leaves(leaves)

    @staticmethod
    def save(fb: FlexibleBuffer) -> str:
        """Write ``fb`` to ``fb.path + fb.name + ".npz"`` atomically (a crash leaves the previous file;
        the temporary files ``.<name>.npz.tmp-<pid>`` of saves killed mid-write are removed); returns the
        file's path."""
        folder = os.path.dirname(fb.path + fb.name) or "."
        os.makedirs(folder, exist_ok=True)
        target = fb.path + fb.name + ".npz"
        atomic_write(Path(target), lambda f: np.savez(f, **fb._state()))  # type: ignore[arg-type]
        return target

    @staticmethod
    def load(path: str, name: str) -> FlexibleBuffer:
        """The buffer :meth:`save` wrote to ``path + name + ".npz"`` (read without unpickling)."""
        target = path + name + ".npz"
        if not os.path.exists(target):
            raise FileNotFoundError(f"no saved buffer at {target!r}")
        fb = FlexibleBuffer.__new__(FlexibleBuffer)
        try:
            with np.load(target, allow_pickle=False) as arrays:
                fb._restore(arrays)
        except (KeyError, ValueError, OSError, EOFError, RuntimeError, zipfile.BadZipFile, struct.error,
                OverflowError) as exc:  # what numpy's and zipfile's readers raise on damaged bytes
            raise ValueError(f"{target!r} is not a readable saved buffer: {exc}") from None
        return fb

    def __getstate__(self) -> dict[str, Any]:
        return {k: np.array(v) for k, v in self._state().items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._restore(state)

    def __repr__(self) -> str:
        return (f"FlexibleBuffer(num_steps={self.num_steps}, n_agents={self.num_agents}, "
                f"steps_recorded={self.steps_recorded}, episodes={len(self._episodes)})")


def _first_occurrences(values: np.ndarray) -> np.ndarray:
    """The distinct values in order of first occurrence."""
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)].astype(np.int64)


def _rollout(rewards: Any, terminated: Any, truncated: Any, bootstrap_values: Any, last_value: Any,
             values: Any = None) -> tuple[Any, Any, Any, Any]:
    """One rollout ``[T]`` as rlflow.returns inputs ``[T, 1]``: rewards, flags and next values (the next step's
    value, ``last_value`` after the last step, ``bootstrap_values`` where truncated, 0 where terminated)."""
    import torch

    as_tensor = (lambda x: x) if isinstance(rewards, torch.Tensor) else np.asarray
    r = as_tensor(rewards)
    lib = torch if isinstance(r, torch.Tensor) else np
    term = lib.zeros_like(r) if terminated is None else as_tensor(terminated)
    trunc = lib.zeros_like(r) if truncated is None else as_tensor(truncated)
    nxt = lib.zeros_like(r) + 0.0
    if values is not None:
        nxt[:-1] = as_tensor(values)[1:]
    nxt[-1] = last_value if not isinstance(last_value, torch.Tensor) else last_value.reshape(())
    if truncated is not None:
        if bootstrap_values is None:
            raise ValueError("truncated given: expected bootstrap_values (V of each truncated step's final "
                             "observation) as well")
        boot = as_tensor(bootstrap_values)
        nxt = lib.where(trunc != 0, boot, nxt)
    return r, term, trunc, nxt


def _unsqueeze(x: Any) -> Any:
    return x[..., None]
