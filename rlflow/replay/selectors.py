"""Selectors: which item a Table samples next, and which it removes when full.

Every selector works as sampler and as remover. Random selectors draw with replacement
(:class:`Uniform`, :class:`Prioritized`); deterministic ones always pick the best item in their order
(:class:`Fifo`, :class:`Lifo`, :class:`MinHeap`, :class:`MaxHeap`; ties go to the item inserted first).

A selector is bound to one table (the table calls :meth:`Selector.bind` with its ``max_size``) and
addresses items by their table *slot*. Every selector owns a seeded ``numpy.random.Generator`` whose
state is part of :meth:`Selector.state_dict`, so a restored table samples exactly what the original
would have.

:class:`Prioritized` samples item ``i`` with probability ``P(i) = p_i^alpha / sum_j p_j^alpha`` from a
float64 sum tree, optionally stratified (draw ``j`` of ``B`` falls in the ``j``-th of ``B`` equal slices
of the total mass), and gives importance weights ``w_i = (N P(i))^-beta / max_j (N P(j))^-beta
= (P_min / P(i))^beta``, normalised by the largest weight of any item in the table (``P_min`` from a min
tree over items with positive priority). Items with priority 0 are never sampled. Draws that retire
items (``max_times_sampled``) report, for each later draw, ``P`` and the weight over the items left
(:meth:`Selector.sequential_weights`). The sum tree is part of rlflow's compiled core
(:class:`~rlflow.replay.sum_tree.SumTree`): a Python loop per item (or a tree rebuilt per update) costs 10x
more than the data gather itself.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from rlflow import _core
from rlflow.replay.sum_tree import SumTree

__all__ = ["Fifo", "Lifo", "MaxHeap", "MinHeap", "Prioritized", "Selector", "Uniform"]


class Selector(ABC):
    """Which item a table samples next (as its sampler) or evicts (as its remover); subclass it for your own.

    A table binds its selector once (:meth:`bind`, which sets :attr:`capacity` and calls :meth:`allocate`)
    and addresses items by their *slot* in ``0 .. capacity - 1``. A subclass implements:

    - :meth:`allocate`: make its structures for ``capacity`` slots;
    - :meth:`insert`, :meth:`update`, :meth:`delete`: items come, change priority and go (keeping
      :attr:`size`, the number of items held);
    - :meth:`sample`: ``n`` draws and the probability of each (random selectors draw with replacement; a
      ``deterministic = True`` selector returns its first ``n`` items in its order, probability 1);
    - :meth:`arrays` and :meth:`load_arrays`: the arrays a checkpoint keeps and restores (:attr:`rng`'s
      state and :attr:`size` are kept by this class); :meth:`config` returns the settings a restored table
      must share (default: the seed).

    Everything else has a default built on :meth:`sample`: :meth:`choose_for_removal` (distinct items to
    evict), :meth:`sample_with_weights` (importance weights 1), :meth:`sequential_weights` (what a table
    with ``max_times_sampled`` asks; a random selector must implement it to be used there),
    :meth:`draws_reachable` and :meth:`draw_rows`. The built-in selectors implement the same methods,
    some of them in the compiled core for speed.

    Args:
        seed: the seed of :attr:`rng`, the generator every random draw takes its numbers from.
    """

    deterministic: bool = False
    """True for a selector whose draws are its first items in a fixed order (FIFO, heaps)."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.capacity = 0
        self.size = 0

    def bind(self, capacity: int) -> None:
        """Serve one table of ``capacity`` slots (a table calls this once, when it is built)."""
        if self.capacity:
            raise ValueError(f"{self!r} is already bound to a table; give each table its own selector")
        self.capacity = int(capacity)
        self.allocate()

    @abstractmethod
    def allocate(self) -> None:
        """Make the structures for slots ``0 .. capacity - 1`` (:attr:`capacity` is set), holding no item."""

    @abstractmethod
    def insert(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray) -> None:
        """Add new items: ``slots`` (int64, none of them held), their ``priorities`` (float64 >= 0) and
        their insertion sequence numbers ``seqs`` (int64, increasing over the table's life)."""

    @abstractmethod
    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Change the priorities of held items (in order; a repeated slot keeps its last value)."""

    @abstractmethod
    def delete(self, slots: np.ndarray) -> None:
        """Remove held items."""

    @abstractmethod
    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Random selectors: ``n`` draws with replacement. Deterministic: the first ``n`` items in order.

        Returns ``(slots, probabilities)`` (int64 and float64, ``[n]``): each draw's slot and the probability
        it had; the table holds at least one item.
        """

    def choose_for_removal(self, n: int, live: Callable[[], np.ndarray]) -> np.ndarray:
        """``n`` distinct items to evict (``n <= size``), in the order a remover that deletes each before the
        next draw picks them; ``live`` gives the table's live slots (asked only when a selector's draws
        cannot reach every item, see :meth:`Prioritized.choose_for_removal`)."""
        if self.deterministic:
            return self.sample(n)[0]
        chosen = np.zeros(0, np.int64)
        while chosen.size < n:  # draw again for the repeats, keeping first draws in order
            draws = self.sample(n - chosen.size)[0]
            draws = draws[~np.isin(draws, chosen)]
            _, first = np.unique(draws, return_index=True)
            chosen = np.concatenate([chosen, draws[np.sort(first)]])
        return chosen

    def sample_with_weights(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`sample` plus the draws' importance weights (1 unless the selector is prioritized)."""
        slots, probabilities = self.sample(n)
        return slots, probabilities, np.ones(slots.size, np.float32)

    def sequential_weights(self, slots: np.ndarray, retires: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(probabilities, weights)`` of draws ``slots`` made one after another from the items held now,
        where a draw with ``retires`` set takes its item out of the draws after it (``max_times_sampled``):
        each draw's are those of a draw over the items still in. A deterministic selector's draws are
        certain: probability 1, weight 1; a random selector implements this to serve a table with
        ``max_times_sampled`` (the table asks at its construction)."""
        if not self.deterministic:
            raise NotImplementedError(f"{type(self).__name__}.sequential_weights: a table with max_times_sampled "
                                      "needs the probabilities of draws that retire items; implement it, or use "
                                      "the table without max_times_sampled")
        return np.ones(slots.size), np.ones(slots.size, np.float32)

    def draws_reachable(self, times: np.ndarray, limit: int, n: int) -> int:
        """How many of ``n`` draws the items this selector's draws can reach supply before ``limit``
        (``max_times_sampled``) retires them, given each slot's ``times`` sampled; the count may stop at
        ``n``. Draws reach every item here (the table counts their draws left): ``n``."""
        return n

    def draw_rows(self, n: int, meta: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`sample_with_weights` of ``n`` draws and a copy of each draw's record of the items' ``meta``,
        whose TIMES counts the draw: ``(slots, rows, probabilities, weights)``."""
        slots, probs, weights = self.sample_with_weights(n)
        return slots, _core.draw_rows(meta, slots), probs, weights

    def config(self) -> dict[str, Any]:
        """The settings a checkpoint records and a restored table's selector must share (JSON values)."""
        return {"seed": self.seed}

    def state_dict(self) -> dict[str, Any]:
        """:attr:`rng`'s state, :attr:`size` and :meth:`arrays` (what a table checkpoint keeps)."""
        return {"rng": self.rng.bit_generator.state, "size": self.size, **self.arrays()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (into a selector bound to a table of the same capacity)."""
        self.rng.bit_generator.state = state["rng"]
        self.size = int(state["size"])
        self.load_arrays(state)

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that hold the items (named freely, other than ``rng`` and ``size``): what a checkpoint
        saves. Arrays named ``items`` or ``order`` list the held slots (a restore checks them against the
        table's items); ``items``, ``order`` and ``seqs`` have one entry per held item; the others keep
        their shape from checkpoint to restore."""

    @abstractmethod
    def load_arrays(self, state: dict[str, Any]) -> None:
        """Rebuild the structures from :meth:`arrays`' output (under the same names in ``state``; the
        selector is bound, and :attr:`size` is restored)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


class Uniform(Selector):
    """Every item equally likely: ``P(i) = 1 / N``, draws with replacement.

    While at least half the slots are live, a draw picks a slot uniformly, which reads only a one-byte
    flag per draw, and a draw that hits an empty slot is made again from a packed array of the live
    slots (each draw is then exactly uniform over the live items); below half, every draw picks from
    the packed array.
    """

    def allocate(self) -> None:
        self._items = np.zeros(self.capacity, np.int64)
        self._where = np.full(self.capacity, -1, np.int64)
        self._live = np.zeros(self.capacity, np.bool_)

    def insert(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray) -> None:
        self.size = _core.dense_insert(self._items, self._where, self._live, self.size, slots)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass

    def delete(self, slots: np.ndarray) -> None:
        self.size = _core.dense_delete(self._items, self._where, self._live, self.size, slots)

    def _below(self, bound: int, n: int) -> np.ndarray:
        """``n`` integers uniform in ``[0, bound)`` (to 53-bit resolution: floor of a uniform double)."""
        return (self.rng.random(n) * bound).astype(np.int64)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if 2 * self.size >= self.capacity:
            slots = _core.uniform_pick(self.rng.random(2 * n), self._items, self._where, self._live, self.size)
        else:
            slots = self._items[self._below(self.size, n)]
        return slots, np.full(n, 1.0 / self.size)

    def sequential_weights(self, slots: np.ndarray, retires: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``j`` is uniform over the items left: ``1 / (size - items retired by the draws before it)``."""
        retires = np.asarray(retires, np.int64)
        left = self.size - (np.cumsum(retires) - retires)
        return 1.0 / left, np.ones(slots.size, np.float32)


    def arrays(self) -> dict[str, np.ndarray]:
        return {"items": self._items[: self.size].copy()}

    def load_arrays(self, state: dict[str, Any]) -> None:
        self._items[:] = 0
        self._where[:] = -1
        self._live[:] = False
        items = np.asarray(state["items"], np.int64)
        self._items[: items.size] = items
        self._where[items] = np.arange(items.size)
        self._live[items] = True


class Prioritized(Selector):
    """Proportional prioritized sampling (see the module docstring for the formulas).

    Args:
        alpha: priority exponent (0 = uniform, 1 = fully proportional).
        beta: importance-weight exponent; may be changed between samples (e.g. annealed to 1).
        stratified: draw each of a batch's ``B`` samples from its own slice of the total mass.
        seed: RNG seed.
    """

    def __init__(self, alpha: float = 0.6, beta: float = 0.4, *, stratified: bool = True,
                 seed: int | None = None) -> None:
        super().__init__(seed)
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {beta}")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.stratified = bool(stratified)

    def allocate(self) -> None:
        self.tree = SumTree(self.capacity)

    def insert(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray) -> None:
        self.tree.update(slots, priorities, self.alpha)  # priority 0 stays 0, also for alpha = 0
        self.size += slots.size

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.tree.update(slots, priorities, self.alpha)

    def delete(self, slots: np.ndarray) -> None:
        self.tree.update(slots, np.zeros(slots.size))
        self.size -= slots.size

    @property
    def total(self) -> float:
        """The priority mass ``sum_j p_j^alpha``."""
        return self.tree.total

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.sample_with_weights(n)[:2]

    def sample_with_weights(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.tree.total > 0.0:
            raise ValueError("cannot sample: every item in the table has priority 0")
        return self.tree.sample(self.rng.random(n), stratified=self.stratified, beta=self.beta)

    def sequential_weights(self, slots: np.ndarray, retires: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``j`` of an item of mass ``m``: ``P = m / (mass of the items left)`` and weight
        ``(m_min / m)^beta`` with ``m_min`` the smallest positive mass of the items left."""
        return self.tree.sequential(slots, retires, beta=self.beta)

    def draws_reachable(self, times: np.ndarray, limit: int, n: int) -> int:
        """The draws the items of positive priority have left (items of priority 0 are never drawn),
        counted until they reach ``n``."""
        return self.tree.draws_left(times, limit, n)

    def choose_for_removal(self, n: int, live: Callable[[], np.ndarray]) -> np.ndarray:
        """``n`` distinct items to evict: drawn one after another in proportion to ``p^alpha`` among the
        items not chosen yet (each chosen item's mass is set aside while the rest are drawn), then, once
        no item of positive priority is left, uniformly among the items of priority 0, which draws never
        reach (Reverb's prioritized selector also draws uniformly when every priority is 0). The tree is
        left as it was; the table deletes the chosen items."""
        tree = self.tree
        chosen = np.zeros(0, np.int64)
        masses = np.zeros(0, np.float64)
        while chosen.size < n and tree.total > 0.0:
            draws = tree.find(self.rng.random(n - chosen.size) * tree.total)
            _, first = np.unique(draws, return_index=True)
            new = draws[np.sort(first)]  # first draws in order; chosen items have no mass left to draw
            masses = np.concatenate([masses, tree.leaves[new]])
            tree.update(new, np.zeros(new.size))
            chosen = np.concatenate([chosen, new])
        tree.update(chosen, masses)  # the masses as they were
        if chosen.size < n:
            rest = np.setdiff1d(live(), chosen)  # sorted: the priority-0 items, by slot
            chosen = np.concatenate([chosen, self.rng.choice(rest, n - chosen.size, replace=False)])
        return chosen

    def priority_mass(self, slots: np.ndarray) -> np.ndarray:
        """``p^alpha`` of the given items, as held by the tree."""
        return self.tree.leaves[np.asarray(slots)]

    def config(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "beta": self.beta, "stratified": self.stratified, "seed": self.seed}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"leaves": self.tree.leaves.copy()}

    def load_arrays(self, state: dict[str, Any]) -> None:
        self.tree.set_leaves(state["leaves"])


class _InCore(Selector):
    """A selector whose items live in an object of the compiled core (``_structure``, made by :meth:`allocate`):
    pickled as :meth:`arrays`, rebuilt from them."""

    _structure: Any

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_structure"] = self.arrays() if self.capacity else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        arrays = state.pop("_structure")
        self.__dict__.update(state)
        if arrays is not None:
            self.allocate()
            self.load_arrays(arrays)


class _Ordered(_InCore):
    """A deterministic selector: a tournament tree over keys ``(k1, k2)``, smallest first (the compiled core's
    ``TournamentTree``, ``csrc/tournament_tree.h``)."""

    deterministic = True

    def allocate(self) -> None:
        self._structure = _core.TournamentTree(self.capacity)

    @abstractmethod
    def _keys(self, priorities: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def insert(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray) -> None:
        k1, k2 = self._keys(np.asarray(priorities, np.float64), np.asarray(seqs, np.int64))
        self._structure.set(np.asarray(slots, np.int64), k1, k2)
        self.size += slots.size

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass

    def delete(self, slots: np.ndarray) -> None:
        self._structure.clear(np.asarray(slots, np.int64))
        self.size -= slots.size

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self._structure.top(int(n))
        return slots, np.ones(slots.size)

    def arrays(self) -> dict[str, np.ndarray]:
        tree = self._structure
        return {"leaves": tree.leaves.copy(), "k1": tree.k1.copy(), "k2": tree.k2.copy()}

    def load_arrays(self, state: dict[str, Any]) -> None:
        self._structure.load(np.asarray(state["leaves"], np.int64), np.asarray(state["k1"], np.float64),
                        np.asarray(state["k2"], np.int64))


class _Insertion(_InCore):
    """Insertion order: a ring of (slot, seq) entries; deletes only mark the slot (O(1) each). The compiled
    core's ``InsertionRing`` (``csrc/insertion_ring.h``)."""

    deterministic = True
    newest = False

    def allocate(self) -> None:
        self._structure = _core.InsertionRing(self.capacity)

    def insert(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray) -> None:
        self._structure.push(np.asarray(slots, np.int64), np.asarray(seqs, np.int64))
        self.size += slots.size

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass

    def delete(self, slots: np.ndarray) -> None:
        self._structure.remove(np.asarray(slots, np.int64))
        self.size -= slots.size

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self._structure.first(int(n), self.newest)
        return slots, np.ones(slots.size)

    def arrays(self) -> dict[str, np.ndarray]:
        order = self._structure.first(self.size, False)
        return {"order": order, "seqs": self._structure.seq_of[order]}

    def load_arrays(self, state: dict[str, Any]) -> None:
        self._structure.clear()
        self._structure.push(np.asarray(state["order"], np.int64), np.asarray(state["seqs"], np.int64))


class Fifo(_Insertion):
    """Oldest item first (insertion order)."""


class Lifo(_Insertion):
    """Newest item first."""

    newest = True


class _Heap(_Ordered):
    sign = 1.0

    def _keys(self, priorities: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.sign * priorities, seqs

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self._structure.set_k1(np.asarray(slots, np.int64), self.sign * np.asarray(priorities, np.float64))


class MinHeap(_Heap):
    """Lowest priority first; equal priorities: the item inserted first."""


class MaxHeap(_Heap):
    """Highest priority first; equal priorities: the item inserted first."""

    sign = -1.0
