"""Compiled kernels of the adders' write path (numba, cached).

One ``Adder.add`` on ``E`` lanes writes a few hundred bytes per lane, scattered over the store's rings
(each lane's cursor is elsewhere). Done with numpy it is some forty calls per step, and their overhead,
not the memory traffic, is the cost. Here it is three calls: :func:`plan_step` checks each lane's flags
against its state and lists the rows the step overwrites (so the tables can drop their items first),
:func:`write_steps` writes every row and its episode marks, and :func:`nstep_items` turns what happened
into n-step transition items. The semantics are those of :mod:`rlflow.adders.base` and
:mod:`rlflow.adders.transition`; tests compare this path with the general one.

Columns reach the kernels as raw bytes: each store column as a ``(rows, row_bytes)`` uint8 view, each
input as ``(E, row_bytes)``, grouped in tuples (all one numba type, whatever the fields' dtypes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rlflow.replay import _direct
from rlflow.replay import _row_kernels as _rows
from rlflow.replay._item_kernels import KEY, TIMES, _mark_row, all_finite, item_key, set_meta, within, wrap
from rlflow.replay._prefetch import copy_bytes, prefetch_write
from rlflow.specs import BOUNDS, FINITE  # how a value is checked before it is staged (specs.check_mode)

_OPTS = {"cache": True, "nogil": True}

_SLOTS_AHEAD = 8  # rows ahead whose RowTable slots write_steps requests

# What a step did on a lane (see the flag table in rlflow.types).
CONTINUE, END, END_START, START = 0, 1, 2, 3
# What write_steps does with the n-step items its steps complete.
NO_ITEMS, STEP_ITEMS, ROW_ITEMS = 0, 1, 2


@njit(**_OPTS)
def plan_step(open_rows: np.ndarray, first: np.ndarray, last: np.ndarray, terminated: np.ndarray,
              truncated: np.ndarray, count: np.ndarray, capacity: int, code: np.ndarray, old_lanes: np.ndarray,
              old_rows: np.ndarray) -> int:
    """Classify each lane's step (``code``) and list the rows its new rows will overwrite.

    Returns how many rows are overwritten (``old_lanes[:m]``, ``old_rows[:m]``, each sized ``2 E``), or
    -1 if some lane's flags are inconsistent or do not follow from its state; nothing is changed.
    """
    for lane in range(open_rows.shape[0]):
        if last[lane] != (terminated[lane] or truncated[lane]):
            return -1
        if open_rows[lane] >= 0:
            if first[lane]:
                if not last[lane]:
                    return -1
                code[lane] = END_START
            else:
                code[lane] = END if last[lane] else CONTINUE
        elif first[lane] and not last[lane]:
            code[lane] = START
        else:
            return -1
    # As the rows are written: first every ended lane's final row, then every new open row.
    m = 0
    for phase in range(2):
        for lane in range(open_rows.shape[0]):
            c = code[lane]
            if phase == 0 and (c == END or c == END_START):
                old = count[lane] - capacity
            elif phase == 1 and c != END:
                old = count[lane] + (1 if c == END_START else 0) - capacity
            else:
                continue
            if old >= 0:
                old_lanes[m] = lane
                old_rows[m] = old
                m += 1
    return m


@njit(inline="always", cache=True)
def _copy_row(col: np.ndarray, i: int, data: np.ndarray, lane: int) -> None:
    w = col.shape[1]
    copy_bytes(col, i * w, data, lane * w, w)


@njit(inline="always", cache=True)
def _prefetch_rows(cols: tuple, i: int) -> None:
    """Request the first and last byte's lines of row ``i`` of each ``(rows, row_bytes)`` column, for writing."""
    for j in range(len(cols)):
        col = cols[j]
        prefetch_write(col, i * col.shape[1])
        prefetch_write(col, i * col.shape[1] + col.shape[1] - 1)


@njit(inline="always", cache=True)
def _nstep_item(m: int, lane: int, start: int, k: int, discount: float, rewards: np.ndarray, powers: np.ndarray,
                capacity: int, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray, returns: np.ndarray,
                discounts: np.ndarray) -> None:
    lanes[m] = lane
    starts[m] = start
    lengths[m] = k + 1
    discounts[m] = discount
    base = lane * capacity
    for c in range(rewards.shape[1]):
        acc = 0.0
        for j in range(k):
            acc += powers[j] * rewards[base + wrap(start + j, capacity), c]
        returns[m, c] = acc


@njit(inline="always", cache=True)
def _window_items(m: int, lane: int, lo: int, hi: int, final: int, terminated: bool, n: int, powers: np.ndarray,
                  rewards: np.ndarray, capacity: int, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  returns: np.ndarray, discounts: np.ndarray) -> int:
    """Items of starts ``lo .. hi - 1`` of one lane whose newest row is ``final``, from output ``m`` on.

    ``k = min(n, final - start)``; discount 0 where the window ends on the final row of a terminated
    episode (``terminated``), else ``g^k``. Returns the next free output.
    """
    for start in range(lo, hi):
        k = min(n, final - start)
        disc = 0.0 if terminated and start + k == final else powers[k]
        _nstep_item(m, lane, start, k, disc, rewards, powers, capacity, lanes, starts, lengths, returns, discounts)
        m += 1
    return m


