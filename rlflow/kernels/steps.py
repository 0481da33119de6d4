"""The block writer and the n-step item maker: the compiled half of rlflow's one write path.

A :class:`~rlflow.adders.StepBlock` holds ``T`` steps of ``E`` lanes. Writing it takes three calls:

- :func:`plan_block` reads each lane's step kinds from the block's flags and the lanes' open rows (a
  step that does not follow from its lane's state is reported, nothing changed) and counts the rows
  each lane will write, so that the tables drop the items of the rows about to be overwritten;
- :func:`write_block` writes every row and its episode marks, lane after lane (each lane's rows are
  one run of its ring), and records per step and lane the rows it wrote;
- :func:`nstep_items` turns those rows into n-step transition items (the other item kinds are made in
  Python from the same rows).

Arguments come as small structs (:class:`~rlflow.kernels.items.Rings`, :class:`RowColumns`, :class:`BlockData`,
:class:`ItemsOut`); columns travel as raw bytes: each store column a ``(rows, row_bytes)`` uint8 view,
each block column a ``(T, E, row_bytes)`` one, so one compiled function serves every field layout.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from rlflow.kernels import compiled, per_step
from rlflow.kernels.items import Rings, _mark_row, wrap
from rlflow.kernels.packed import Packed
from rlflow.kernels.prefetch import copy_bytes, prefetch_write

# What a step does on a lane (the flag table of rlflow.types): its open row gets the action and the lane
# goes on (CONTINUE), its episode ends (END), ends and the next starts at once (END_START), or a lane
# with no episode in progress starts one (START).
CONTINUE, END, END_START, START = 0, 1, 2, 3


class RowColumns(NamedTuple):
    """A store's columns as ``(lanes * capacity, row_bytes)`` uint8 views, grouped as a step fills them."""

    act: tuple  # the columns an action fills in: action, reward, extras
    obs: tuple  # the observation columns
    obs_stack: np.ndarray  # [observation columns] int64: the frames of each column's stacks (1: not stacked)
    terminated: np.ndarray  # [lanes * capacity] bool
    truncated: np.ndarray
    first: np.ndarray
    last: np.ndarray


# How put_step checks a column's values: not at all, finite (floats: no NaN or infinity), or within
# [low, high] compared as float64 (signed or unsigned integers). Values are read from their bytes
# (little-endian), so that one compiled function serves every dtype.
VALUE_NONE, FINITE, BOUNDS_SIGNED, BOUNDS_UNSIGNED = range(4)


class ValueChecks(NamedTuple):
    """Per column of a part of a block (in the block's column order): its check, bytes per value and bounds."""

    kinds: np.ndarray  # [columns] int64: VALUE_NONE, FINITE, BOUNDS_SIGNED or BOUNDS_UNSIGNED
    sizes: np.ndarray  # [columns] int64: bytes per value (floats: 4 or 8; integers: 1, 2, 4 or 8)
    low: np.ndarray  # [columns] float64
    high: np.ndarray


class BlockData(NamedTuple):
    """A block's steps: ``(T, E, row_bytes)`` uint8 views of its columns, its flags ``[T, E]`` and its lanes;
    the checks of its columns' values and each lane's state as steps are put."""

    act: tuple
    obs: tuple
    final: tuple
    first: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lanes: np.ndarray  # [E] int64: the store lane of each block lane
    act_checks: ValueChecks
    obs_checks: ValueChecks
    is_open: np.ndarray  # [E] bool: an episode in progress after the steps put
    was_open: np.ndarray  # [E] bool: the same before the last step put


class LaneState(NamedTuple):
    """An adder's per-lane state (``[lanes]`` int64): the open row (-1: none) and its episode's first row."""

    open_rows: np.ndarray
    episode_start: np.ndarray


class Store(NamedTuple):
    """What the block writer reads and writes of a store and an adder: the lanes' open rows, the rings, the
    columns."""

    state: LaneState
    rings: Rings
    cols: RowColumns


class ItemsOut(NamedTuple):
    """Where :func:`nstep_items` writes its items (one entry per item)."""

    lanes: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    returns: np.ndarray  # [items, reward_size] float32
    discounts: np.ndarray  # [items] float32


class NStep(NamedTuple):
    """The n-step rule: ``n``, the powers ``g^0 .. g^n`` and the store's rewards ``(rows, reward_size)``."""

    n: int
    powers: np.ndarray
    rewards: np.ndarray
    capacity: int


class NStepItems(NamedTuple):
    """What :func:`nstep_items` reads (the rule) and where it writes (the items): one packed argument."""

    rule: NStep
    out: ItemsOut


