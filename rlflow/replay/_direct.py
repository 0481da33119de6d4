"""A table's structures, updated in place by a compiled write path (``NStepTransition.add_steps``).

A write of ``T`` rows of one lane evicts the items starting at the rows it overwrites and inserts the
items it completes. Through :class:`~rlflow.replay.Table`'s methods that is a dozen compiled calls and
some forty Python-level steps. :func:`evict` and :func:`insert` do the same inside one compiled call:
the same kernels (``evict_range``, ``add_items``, the selectors' ``dense_*``, ``ring_*`` and sum
tree updates) in the same order, so the table ends in exactly the state the methods leave (tests
compare the two, selector states and RNGs included). The windows an n-step write inserts lie in one
episode one after the other, so :func:`insert` checks their span once where ``Table.insert`` checks
each window. :class:`Arrays` hands the kernels a table's arrays,
and :func:`settle` updates the Python-side counters (sizes, free slots, rate limiter) afterwards.

Only the common tables take this path: a :class:`~rlflow.replay.Uniform` or
:class:`~rlflow.replay.Prioritized` sampler, a :class:`~rlflow.replay.Fifo` remover, no items sharing a
start row, and scalar item fields ``return`` and ``discount``; or a :class:`~rlflow.replay.RowTable` with
those fields (kind ``ROWS``: each item written to its start row's slot, an overwritten row's slot
emptied, as ``RowTable``'s methods do). Everything else takes the methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.experimental import structref

from rlflow.replay import _row_kernels as _rows
from rlflow.replay._item_kernels import KEY, add_items, evict_range, item_key, set_meta, wrap
from rlflow.replay._kernels import dense_delete, dense_insert, ring_delete, ring_push
from rlflow.replay._prefetch import AHEAD, prefetch
from rlflow.replay.row_table import RowTable, _RowItems
from rlflow.replay.selectors import Fifo, Prioritized, Uniform
from rlflow.replay.sum_tree import _update
from rlflow.replay.table import Table
from rlflow.specs import Field

UNIFORM, PRIORITIZED, ROWS = 0, 1, 2
_I = np.zeros(1, np.int64)
_I2 = np.zeros((1, 1), np.int64)
_B = np.zeros(1, np.bool_)
_F = np.zeros(1, np.float64)
# Slots of the int64 state array the kernels read and update: free slots, next insertion number, and
# the Uniform sampler's size.
NUM_FREE, NEXT_SEQ, UNIFORM_SIZE = range(3)


def _rows_tab(meta: np.ndarray, ret: np.ndarray, disc: np.ndarray) -> tuple:
    """The ``tab`` of a RowTable (kind ``ROWS``): its records and its return and discount columns."""
    return (meta, _F, _I2, _I, ret, disc, _I, _I, _B, _F, _F, _I, _I, _I, _I, _I)


def _no_rows() -> tuple:
    """A RowTable's ``tab`` of two empty slots, for compiled writes that place no items: of the same numba
    types as a real table's, so one compilation serves every call."""
    items = _RowItems(2, 1, {"return": Field((), np.float32), "discount": Field((), np.float32)})
    return _rows_tab(items.meta, items.columns["return"], items.columns["discount"])


NO_ROWS = _no_rows()
NO_STATE = np.zeros(3, np.int64)  # their state (never written: no items are placed)


class Arrays:
    """A table's arrays for :func:`evict` and :func:`insert`, gathered once: each is updated in place for the
    life of the table's items and selectors (checkpoint restores included). ``tab`` is None when the
    table's kind needs the general path; ``fields`` name its two scalar item fields (return, discount)."""

    def __init__(self, table: Table, fields: tuple[str, str]) -> None:
        self.items, self.sampler, self.remover = table._items, table.sampler, table.remover
        self.kind, self.tab = UNIFORM, None
        self.state = np.zeros(3, np.int64)
        sampler, remover, items = self.sampler, self.remover, self.items
        cols = items.columns
        ret, disc = cols.get(fields[0]), cols.get(fields[1])
        if ret is None or disc is None or ret.ndim != 1 or disc.ndim != 1 or len(cols) != 2:
            return
        if type(table) not in (Table, RowTable):
            return  # a subclass may change what an insert or an overwrite does: its own methods then run
        if type(table) is RowTable:  # slots are rows: no free list, row index or selectors
            self.kind = ROWS
            self.tab = _rows_tab(items.meta, ret, disc)
            return
        if type(remover) is not Fifo:
            return
        if type(sampler) is Uniform:
            sel = (sampler._items, sampler._where, sampler._live, _F, _F, _I)
        elif type(sampler) is Prioritized:
            tree = sampler.tree
            self.kind, sel = PRIORITIZED, (_I, _I, _B, tree.sums, tree.mins, tree.offsets)
        else:
            return
        self.tab = (items.meta, items.priority, items.row_slot, items.free, ret, disc, *sel, remover._ring_slot,
                    remover._ring_seq, remover._ht, remover._seq_of)

    def of(self, table: Table) -> bool:
        """Whether these are still ``table``'s arrays."""
        return table._items is self.items and table.sampler is self.sampler and table.remover is self.remover

    def ready(self) -> bool:
        """Whether the kernels can take the table now (its kind fits, no items share a start row); if so,
        loads its counters into ``state``."""
        items = self.items
        if self.tab is None or items.overflow:
            return False
        state = self.state
        state[NUM_FREE] = items.num_free
        state[NEXT_SEQ] = items.next_seq
        state[UNIFORM_SIZE] = self.sampler.size
        return True

    @property
    def alpha(self) -> float:
        return self.sampler.alpha if self.kind == PRIORITIZED else 1.0