@njit(**_OPTS)
def nstep_items(code: np.ndarray, final_rows: np.ndarray, ended_starts: np.ndarray, new_rows: np.ndarray,
                episode_start: np.ndarray, terminated: np.ndarray, n: int, powers: np.ndarray, rewards: np.ndarray,
                capacity: int, final_was_open: bool, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                returns: np.ndarray, discounts: np.ndarray) -> int:
    """The n-step transition items a step completes; returns how many (outputs sized ``n E``).

    First, in lane order, each lane that goes on and whose window of ``n`` actions now ends at its new
    open row; then, in lane order, every start within ``n`` rows of each ended lane's final row (after
    ``truncate`` the final row was the open row, so its full-length window exists already), with
    ``k = final - start`` and discount 0 on termination. ``rewards``: the store's reward column as
    ``(rows, reward_size)``; returns are float64 sums of ``g^j r_(start+j)``, stored as float32.
    """
    m = 0
    for lane in range(code.shape[0]):
        if code[lane] == CONTINUE:
            start = new_rows[lane] - n
            if start >= episode_start[lane]:
                _nstep_item(m, lane, start, n, powers[n], rewards, powers, capacity, lanes, starts, lengths,
                            returns, discounts)
                m += 1
    for lane in range(code.shape[0]):
        if code[lane] == END or code[lane] == END_START:
            f = final_rows[lane]
            lo = max(ended_starts[lane], f - n + (1 if final_was_open else 0))
            m = _window_items(m, lane, lo, f, f, terminated[lane], n, powers, rewards, capacity, lanes, starts,
                              lengths, returns, discounts)
    return m