@compiled
def plan_block(a: int, steps: int, packed_block: Packed, packed_store: Packed, codes: np.ndarray,
               new_rows: np.ndarray) -> int:
    """Each kind of the block's steps ``a .. a + steps - 1`` per lane (``codes[s - a, e]``) and the rows each
    lane writes (``new_rows[e]``); ``packed_block``: a :class:`BlockData`, ``packed_store``: a :class:`Store`.

    Returns -1 when every step follows from its lane's state, else the first step ``s`` that does not
    (a lane with no episode in progress that does not start one, a start while an episode goes on, or
    ``last`` and ``first`` that do not fit): nothing is changed then but the outputs.
    """
    block = packed_block.value
    state = packed_store.value.state
    for e in range(block.lanes.shape[0]):
        is_open = state.open_rows[block.lanes[e]] >= 0
        rows = 0
        for s in range(steps):
            first = block.first[a + s, e]
            last = block.terminated[a + s, e] or block.truncated[a + s, e]
            if is_open:
                if first and last:
                    codes[s, e] = END_START
                    rows += 2
                elif first:
                    return s
                elif last:
                    codes[s, e] = END
                    rows += 1
                    is_open = False
                else:
                    codes[s, e] = CONTINUE
                    rows += 1
            elif first and not last:
                codes[s, e] = START
                rows += 1
                is_open = True
            else:
                return s
        new_rows[e] = rows
    return -1


@njit(inline="always", cache=True)
def _copy_row(col: np.ndarray, i: int, data: np.ndarray, e: int) -> None:
    """Row ``i`` of store column ``col`` gets the trailing bytes of block row ``e`` of ``data``: all of them, or
    the newest frame of a stacked column's stack (its last frame, the last bytes of the row)."""
    w, width = col.shape[1], data.shape[1]
    copy_bytes(col, i * w, data, e * width + width - w, w)


@compiled
def write_block(a: int, steps: int, packed_block: Packed, codes: np.ndarray, packed_store: Packed,
                rows: np.ndarray) -> None:
    """Write the planned steps ``a .. a + steps - 1`` (:func:`plan_block`) of every block lane, lane after lane.

    An open row gets its action columns (action, reward, extras) and flags; an ended lane gets its final
    row (the final observation, zero action columns, ``last``); a lane that goes on or starts gets a new
    open row (``first`` on a start). Updates the lanes' open rows and episode starts. ``rows[s, :, e]``
    gets the step's final row, the first row of the episode its action belongs to (the ended one, or the
    one going on) and its new open row, each -1 if none.
    """
    block = packed_block.value
    state, rings, cols = packed_store.value.state, packed_store.value.rings, packed_store.value.cols
    capacity = rings.capacity
    for e in range(block.lanes.shape[0]):  # each lane's first lines requested at once: their misses overlap
        lane = block.lanes[e]
        i = lane * capacity + wrap(rings.written[lane], capacity)
        for j in range(len(cols.obs)):
            prefetch_write(cols.obs[j], i * cols.obs[j].shape[1])
        prefetch_write(cols.first, i)
        prefetch_write(rings.episode_id, i)
    for e in range(block.lanes.shape[0]):
        lane = block.lanes[e]
        base = lane * capacity
        for k in range(steps):
            s = a + k
            c = codes[k, e]
            final = new = -1
            episode = state.episode_start[lane] if c != START else -1
            if c != START:
                i = base + wrap(state.open_rows[lane], capacity)
                for j in range(len(cols.act)):
                    _copy_row(cols.act[j], i, block.act[j][s], e)
                cols.terminated[i] = block.terminated[s, e]
                cols.truncated[i] = block.truncated[s, e]
            if c == END or c == END_START:
                final = _mark_row(rings.episode_id, rings.episode_step, rings.next_episode, rings.next_step,
                                  rings.written, lane, False, capacity)
                i = base + wrap(final, capacity)
                for j in range(len(cols.obs)):
                    _copy_row(cols.obs[j], i, block.final[j][s], e)
                for j in range(len(cols.act)):
                    col = cols.act[j]
                    for b in range(col.shape[1]):
                        col[i, b] = 0
                cols.terminated[i] = False
                cols.truncated[i] = False
                cols.first[i] = False
                cols.last[i] = True
                state.open_rows[lane] = -1
            if c != END:
                begins = c != CONTINUE
                new = _mark_row(rings.episode_id, rings.episode_step, rings.next_episode, rings.next_step,
                                rings.written, lane, begins, capacity)
                i = base + wrap(new, capacity)
                for j in range(len(cols.obs)):
                    _copy_row(cols.obs[j], i, block.obs[j][s], e)
                cols.first[i] = begins
                cols.last[i] = False
                state.open_rows[lane] = new
                if begins:
                    state.episode_start[lane] = new
            rows[k, 0, e] = final
            rows[k, 1, e] = episode
            rows[k, 2, e] = new