def settle(table: Table, state: np.ndarray, evicted: int, times: int, inserted: int = 0, clashes: int = 0,
           slots: Any = None, lanes: Any = None, starts: Any = None, clash: Any = None) -> None:
    """The Python-side counters after :func:`evict` (``evicted`` items with ``times`` samples between
    them) and :func:`insert` (``inserted`` items in ``slots``, ``clashes`` of them marked in ``clash``
    as sharing a start row with another item)."""
    items, sampler, remover, limiter = table._items, table.sampler, table.remover, table.rate_limiter
    items.num_free, items.next_seq, uniform_size = state.tolist()
    items.times_total -= times
    sampler.size = uniform_size if type(sampler) is Uniform else sampler.size + inserted - evicted
    remover.size += inserted - evicted
    if clashes:  # ``clash`` may hold only the last of several writes' items: its clashes are the ones left
        clashed = np.flatnonzero(clash[:inserted])
        items._overflow_add(slots[clashed], lanes[clashed], starts[clashed] % items.capacity)
    if inserted:  # before the deletes: a call writing several episodes may evict items it inserted itself
        limiter.insert(inserted)
    if evicted:
        limiter.delete(evicted)
    table._wake()


@njit(inline="always", cache=True)
def evict(tab: tuple, kind: int, state: np.ndarray, lane: int, lo: int, hi: int, capacity: int) -> tuple[int, int]:
    """``Table.on_overwrite_range(lane, lo, hi)``: drop the items starting at rows ``lo .. hi - 1``.
    Returns how many, and their times sampled summed."""
    meta, row_slot, free = tab[0], tab[2], tab[3]
    if kind == ROWS:
        m, times = _rows.evict_range(meta, lane, lo, hi, capacity)
        state[NUM_FREE] += m
        return m, times
    slots, times = evict_range(meta, row_slot, free, state[NUM_FREE], lane, lo, hi, capacity)
    m = slots.shape[0]
    if m:
        state[NUM_FREE] += m
        if kind == UNIFORM:
            state[UNIFORM_SIZE] = dense_delete(tab[6], tab[7], tab[8], state[UNIFORM_SIZE], slots)
        else:
            _update(tab[9], tab[10], tab[11], slots, np.zeros(m), 1.0)
        ring_delete(tab[12], tab[13], tab[14], tab[15], slots)
    return m, times


@njit(inline="always", cache=True)
def insert(tab: tuple, kind: int, alpha: float, state: np.ndarray, count: np.ndarray, episode_id: np.ndarray,
           capacity: int, cross_episodes: bool, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
           returns: np.ndarray, discounts: np.ndarray, slots: np.ndarray, keys: np.ndarray,
           clash: np.ndarray) -> tuple[int, int]:
    """``Table.insert`` of ``lanes.shape[0] >= 1`` items with priority 1 and fields (return, discount), given
    room for all and the rate limiter's consent, for the windows an n-step write makes: one lane's, inside
    one episode, starts and ends not decreasing. Their span (the first start to the last end) is checked
    once: stored, and in one episode unless ``cross_episodes``. That is ``check_windows`` of each window,
    whose valid length is then its length. Returns 0 when the span fails (nothing inserted: a broken
    invariant), -2 when a RowTable's slot is taken (nothing inserted: the table's own insert raises) or -1,
    and how many items share their start row with another (``clash``)."""
    m = lanes.shape[0]
    lane, lo, hi = lanes[0], starts[0], starts[m - 1] + lengths[m - 1]
    c = count[lane]
    if lo < max(c - capacity, 0) or hi > c or (
            not cross_episodes and episode_id[lane, wrap(lo, capacity)] != episode_id[lane, wrap(hi - 1, capacity)]):
        return 0, 0
    meta, priority, row_slot, free = tab[0], tab[1], tab[2], tab[3]
    if kind == ROWS:
        return (-1 if place_rows(tab, state, capacity, lanes, starts, lengths, returns, discounts, keys) else -2), 0
    prios = np.ones(m)
    clashes = add_items(meta, priority, row_slot, free, state[NUM_FREE], state[NEXT_SEQ], lanes, starts, lengths,
                        lengths, prios, capacity, slots, keys, clash)
    ret, disc = tab[4], tab[5]
    seqs = np.empty(m, np.int64)
    for j in range(m):
        s = slots[j]
        ret[s] = returns[j, 0]
        disc[s] = discounts[j]
        seqs[j] = state[NEXT_SEQ] + j
    state[NUM_FREE] -= m
    state[NEXT_SEQ] += m
    if kind == UNIFORM:
        state[UNIFORM_SIZE] = dense_insert(tab[6], tab[7], tab[8], state[UNIFORM_SIZE], slots)
    else:
        _update(tab[9], tab[10], tab[11], slots, prios, alpha)
    ring_push(tab[12], tab[13], tab[14], tab[15], slots, seqs)
    return -1, clashes