@njit(**_OPTS)
def write_steps(codes: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, open_rows: np.ndarray,
                episode_start: np.ndarray, count: np.ndarray, episode_id: np.ndarray, episode_step: np.ndarray,
                next_episode: np.ndarray, next_step: np.ndarray, capacity: int, act_cols: tuple, act_data: tuple,
                obs_cols: tuple, obs_data: tuple, final_data: tuple, term_col: np.ndarray, trunc_col: np.ndarray,
                first_col: np.ndarray, last_col: np.ndarray, rows: np.ndarray, items: int, n: int,
                powers: np.ndarray, rewards: np.ndarray, tab: tuple, state: np.ndarray, lanes: np.ndarray,
                starts: np.ndarray, lengths: np.ndarray, returns: np.ndarray, discounts: np.ndarray,
                out: np.ndarray) -> int:
    """Write ``codes.shape[0]`` planned steps of every lane (:func:`plan_step`, :func:`plan_block`); step
    ``s`` has flags ``terminated[s]`` and ``truncated[s]`` and its inputs are row ``s`` of the
    ``(steps, E, row_bytes)`` blocks ``act_data``, ``obs_data`` and ``final_data``.

    An open row gets its action columns (action, reward, extras) and flags; an ended lane gets its final
    row (final observation, zero action columns, ``last``); a lane that goes on or starts gets a new
    open row (``first`` on a start). Updates the lanes' open rows and episode starts; ``rows[s]`` gets,
    per lane, the step's final row, the first row of the episode its action belongs to (the ended one, or
    the one going on) and its new open row, each -1 if none.

    Lane after lane, each lane's steps in turn: a lane's rows are written one after another, in its own
    lines, instead of one line per lane and step (every lane's first lines are requested at once, so
    their misses overlap). ``items`` says what becomes of the n-step items the steps complete (outputs
    sized ``n E steps``), and the return value is how many:

    - ``NO_ITEMS``: none here (the caller makes them from ``rows``; returns 0);
    - ``STEP_ITEMS``: :func:`nstep_items` of each step in turn, in the order separate steps give them,
      once every row is written (a block never overwrites rows its items read: ``stage_steps`` is capped
      so);
    - ``ROW_ITEMS``: for an adder whose one table, the store's only listener, is a RowTable (``tab``,
      ``state``: :class:`rlflow.replay._direct.Arrays` of kind ``ROWS``). Before a row is written, the
      item starting at the row it overwrites is dropped (the table's ``on_overwrite``); each item goes
      to the outputs as its step completes it (lane after lane: a RowTable keeps no insertion order) and
      to its start row's slot, keyed as :func:`rlflow.replay._direct.place_rows` keys them from
      ``state[NEXT_SEQ]`` on. ``out`` gets the items dropped, their times sampled, and the
      items placed: all, or none when a slot turned out taken (a broken invariant: the table's own insert
      of the outputs then explains it). ``state`` counts the drops; the placements are the caller's to
      count once the rate limiter admits them (or to take back with
      :func:`rlflow.replay._row_kernels.unplace`).
    """
    steps, num_lanes = codes.shape[0], codes.shape[1]
    for lane in range(num_lanes):
        c = codes[0, lane]
        base = lane * capacity
        if c != START:
            i = base + wrap(open_rows[lane], capacity)
            _prefetch_rows(act_cols, i)
            prefetch_write(term_col, i)
            prefetch_write(trunc_col, i)
        for r in range(count[lane], count[lane] + (2 if c == END_START else 1)):  # final and/or new open row
            i = base + wrap(r, capacity)
            _prefetch_rows(obs_cols, i)
            prefetch_write(first_col, i)
            prefetch_write(last_col, i)
            prefetch_write(episode_id, i)
            prefetch_write(episode_step, i)
    meta, ret, disc = tab[0], tab[4], tab[5]
    total, width = meta.shape[0], meta.shape[1]
    slots_per_row = total // capacity
    seq = state[_direct.NEXT_SEQ]
    removed = times = m = 0
    taken = False
    for lane in range(num_lanes):
        base = lane * capacity
        if items == ROW_ITEMS:  # a lane's slots are a line each, rows apart: requested ahead of the writes
            for r in range(count[lane], count[lane] + min(steps, _SLOTS_AHEAD)):
                prefetch_write(meta, (wrap(r, capacity) * slots_per_row + lane) * width)
        for s in range(steps):
            c = codes[s, lane]
            if items == ROW_ITEMS:
                if s + _SLOTS_AHEAD < steps:
                    prefetch_write(meta, (wrap(count[lane] + _SLOTS_AHEAD, capacity) * slots_per_row + lane) * width)
                for r in range(count[lane], count[lane] + (2 if c == END_START else 1)):  # rows overwritten
                    if r >= capacity:
                        slot = wrap(r, capacity) * slots_per_row + lane
                        if meta[slot, KEY] >= 0:
                            removed += 1
                            times += meta[slot, TIMES]
                            meta[slot, KEY] = -1
            # The lane's step, written out here: as a separate numba function (inlined or not) this body
            # made the kernel about ten times slower.
            final = new = -1
            episode = episode_start[lane] if c != START else -1
            if c != START:
                i = base + wrap(open_rows[lane], capacity)
                for j in range(len(act_cols)):
                    _copy_row(act_cols[j], i, act_data[j][s], lane)
                term_col[i] = terminated[s, lane]
                trunc_col[i] = truncated[s, lane]
            if c == END or c == END_START:
                final = _mark_row(episode_id, episode_step, next_episode, next_step, count, lane, False, capacity)
                i = base + wrap(final, capacity)
                for j in range(len(obs_cols)):
                    _copy_row(obs_cols[j], i, final_data[j][s], lane)
                for j in range(len(act_cols)):
                    col = act_cols[j]
                    for b in range(col.shape[1]):
                        col[i, b] = 0
                term_col[i] = False
                trunc_col[i] = False
                first_col[i] = False
                last_col[i] = True
                open_rows[lane] = -1
            if c != END:
                begins = c != CONTINUE
                new = _mark_row(episode_id, episode_step, next_episode, next_step, count, lane, begins, capacity)
                i = base + wrap(new, capacity)
                for j in range(len(obs_cols)):
                    _copy_row(obs_cols[j], i, obs_data[j][s], lane)
                first_col[i] = begins
                last_col[i] = False
                open_rows[lane] = new
                if begins:
                    episode_start[lane] = new
            rows[s, 0, lane], rows[s, 1, lane], rows[s, 2, lane] = final, episode, new
            if items != ROW_ITEMS:
                continue
            made = m
            if c == CONTINUE:
                if new - n >= episode:
                    _nstep_item(m, lane, new - n, n, powers[n], rewards, powers, capacity, lanes, starts, lengths,
                                returns, discounts)
                    m += 1
            elif final >= 0:
                m = _window_items(m, lane, max(episode, final - n), final, final, terminated[s, lane], n, powers,
                                  rewards, capacity, lanes, starts, lengths, returns, discounts)
            if not taken:
                for j in range(made, m):
                    slot = wrap(starts[j], capacity) * slots_per_row + lane
                    if meta[slot, KEY] != -1:
                        taken = True
                        break
                    set_meta(meta, slot, item_key(seq + j, total, slot), lane, starts[j], lengths[j], lengths[j])
                    ret[slot] = returns[j, 0]
                    disc[slot] = discounts[j]
    if items == STEP_ITEMS:
        for s in range(steps):
            m += nstep_items(codes[s], rows[s, 0], rows[s, 1], rows[s, 2], rows[s, 1], terminated[s], n, powers,
                             rewards, capacity, False, lanes[m:], starts[m:], lengths[m:], returns[m:], discounts[m:])
    if items == ROW_ITEMS:
        placed = m
        if taken:  # take the placements back: those slots were empty
            _rows.unplace(meta, capacity, lanes[:m], starts[:m], seq)
            placed = 0
        state[_direct.NUM_FREE] += removed
        out[0], out[1], out[2] = removed, times, placed
    return m


@njit(inline="always", cache=True)
def _copy_block(col: np.ndarray, base: int, pos: int, data: np.ndarray, capacity: int) -> None:
    """Rows ``data[0 .. t)`` into ring rows ``pos .. pos + t`` (wrapping) of the lane at flat row ``base``."""
    t = data.shape[0]
    first = min(t, capacity - pos)
    dst = col[base + pos: base + pos + first].reshape(-1)
    src = data[:first].reshape(-1)
    for b in range(src.shape[0]):
        dst[b] = src[b]
    if first < t:
        dst = col[base: base + t - first].reshape(-1)
        src = data[first:].reshape(-1)
        for b in range(src.shape[0]):
            dst[b] = src[b]