@njit(inline="always", cache=True)
def _nstep_item(m: int, lane: int, start: int, k: int, discount: float, rule: NStep, out: ItemsOut) -> None:
    out.lanes[m] = lane
    out.starts[m] = start
    out.lengths[m] = k + 1
    out.discounts[m] = discount
    base = lane * rule.capacity
    for c in range(rule.rewards.shape[1]):
        acc = 0.0
        for j in range(k):
            acc += rule.powers[j] * rule.rewards[base + wrap(start + j, rule.capacity), c]
        out.returns[m, c] = acc


@compiled
def nstep_items(a: int, steps: int, codes: np.ndarray, rows: np.ndarray, terminated: np.ndarray, lanes: np.ndarray,
                final_was_open: bool, packed: Packed) -> int:
    """The n-step transition items that the written steps ``a .. a + steps - 1`` complete (``codes`` and
    ``rows`` from step ``a`` on, ``terminated`` the block's); returns how many (``packed``: an
    :class:`NStepItems`, its ``out`` sized ``n E T``). Step after step, as separate
    steps would give them: first each lane that goes on and whose window of ``n`` actions now ends at its
    new open row, then every start within ``n`` rows of each ended lane's final row, with
    ``k = final - start`` and discount 0 on termination (after :meth:`~rlflow.adders.Adder.truncate` the
    final row was the open row: ``final_was_open``, its full-length window exists already). Returns are
    float64 sums of ``g^j r_(start+j)``, stored as float32.
    """
    rule = packed.value.rule
    out = packed.value.out
    n = rule.n
    m = 0
    for s in range(steps):
        for e in range(lanes.shape[0]):
            if codes[s, e] == CONTINUE:
                start = rows[s, 2, e] - n
                if start >= rows[s, 1, e]:
                    _nstep_item(m, lanes[e], start, n, rule.powers[n], rule, out)
                    m += 1
        for e in range(lanes.shape[0]):
            if codes[s, e] == END or codes[s, e] == END_START:
                final = rows[s, 0, e]
                for start in range(max(rows[s, 1, e], final - n + (1 if final_was_open else 0)), final):
                    k = min(n, final - start)
                    disc = 0.0 if terminated[a + s, e] and start + k == final else rule.powers[k]
                    _nstep_item(m, lanes[e], start, k, disc, rule, out)
                    m += 1
    return m


# What put_step says of a step (the lane at fault goes to ``at[0]``).
LAST_MISMATCH, NO_EPISODE, STARTS_IN_EPISODE, ENDS_NO_EPISODE, ACTION_VALUE, OBSERVATION_VALUE = range(1, 7)
# put_step's bits of what a good step needs: an observation (some lane opens a row), final observations
# (some lane's episode ends).
NEEDS_OBSERVATION, NEEDS_FINAL = 1, 2


@njit(cache=True)
def _value_fault(row: np.ndarray, kind: int, size: int, low: float, high: float) -> bool:
    """Whether one lane's row of a column (its bytes, little-endian values of ``size`` bytes) fails the
    column's check."""
    if kind == VALUE_NONE:
        return False
    n = row.shape[0] // size
    if kind == FINITE:  # NaN and the infinities have every exponent bit set
        mask = 0xF0 if size == 8 else 0x80  # the exponent's low bits in the byte below the top one
        for i in range(n):
            top = i * size + size - 1
            if row[top] & 0x7F == 0x7F and row[top - 1] & mask == mask:
                return True
        return False
    for i in range(n):
        v = np.int64(0)
        for k in range(size):  # the value's bits (8 bytes: wrapping into int64's sign bit)
            v |= np.int64(row[i * size + k]) << np.int64(8 * k)
        negative = row[i * size + size - 1] >= 128
        if size < 8 and kind == BOUNDS_SIGNED and negative:
            v -= np.int64(1) << np.int64(8 * size)
        x = float(v)
        if size == 8 and kind == BOUNDS_UNSIGNED and negative:
            x += 18446744073709551616.0  # 2 ** 64: a value of 2 ** 63 or more
        if x < low or x > high:
            return True
    return False


@njit(cache=True)
def _lane_fault(rows: np.ndarray, kind: int, size: int, low: float, high: float) -> int:
    """The first lane whose row (``rows``: ``[E, row_bytes]``) fails the check, or -1."""
    if kind != VALUE_NONE:
        for e in range(rows.shape[0]):
            if _value_fault(rows[e], kind, size, low, high):
                return e
    return -1