@njit(inline="always", cache=True)
def place_rows(tab: tuple, state: np.ndarray, capacity: int, lanes: np.ndarray, starts: np.ndarray,
               lengths: np.ndarray, returns: np.ndarray, discounts: np.ndarray, keys: np.ndarray) -> bool:
    """Items with fields (return, discount) into a RowTable (``tab`` of kind ``ROWS``), each in its start row's
    slot, as ``RowTable._insert_now`` places them (windows known to be stored, in one episode: valid length
    = length). False, having placed nothing, when a slot holds an item."""
    meta, ret, disc = tab[0], tab[4], tab[5]
    m = lanes.shape[0]
    width, total = meta.shape[1], meta.shape[0]
    nl = total // capacity
    for j in range(m):
        if j + AHEAD < m:  # scattered slots (one lane's items, lanes apart): requested ahead
            prefetch(meta, (wrap(starts[j + AHEAD], capacity) * nl + lanes[j + AHEAD]) * width)
        if meta[wrap(starts[j], capacity) * nl + lanes[j], KEY] != -1:
            return False
    seq = state[NEXT_SEQ]
    for j in range(m):
        s = wrap(starts[j], capacity) * nl + lanes[j]
        key = item_key(seq + j, total, s)
        set_meta(meta, s, key, lanes[j], starts[j], lengths[j], lengths[j])
        ret[s] = returns[j, 0]
        disc[s] = discounts[j]
        keys[j] = key
    state[NUM_FREE] -= m
    state[NEXT_SEQ] += m
    return True


# ---------------------------------------------------------------------------------------------- the bag
# Each argument of a compiled call is type-checked and unboxed on every call; a one-lane write takes some
# forty arrays that stay the same from call to call (the store's columns and counters, the table's
# structures, the output buffers). A LaneBag holds them as one argument, so each call passes only what
# changes (docs/adders.md has the one-lane add before and after).


@structref.register
class LaneBagType(types.StructRef):
    def preprocess_fields(self, fields: Any) -> Any:
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class LaneBag(structref.StructRefProxy):
    """The arrays the one-lane write kernels take that stay the same from call to call (see :func:`make_bag`)."""


BAG_FIELDS = ("checks", "count", "episode_id", "episode_step", "next_episode", "next_step", "capacity", "act_col",
              "rew_col", "obs_col", "term_col", "trunc_col", "first_col", "last_col", "powers", "tab", "kind",
              "state", "lanes", "starts", "lengths", "returns", "discounts", "slots", "keys", "clash", "out", "acc")
structref.define_proxy(LaneBag, LaneBagType, list(BAG_FIELDS))


@njit(cache=True)
def make_bag(checks: np.ndarray, count: np.ndarray, episode_id: np.ndarray, episode_step: np.ndarray,
             next_episode: np.ndarray, next_step: np.ndarray, capacity: int, act_col: np.ndarray, rew_col: np.ndarray,
             obs_col: np.ndarray, term_col: np.ndarray, trunc_col: np.ndarray, first_col: np.ndarray,
             last_col: np.ndarray, powers: np.ndarray, tab: tuple, kind: int, state: np.ndarray, lanes: np.ndarray,
             starts: np.ndarray, lengths: np.ndarray, returns: np.ndarray, discounts: np.ndarray, slots: np.ndarray,
             keys: np.ndarray, clash: np.ndarray, out: np.ndarray, acc: np.ndarray) -> LaneBag:
    """A :class:`LaneBag` of these arrays (the argument names of :func:`rlflow.adders._kernels.lane_steps_direct`;
    ``acc`` is :func:`~rlflow.adders._kernels.lane_segments_bag`'s). Built by a cached compiled function:
    building one through the proxy class would compile its constructor in every process."""
    return LaneBag(checks, count, episode_id, episode_step, next_episode, next_step, capacity, act_col, rew_col,
                   obs_col, term_col, trunc_col, first_col, last_col, powers, tab, kind, state, lanes, starts,
                   lengths, returns, discounts, slots, keys, clash, out, acc)