@njit(**_OPTS)
def write_lane_steps(lane: int, ended: bool, terminated: bool, truncated: bool, count: np.ndarray,
                     episode_id: np.ndarray, episode_step: np.ndarray, next_episode: np.ndarray,
                     next_step: np.ndarray, capacity: int, open_row: int, act_cols: tuple, act_data: tuple,
                     obs_cols: tuple, obs_data: tuple, term_col: np.ndarray, trunc_col: np.ndarray,
                     first_col: np.ndarray, last_col: np.ndarray) -> int:
    """``T`` consecutive steps of one lane whose open row is ``open_row``; returns the last new row.

    Rows ``open_row .. open_row + T - 1`` get the actions (action, reward, extras) and flags (only the
    last step may end the episode); rows ``open_row + 1 .. open_row + T`` are new, with the next
    observations, the last one the final row (zero action columns, ``last``) if ``ended``, else open.
    """
    t = act_data[0].shape[0]
    base = lane * capacity
    for j in range(len(act_cols)):
        _copy_block(act_cols[j], base, wrap(open_row, capacity), act_data[j], capacity)
    row0 = count[lane]
    for j in range(len(obs_cols)):
        _copy_block(obs_cols[j], base, wrap(row0, capacity), obs_data[j], capacity)
    last = _lane_marks(lane, t, open_row, ended, terminated, truncated, count, episode_id, episode_step, next_episode,
                       next_step, capacity, term_col, trunc_col, first_col, last_col)
    if ended:
        p = base + wrap(last, capacity)
        for j in range(len(act_cols)):
            col = act_cols[j]
            for b in range(col.shape[1]):
                col[p, b] = 0
    return last


@njit(inline="always", cache=True)
def _lane_marks(lane: int, t: int, open_row: int, ended: bool, terminated: bool, truncated: bool, count: np.ndarray,
                episode_id: np.ndarray, episode_step: np.ndarray, next_episode: np.ndarray, next_step: np.ndarray,
                capacity: int, term_col: np.ndarray, trunc_col: np.ndarray, first_col: np.ndarray,
                last_col: np.ndarray) -> int:
    """The flags and episode marks of ``T`` steps of one lane (rows written by the caller): open rows
    ``open_row ..`` get the flags (only the last step's may be set), the ``T`` new rows their marks, the
    last one ``last`` if ``ended``. Returns the last new row."""
    base = lane * capacity
    row0 = count[lane]
    # _mark_row's marks of rows that go on with the episode (the lane is open, so row0 > 0 and none opens an
    # episode id), the ring positions stepped along instead of wrapped row by row.
    episode, step = next_episode[lane] - 1, next_step[lane]
    po, pr = wrap(open_row, capacity), wrap(row0, capacity)
    for i in range(t):
        term_col[base + po] = False
        trunc_col[base + po] = False
        episode_id[lane, pr] = episode
        episode_step[lane, pr] = step + i
        first_col[base + pr] = False
        last_col[base + pr] = False
        po = po + 1 if po + 1 < capacity else 0
        pr = pr + 1 if pr + 1 < capacity else 0
    next_step[lane] = step + t
    count[lane] = row0 + t
    p = base + wrap(open_row + t - 1, capacity)
    term_col[p] = terminated
    trunc_col[p] = truncated
    last = row0 + t - 1
    if ended:
        p = base + wrap(last, capacity)
        last_col[p] = True
        term_col[p] = False
        trunc_col[p] = False
    return last


@njit(inline="always", cache=True)
def _copy_rows(col: np.ndarray, base: int, pos: int, data: np.ndarray, capacity: int) -> None:
    """Rows ``data[0 .. t)`` (2-D, any layout) into ring rows ``pos .. pos + t`` (wrapping) of the lane at
    flat row ``base`` of a typed ``(rows, width)`` column."""
    t, w = data.shape[0], data.shape[1]
    start = wrap(pos, capacity)
    first = min(t, capacity - start)  # the rows up to the ring's end, then the rest from its start
    for i in range(first):
        for b in range(w):
            col[base + start + i, b] = data[i, b]
    for i in range(first, t):
        for b in range(w):
            col[base + i - first, b] = data[i, b]