@per_step
def put_step(packed_block: Packed, s: int, first: np.ndarray, last: np.ndarray, terminated: np.ndarray,
             truncated: np.ndarray, check_obs: bool, at: np.ndarray) -> int:
    """Check step ``s`` of a block, its values already copied to row ``s`` of its columns, and put it: its
    flags (``[E]`` bool each, :class:`rlflow.types.TimeStep`'s) must follow from each lane's state
    (``is_open``), its action columns' values and (with ``check_obs``, where some lane needs them) its
    observations' must pass their checks. A good step's flags are recorded as step ``s`` and each lane's
    state advances (the state before goes to ``was_open``); returns ``-1 - needs`` (``NEEDS_*`` bits).
    Otherwise nothing changes and it returns the fault: a flag status (its lane in ``at[0]``), or
    ``ACTION_VALUE`` / ``OBSERVATION_VALUE`` (lane ``at[0]``, column ``at[1]``)."""
    b = packed_block.value
    is_open = b.is_open
    needs = 0
    for e in range(is_open.shape[0]):
        if last[e] != (terminated[e] or truncated[e]):
            at[0] = e
            return LAST_MISMATCH
        if is_open[e]:
            if first[e] and not last[e]:
                at[0] = e
                return STARTS_IN_EPISODE
        elif not first[e]:
            at[0] = e
            return NO_EPISODE
        elif last[e]:
            at[0] = e
            return ENDS_NO_EPISODE
        if last[e]:
            needs |= NEEDS_FINAL
        if first[e] or not last[e]:
            needs |= NEEDS_OBSERVATION
    for j in range(len(b.act)):  # each column's values, lane by lane
        c = b.act_checks
        at[0] = _lane_fault(b.act[j][s], c.kinds[j], c.sizes[j], c.low[j], c.high[j])
        if at[0] >= 0:
            at[1] = j
            return ACTION_VALUE
    for j in range(len(b.obs) if check_obs and needs & NEEDS_OBSERVATION else 0):
        c = b.obs_checks
        at[0] = _lane_fault(b.obs[j][s], c.kinds[j], c.sizes[j], c.low[j], c.high[j])
        if at[0] >= 0:
            at[1] = j
            return OBSERVATION_VALUE
    for e in range(is_open.shape[0]):
        b.first[s, e] = first[e]
        b.terminated[s, e] = terminated[e]
        b.truncated[s, e] = truncated[e]
        b.was_open[e] = is_open[e]
        is_open[e] = (is_open[e] and not last[e]) or first[e]
    return -1 - needs


# What each env's last ReplayBuffer call left: no episode in progress, one in progress (its last next_obs
# is the open row), or one that ended at that call (a NEXT_STEP reset step may follow).
NO_EPISODE_YET, IN_EPISODE, ENDED = 0, 1, 2
# classify_calls's bits: some env starts an episode before its transition, some env's episode ends.
ANY_START, ANY_LAST = 1, 2


# The rows of classify_calls's output (``[5, E]`` bool, one column per env): the given flags (termination
# wins over truncation), ``last``, a NEXT_STEP reset step (next_obs starts the env's next episode, no
# transition), and an episode that starts at obs before the transition (the one before, if any, is over).
CALL_TERMINATED, CALL_TRUNCATED, CALL_LAST, CALL_RESET, CALL_STARTS = 0, 1, 2, 3, 4


@per_step
def classify_calls(state: np.ndarray, was: np.ndarray, same: np.ndarray, terminated: np.ndarray,
                   truncated: np.ndarray, reward: np.ndarray, out: np.ndarray) -> int:
    """Sort each env's call (``state``: what its last call left; ``same``: its ``obs`` is, bit for bit, its
    last next_obs; ``reward``: ``[E, k]``) and advance ``state`` to what the call leaves once written (the
    state before goes to ``was``; an end whose final observation comes from the env's info leaves
    ``NO_EPISODE_YET`` instead of ``ENDED``, which the caller sets); returns the ``ANY_*`` bits. A call
    right after an episode end whose ``obs`` is that end's next_obs, with reward 0 and neither flag, is a
    reset step."""
    bits = 0
    for e in range(state.shape[0]):
        term = terminated[e]
        trunc = truncated[e] and not term
        last = term or trunc
        zero = True
        for k in range(reward.shape[1]):
            if reward[e, k] != 0:
                zero = False
        going_on = same[e] and state[e] != NO_EPISODE_YET
        reset = state[e] == ENDED and going_on and not last and zero
        starts = not (state[e] == IN_EPISODE and going_on) and not reset
        out[CALL_TERMINATED, e] = term
        out[CALL_TRUNCATED, e] = trunc
        out[CALL_LAST, e] = last
        out[CALL_RESET, e] = reset
        out[CALL_STARTS, e] = starts
        if starts:
            bits |= ANY_START
        if last:
            bits |= ANY_LAST
        was[e] = state[e]
        state[e] = ENDED if last else IN_EPISODE
    return bits