@njit(**_OPTS)
def lane_steps_direct(lane: int, ended: bool, terminated: bool, truncated: bool, open_row: int, episode_start: int,
                      n: int, checks: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
                      restart: np.ndarray, count: np.ndarray, episode_id: np.ndarray, episode_step: np.ndarray,
                      next_episode: np.ndarray, next_step: np.ndarray, capacity: int, act_col: np.ndarray,
                      rew_col: np.ndarray, obs_col: np.ndarray, term_col: np.ndarray, trunc_col: np.ndarray,
                      first_col: np.ndarray, last_col: np.ndarray, powers: np.ndarray, tab: tuple, kind: int,
                      alpha: float, may_insert: bool, state: np.ndarray, cross_episodes: bool, lanes: np.ndarray,
                      starts: np.ndarray, lengths: np.ndarray, returns: np.ndarray, discounts: np.ndarray,
                      slots: np.ndarray, keys: np.ndarray, clash: np.ndarray, out: np.ndarray) -> int:
    """``NStepTransition.add_steps`` in one call, for a store whose action, reward and observation are one
    field each (2-D views here: ``(T, width)`` inputs, ``(rows, width)`` columns) and its one table.

    Checks the values (``checks`` as in :func:`stage_simple`), then does what the general path does in
    order: evicts the table's items at the rows about to be overwritten (:func:`rlflow.replay._direct.evict`),
    writes the rows as :func:`write_lane_steps`, computes the items as :func:`nstep_lane_items` and, when
    ``may_insert`` (the rate limiter's consent) and the table has room, inserts them
    (:func:`rlflow.replay._direct.insert`). ``out`` gets the items evicted, their times sampled, the items
    completed, the last new row and how many new items share a start row with another. Returns -2 (bad
    values: nothing changed), 1 (items inserted), 0 (rows written, items left in the outputs for the
    caller to insert) or -3 (a window not stored: a bug).

    ``restart`` (``(1, width)``, or ``(0, width)`` for none) is the first observation of the episode that
    starts in the same step as the last one ends (``ended``): its row is written after the final row and
    its overwritten items evicted with the others, before any item is inserted, as ``add`` of a step that
    ends one episode and starts the next does.
    """
    if not (_values_ok(actions, int(checks[0]), checks[1], checks[2])
            and _values_ok(rewards, int(checks[3]), checks[4], checks[5])
            and _values_ok(next_obs, int(checks[6]), checks[7], checks[8])
            and (restart.shape[0] == 0 or _values_ok(restart, int(checks[6]), checks[7], checks[8]))):
        return -2
    t = rewards.shape[0]
    row0 = count[lane]
    lo, hi = max(row0 - capacity, 0), row0 + t + restart.shape[0] - capacity
    evicted, times = 0, 0
    if hi > lo:
        evicted, times = _direct.evict(tab, kind, state, lane, lo, hi, capacity)
    base = lane * capacity
    _copy_rows(act_col, base, open_row, actions, capacity)
    _copy_rows(rew_col, base, open_row, rewards, capacity)
    _copy_rows(obs_col, base, row0, next_obs, capacity)
    last = _lane_marks(lane, t, open_row, ended, terminated, truncated, count, episode_id, episode_step, next_episode,
                       next_step, capacity, term_col, trunc_col, first_col, last_col)
    if ended:
        p = base + wrap(last, capacity)
        act_col[p, :] = 0
        rew_col[p, :] = 0
        if restart.shape[0]:
            r = _mark_row(episode_id, episode_step, next_episode, next_step, count, lane, True, capacity)
            _copy_rows(obs_col, base, r, restart, capacity)
            p = base + wrap(r, capacity)
            first_col[p] = True
            last_col[p] = False
    lo = max(episode_start, open_row + 1 - n)
    hi = last if ended else last - n + 1
    m = 0
    if hi > lo:
        m = _window_items(0, lane, lo, hi, last, terminated, n, powers, rew_col, capacity, lanes, starts, lengths,
                          returns, discounts)
    out[0], out[1], out[2], out[3], out[4] = evicted, times, m, last, 0
    if m and may_insert and state[_direct.NUM_FREE] >= m:
        bad, out[4] = _direct.insert(tab, kind, alpha, state, count, episode_id, capacity, cross_episodes, lanes[:m],
                                     starts[:m], lengths[:m], returns[:m], discounts[:m], slots[:m], keys[:m],
                                     clash[:m])
        return -3 if bad >= 0 else 0 if bad == -2 else 1
    return 0


@njit(**_OPTS)
def episode_segments(terminated: np.ndarray, truncated: np.ndarray, ends: np.ndarray, codes: np.ndarray,
                     t: int = -1, terminated_last: bool = False, truncated_last: bool = False) -> tuple[int, int, int]:
    """The episodes of ``T`` steps of one lane whose ends ``terminated`` and ``truncated`` (bool ``[T]``)
    mark, as :func:`lane_segments_bag` takes them: segment ``j`` ends before row ``ends[j]``, with
    ``codes[j]`` 1 (terminated), 2 (truncated) or 0 (the last one, going on). Returns the number of
    segments, how many ends come before the last step, and the first step marked both ways (-1: none;
    then nothing else is meaningful).

    With ``t`` given, a flag array may be empty (no step marked) and ``terminated_last`` /
    ``truncated_last`` mark the last step as well (``add_steps``'s bool flags).
    """
    if t < 0:
        t = terminated.shape[0]
    m, inner = 0, 0
    for i in range(t):
        term = (terminated.shape[0] != 0 and terminated[i]) or (terminated_last and i == t - 1)
        trunc = (truncated.shape[0] != 0 and truncated[i]) or (truncated_last and i == t - 1)
        if term and trunc:
            return 0, 0, i
        if term or trunc:
            ends[m] = i + 1
            codes[m] = 1 if term else 2
            m += 1
            if i < t - 1:
                inner += 1
    if m == 0 or ends[m - 1] != t:
        ends[m] = t
        codes[m] = 0
        m += 1
    return m, inner, -1


@njit(**_OPTS)
def lane_first_direct(lane: int, checks: np.ndarray, obs: np.ndarray, count: np.ndarray, episode_id: np.ndarray,
                      episode_step: np.ndarray, next_episode: np.ndarray, next_step: np.ndarray, capacity: int,
                      obs_col: np.ndarray, first_col: np.ndarray, last_col: np.ndarray, tab: tuple, kind: int,
                      state: np.ndarray, out: np.ndarray) -> int:
    """``add_first`` of one lane with no episode in progress, in one call (the store and table as in
    :func:`lane_steps_direct`): evicts the table's items at the row about to be overwritten, writes the
    observation ``obs`` (``(1, width)``) as the new episode's first row, as :func:`write_steps` writes a
    start. ``out`` gets the items evicted, their times sampled and the new row. Returns -2 (bad values:
    nothing changed) or 0."""
    if not _values_ok(obs, int(checks[6]), checks[7], checks[8]):
        return -2
    row0 = count[lane]
    evicted, times = 0, 0
    if row0 >= capacity:
        evicted, times = _direct.evict(tab, kind, state, lane, row0 - capacity, row0 + 1 - capacity, capacity)
    r = _mark_row(episode_id, episode_step, next_episode, next_step, count, lane, True, capacity)
    _copy_rows(obs_col, lane * capacity, r, obs, capacity)
    p = lane * capacity + wrap(r, capacity)
    first_col[p] = True
    last_col[p] = False
    out[0], out[1], out[2] = evicted, times, r
    return 0


@njit(**_OPTS)
def nstep_lane_items(lane: int, lo: int, hi: int, final: int, terminated: bool, n: int, powers: np.ndarray,
                     rewards: np.ndarray, capacity: int, lanes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                     returns: np.ndarray, discounts: np.ndarray) -> int:
    """The items of starts ``lo .. hi - 1`` of one lane whose newest row is ``final``; returns how many."""
    return _window_items(0, lane, lo, hi, final, terminated, n, powers, rewards, capacity, lanes, starts, lengths,
                         returns, discounts)


@njit(**_OPTS)
def stage_flow(open_flag: np.ndarray, first: np.ndarray, last: np.ndarray, terminated: np.ndarray,
               truncated: np.ndarray, final_given: bool, out: np.ndarray) -> bool:
    """Whether a step's flags follow from the lanes' state after the steps staged before it (``open_flag``:
    the lane has an episode in progress), and an ending lane has a final observation; if so, advance
    ``open_flag`` past the step and copy the flags to ``out`` (``[4, E]``: first, last, terminated,
    truncated). Nothing changes when not."""
    for lane in range(open_flag.shape[0]):
        if last[lane] != (terminated[lane] or truncated[lane]) or (last[lane] and not final_given):
            return False
        if open_flag[lane]:
            if first[lane] and not last[lane]:
                return False
        elif not first[lane] or last[lane]:
            return False
    for lane in range(open_flag.shape[0]):
        open_flag[lane] = first[lane] or not last[lane]
        out[0, lane] = first[lane]
        out[1, lane] = last[lane]
        out[2, lane] = terminated[lane]
        out[3, lane] = truncated[lane]
    return True


@njit(**_OPTS)
def plan_block(steps: int, flags: np.ndarray, open_rows: np.ndarray, count: np.ndarray, capacity: int,
               codes: np.ndarray, old_lanes: np.ndarray, old_rows: np.ndarray) -> int:
    """:func:`plan_step` for each of ``steps`` staged steps (``flags[s]``: first, last, terminated,
    truncated, each ``[E]``), as if each were written before the next is planned; ``codes[s]`` per step.

    Returns how many rows the block overwrites (``old_lanes[:m]``, ``old_rows[:m]``, sized ``2 E steps``),
    or ``-1 - s`` when step ``s`` does not follow (nothing is written then).
    """
    sim_open = open_rows.copy()
    sim_count = count.copy()
    m = 0
    for s in range(steps):
        k = plan_step(sim_open, flags[s, 0], flags[s, 1], flags[s, 2], flags[s, 3], sim_count, capacity, codes[s],
                      old_lanes[m:], old_rows[m:])
        if k < 0:
            return -1 - s
        m += k
        for lane in range(sim_open.shape[0]):
            c = codes[s, lane]
            sim_count[lane] += 2 if c == END_START else 1
            sim_open[lane] = -1 if c == END else 0
    return m


@njit(inline="always", cache=True)
def _values_ok(x: np.ndarray, mode: int, low: float, high: float) -> bool:
    """``specs.fits``'s value check of ``x``: more than 32 values by its compiled passes (:func:`all_finite`
    vectorises, :func:`within`), fewer by the same loops inline here (a call costs more than they do)."""
    flat = np.ravel(x)
    if flat.shape[0] > 32:
        if mode == FINITE:
            return all_finite(flat)
        if mode == BOUNDS:
            return within(flat, low, high)  # exact for integers below 2**53 (larger bounds never come here)
        return True
    if mode == FINITE:
        acc = flat.dtype.type(0)
        for i in range(flat.shape[0]):  # x * 0 is 0 for finite x, NaN otherwise (as all_finite)
            acc += flat[i] * 0
        return acc == 0
    if mode == BOUNDS:
        for i in range(flat.shape[0]):  # compared as float64 (as within)
            v = float(flat[i])
            if v < low or v > high:
                return False
    return True


@njit(inline="always", cache=True)
def _put(block: np.ndarray, s: int, x: np.ndarray) -> None:
    """``block[s] = x`` (``block`` C-contiguous) as one flat loop: numba's strided slice assignment costs
    several times more per element."""
    dst = block[s].reshape(-1)
    src = np.ravel(x)
    for i in range(dst.shape[0]):
        dst[i] = src[i]