@compiled
def overwritten(packed_rings: Packed, lanes: np.ndarray, new_rows: np.ndarray, ranges: np.ndarray) -> int:
    """The rows that writing ``new_rows[i]`` rows to each of ``lanes`` overwrites, as ``ranges[j] = (lane, lo,
    hi)`` (rows ``lo .. hi - 1``); returns how many lanes overwrite any. ``packed_rings``: the store's
    :class:`~rlflow.kernels.items.Rings`, packed. With frame stacks (``rings.reach``) the range goes on over the
    rows after it whose stacks read an overwritten row (rows of the same episode, up to ``reach``): their items
    go too."""
    rings = packed_rings.value
    capacity = rings.capacity
    m = 0
    for i in range(lanes.shape[0]):
        lane = lanes[i]
        c = rings.written[lane]
        lo = max(c - capacity, 0)
        hi = c + new_rows[i] - capacity
        if hi > lo:
            end = hi
            while end < c and end - hi < rings.reach and rings.episode_step[lane, wrap(end, capacity)] > end - hi:
                end += 1
            ranges[m, 0] = lane
            ranges[m, 1] = lo
            ranges[m, 2] = end
            m += 1
    return m


# How a block's frame stacks fail :func:`check_stacks`: a stack that does not continue the stack before it in
# its episode (its frames but the newest are not that stack's newest frames), or an episode's first stack
# that is not its first frame repeated.
STACK_BREAK, STACK_START = 1, 2


@njit(inline="always", cache=True)
def _differ(x: np.ndarray, xo: int, y: np.ndarray, yo: int, n: int) -> bool:
    """Whether bytes ``x[xo : xo + n]`` and ``y[yo : yo + n]`` differ (one pass, no early exit: vectorised)."""
    acc = np.uint8(0)
    for b in range(n):
        acc |= x[xo + b] ^ y[yo + b]
    return acc != 0


@compiled
def check_stacks(a: int, steps: int, packed_block: Packed, codes: np.ndarray, packed_store: Packed,
                 at: np.ndarray) -> int:
    """Check the frame stacks of the planned steps ``a .. a + steps - 1`` (:func:`plan_block`) before they are
    written: a row that goes on from its lane's open row (the next observation, or the final one) must hold
    that row's stack shifted by one frame, and an episode's first row its newest frame repeated.

    Returns 0, or :data:`STACK_BREAK` or :data:`STACK_START` with ``at = (block lane, step, observation
    column)`` of the first row that fails (nothing is changed).
    """
    block = packed_block.value
    state, rings, cols = packed_store.value.state, packed_store.value.rings, packed_store.value.cols
    capacity = rings.capacity
    for j in range(len(cols.obs)):
        k = cols.obs_stack[j]
        if k < 2:
            continue
        w = cols.obs[j].shape[1]
        for e in range(block.lanes.shape[0]):
            lane = block.lanes[e]
            prev = -1  # the block step whose observation is the lane's open row (-1: the store's open row)
            for kk in range(steps):
                s = a + kk
                c = codes[kk, e]
                if c != START:
                    new = block.obs[j][s, e] if c == CONTINUE else block.final[j][s, e]
                    if prev >= 0:
                        bad = _differ(new, 0, block.obs[j][prev, e], w, (k - 1) * w)
                    else:
                        r = state.open_rows[lane]
                        es = rings.episode_step[lane, wrap(r, capacity)]
                        bad = False
                        for f in range(1, k):  # frame f of the open row's stack is frame f - 1 of the new one
                            src = cols.obs[j][lane * capacity + wrap(r - min(k - 1 - f, es), capacity)]
                            bad |= _differ(new, (f - 1) * w, src, 0, w)
                    if bad:
                        at[0], at[1], at[2] = e, s, j
                        return STACK_BREAK
                if c == START or c == END_START:
                    new = block.obs[j][s, e]
                    for f in range(k - 1):
                        if _differ(new, f * w, new, (k - 1) * w, w):
                            at[0], at[1], at[2] = e, s, j
                            return STACK_START
                prev = s
    return 0