@njit(**_OPTS)
def stage_simple(staged: np.ndarray, open_rows: np.ndarray, open_flag: np.ndarray, first: np.ndarray,
                 last: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, flags: np.ndarray,
                 checks: np.ndarray, action: np.ndarray, action_block: np.ndarray, reward: np.ndarray,
                 reward_block: np.ndarray, obs: np.ndarray, obs_block: np.ndarray, final: np.ndarray | None,
                 final_block: np.ndarray) -> int:
    """One step into row ``staged[0]`` of a stage block, for stores whose action, reward and observation are
    each one field: check the values (``checks``: mode, low, high of the action, the reward and the
    observation, as :func:`rlflow.specs.check_mode` gives them) and the flags
    (:func:`stage_flow`; a block's first step starts from ``open_rows >= 0``), then copy every input to
    its block and count the step. Returns the steps staged, or -1 (flags) / -2 (values) having changed
    nothing. Shapes and dtypes are the caller's to check."""
    if not (_values_ok(action, int(checks[0]), checks[1], checks[2])
            and _values_ok(reward, int(checks[3]), checks[4], checks[5])
            and _values_ok(obs, int(checks[6]), checks[7], checks[8])):
        return -2
    if final is not None and not _values_ok(final, int(checks[6]), checks[7], checks[8]):
        return -2
    s = staged[0]
    if s == 0:
        for lane in range(open_rows.shape[0]):
            open_flag[lane] = open_rows[lane] >= 0
    if not stage_flow(open_flag, first, last, terminated, truncated, final is not None, flags[s]):
        return -1
    _put(action_block, s, action)
    _put(reward_block, s, reward)
    _put(obs_block, s, obs)
    if final is not None:
        _put(final_block, s, final)
    staged[0] = s + 1
    return s + 1


@njit(**_OPTS)
def stage_row(staged: np.ndarray, checks: np.ndarray, action: object, action_block: np.ndarray, reward: object,
              reward_block: np.ndarray, next_obs: np.ndarray, obs_block: np.ndarray) -> int:
    """One env's transition into row ``staged[0]`` of a one-lane block (``ReplayBuffer.add``): check the
    values as :func:`stage_simple` does (``action`` and ``reward`` may be scalars), copy them, count the
    row. Returns the rows staged, or -2 having changed nothing."""
    if not (_values_ok(np.asarray(action), int(checks[0]), checks[1], checks[2])
            and _values_ok(np.asarray(reward), int(checks[3]), checks[4], checks[5])
            and _values_ok(next_obs, int(checks[6]), checks[7], checks[8])):
        return -2
    s = staged[0]
    action_block[s] = action
    reward_block[s] = reward
    obs_block[s] = next_obs
    staged[0] = s + 1
    return s + 1


@njit(**_OPTS)
def stage_env_step(staged: np.ndarray, ctl: np.ndarray, action: np.ndarray, action_rows: np.ndarray, reward: float,
                   reward_rows: np.ndarray, next_obs: np.ndarray, obs_rows: np.ndarray) -> int:
    """A step that continues the episode of a one-env loop (``rlflow.run`` on one gymnasium env) into row
    ``staged[0]`` of a one-lane block whose columns come flat (``action_rows``, ``reward_rows``,
    ``obs_rows``: 1-D, row after row), from what the env returned: ``reward`` a float, cast to the block's
    dtype as the env wrapper casts it, ``next_obs`` unbatched (the block's dtype and size: the caller
    checks, and that the lane has an episode open). ``ctl`` is float64: the episode's return and length so
    far, then the value checks of the action, the reward and the observation (mode, low, high each, as
    :func:`stage_row` takes them); the values are checked after the cast. On success the row is counted
    and the stored reward and one step are added to ``ctl[0]`` and ``ctl[1]``. Returns the rows staged,
    or -2 (a bad value) having counted nothing."""
    s = staged[0]
    reward_rows[s] = reward
    flat_action, flat_obs = np.ravel(action), np.ravel(next_obs)
    if not (_values_ok(reward_rows[s:s + 1], int(ctl[5]), ctl[6], ctl[7])
            and _values_ok(flat_action, int(ctl[2]), ctl[3], ctl[4])
            and _values_ok(flat_obs, int(ctl[8]), ctl[9], ctl[10])):
        return -2
    a, o = flat_action.shape[0], flat_obs.shape[0]
    for i in range(a):
        action_rows[s * a + i] = flat_action[i]
    for i in range(o):
        obs_rows[s * o + i] = flat_obs[i]
    ctl[0] += np.float64(reward_rows[s])
    ctl[1] += 1.0
    staged[0] = s + 1
    return s + 1


# The one-lane write kernels with their unchanging arrays in a LaneBag (rlflow.replay._direct): what a call
# passes is only what changes between calls.


@njit(**_OPTS)
def lane_steps_bag(bag: object, lane: int, ended: bool, terminated: bool, truncated: bool, open_row: int,
                   episode_start: int, n: int, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
                   restart: np.ndarray, alpha: float, may_insert: bool, cross_episodes: bool) -> int:
    """:func:`lane_steps_direct` with ``bag``'s arrays."""
    return lane_steps_direct(lane, ended, terminated, truncated, open_row, episode_start, n, bag.checks, actions,
                             rewards, next_obs, restart, bag.count, bag.episode_id, bag.episode_step,
                             bag.next_episode, bag.next_step, bag.capacity, bag.act_col, bag.rew_col, bag.obs_col,
                             bag.term_col, bag.trunc_col, bag.first_col, bag.last_col, bag.powers, bag.tab, bag.kind,
                             alpha, may_insert, bag.state, cross_episodes, bag.lanes, bag.starts, bag.lengths,
                             bag.returns, bag.discounts, bag.slots, bag.keys, bag.clash, bag.out)


@njit(**_OPTS)
def lane_segments_bag(bag: object, lane: int, ends: np.ndarray, codes: np.ndarray, restarts: np.ndarray,
                      open_row: int, episode_start: int, n: int, actions: np.ndarray, rewards: np.ndarray,
                      next_obs: np.ndarray, alpha: float, may_insert: bool, cross_episodes: bool) -> tuple[int, int]:
    """Several episodes of one lane in one call (the store's and table's arrays in ``bag``), as separate calls
    would write them: for each segment, :func:`lane_steps_direct` (``add_steps`` of the episode), then
    :func:`lane_first_direct` of the next episode's first observation (``add_first``). Segment ``j`` is
    rows ``ends[j - 1] .. ends[j] - 1`` of the inputs (from 0 for the first); ``codes[j]`` is 0 (the
    episode goes on: only the last segment), 1 (it terminates) or 2 (it is truncated); ``restarts[j]`` is
    the next episode's first observation, for every segment but possibly the last (``restarts`` has
    ``len(ends)`` or ``len(ends) - 1`` rows).

    Every value is checked first (``bag.checks`` as in :func:`stage_simple`): if any is bad, nothing changes
    and the call returns ``(0, -2)``. Stops after a segment's rows when it leaves work to the caller
    (its items not inserted: no room or no consent; items sharing a start row with another, whose
    overflow lists the caller keeps; a broken invariant), before that segment's restart. Returns how many
    segments were written and the last one's status (:func:`lane_steps_direct`'s). ``bag.acc`` gets the
    items evicted, their times sampled and the items inserted by all of them, and the first row of the
    last one's episode; ``bag.out`` and the item outputs are the last one's rows'.
    """
    acc, out, checks = bag.acc, bag.out, bag.checks
    acc[0], acc[1], acc[2], acc[3] = 0, 0, 0, episode_start
    if not (_values_ok(actions, int(checks[0]), checks[1], checks[2])
            and _values_ok(rewards, int(checks[3]), checks[4], checks[5])
            and _values_ok(next_obs, int(checks[6]), checks[7], checks[8])
            and _values_ok(restarts, int(checks[6]), checks[7], checks[8])):
        return 0, -2
    checked = np.zeros(9)  # every value checked: the segments check none again (mode NO_CHECK)
    first_out = np.empty(3, np.int64)
    r, s0, a = open_row, episode_start, 0
    status = 1
    for j in range(ends.shape[0]):
        z, code = ends[j], codes[j]
        acc[3] = s0
        status = lane_steps_direct(lane, code != 0, code == 1, code == 2, r, s0, n, checked, actions[a:z],
                                   rewards[a:z], next_obs[a:z], restarts[0:0], bag.count, bag.episode_id,
                                   bag.episode_step, bag.next_episode, bag.next_step, bag.capacity, bag.act_col,
                                   bag.rew_col, bag.obs_col, bag.term_col, bag.trunc_col, bag.first_col, bag.last_col,
                                   bag.powers, bag.tab, bag.kind, alpha, may_insert, bag.state, cross_episodes,
                                   bag.lanes, bag.starts, bag.lengths, bag.returns, bag.discounts, bag.slots, bag.keys,
                                   bag.clash, out)
        acc[0] += out[0]
        acc[1] += out[1]
        acc[2] += out[2] if status == 1 else 0
        if (status != 1 and out[2] != 0) or status == -3 or out[4] != 0:
            return j + 1, status
        if j < restarts.shape[0]:
            lane_first_direct(lane, checked, restarts[j:j + 1], bag.count, bag.episode_id, bag.episode_step,
                              bag.next_episode, bag.next_step, bag.capacity, bag.obs_col, bag.first_col,
                              bag.last_col, bag.tab, bag.kind, bag.state, first_out)
            acc[0] += first_out[0]
            acc[1] += first_out[1]
            r = s0 = first_out[2]
        a = z
    return ends.shape[0], status


@njit(**_OPTS)
def lane_episodes_bag(bag: object, lane: int, terminated: np.ndarray, truncated: np.ndarray, terminated_last: bool,
                      truncated_last: bool, ends: np.ndarray, codes: np.ndarray, restarts: np.ndarray, open_row: int,
                      episode_start: int, n: int, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
                      alpha: float, may_insert: bool, cross_episodes: bool) -> tuple[int, int, int]:
    """``NStepTransition.add_steps`` over episode ends in one call: :func:`episode_segments` of the flags
    (into ``ends`` and ``codes``, sized ``T + 1``), then :func:`lane_segments_bag` of those segments.

    Returns ``(done, status, segments)``; ``(0, -4, 0)`` when a step is marked both ways and ``(0, -5, 0)``
    when ``restarts`` does not have a row per episode ending before the last step (and optionally one
    after it): nothing changes then, as for bad values (``(0, -2, m)``)."""
    t = rewards.shape[0]
    m, inner, both = episode_segments(terminated, truncated, ends, codes, t, terminated_last, truncated_last)
    if both >= 0:
        return 0, -4, 0
    k = restarts.shape[0]
    if not (k == inner or (k == inner + 1 and codes[m - 1] != 0)):
        return 0, -5, 0
    done, status = lane_segments_bag(bag, lane, ends[:m], codes[:m], restarts, open_row, episode_start, n, actions,
                                     rewards, next_obs, alpha, may_insert, cross_episodes)
    return done, status, m


@njit(**_OPTS)
def lane_first_bag(bag: object, lane: int, obs: np.ndarray) -> int:
    """:func:`lane_first_direct` with ``bag``'s arrays (its outputs in ``bag.out``)."""
    return lane_first_direct(lane, bag.checks, obs, bag.count, bag.episode_id, bag.episode_step, bag.next_episode,
                             bag.next_step, bag.capacity, bag.obs_col, bag.first_col, bag.last_col, bag.tab, bag.kind,
                             bag.state, bag.out)
