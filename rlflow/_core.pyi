"""
rlflow's compiled core (an implementation detail: use rlflow.replay and rlflow.adders).
"""

from collections.abc import Sequence
import enum
from typing import Annotated

import numpy
from numpy.typing import NDArray


class StepKind(enum.Enum):
    """What a step does on a lane."""

    CONTINUE = 0

    END = 1

    END_START = 2

    START = 3

class PlanFault(enum.Enum):
    """What BlockWriter.plan says of a block."""

    OK = 0

    FLOW = 1

    STACK_BREAK = 2

    STACK_START = 3

class BlockWriter:
    """The block writer over a store's columns and an adder's lane state."""

    def __init__(self, *, act: Sequence[object], obs: Sequence[object], frames: Sequence[int], flags: Sequence[object], rings: object, open_rows: object, episode_start: object) -> None: ...

    def plan(self, block: StepBlockCore, a: int, steps: int, codes: object, new_rows: object, ranges: object) -> PlanFault:
        """
        Plan steps a .. a + steps - 1 of the block: step kinds, rows per lane, stack checks, overwritten rows.
        """

    def write(self, block: StepBlockCore, a: int, steps: int, codes: object, rows: object) -> None:
        """Write the planned steps lane after lane; the rows each step wrote."""

    @property
    def fault_step(self) -> int:
        """The step of the last plan's fault (-1: none)."""

    @property
    def fault_lane(self) -> int:
        """The block lane of the last plan's fault."""

    @property
    def fault_column(self) -> int:
        """The observation column of a stack fault."""

    @property
    def overwritten_lanes(self) -> int:
        """The entries of the last plan's ranges."""

class NStepItems:
    """The n-step rule over a store's rewards."""

    def __init__(self, *, rewards: object, capacity: int, powers: object) -> None: ...

    def set_out(self, *, lanes: object, starts: object, lengths: object, returns: object, discounts: object) -> None:
        """Where the items go."""

    def make(self, a: int, steps: int, codes: object, rows: object, terminated: object, lanes: object, final_was_open: bool) -> int:
        """The items the written steps complete; their count."""

class CallState(enum.Enum):
    """What an env's last ReplayBuffer.add call left."""

    NO_EPISODE_YET = 0

    IN_EPISODE = 1

    ENDED = 2

class CallRow(enum.Enum):
    """The rows of the call classifier's output."""

    TERMINATED = 0

    TRUNCATED = 1

    LAST = 2

    RESET = 3

    STARTS = 4

CALL_ANY_START: int = 1

CALL_ANY_LAST: int = 2

CALL_CONVERT: int = 16

CALL_PUT: int = 4

CALL_KEPT: int = 8

class CallClassifier:
    """ReplayBuffer.add's call classifier (one call a step)."""

    def __init__(self, *, last: Sequence[object], state: object, was: object, calls: object) -> None: ...

    def classify(self, obs: object | None, terminated: object, truncated: object, reward: object | None) -> int:
        """
        Sort each env's call and advance the states; the CALL_ANY_* bits, or CALL_CONVERT.
        """

    def remember(self, next_obs: object | None) -> bool:
        """
        Keep next_obs as each env's last (False: a leaf to convert, nothing kept).
        """

    def add(self, block: StepBlockCore, obs: object | None, action: object | None, reward: object | None, extras: object | None, next_obs: object | None, terminated: object, truncated: object, flag_rows: tuple) -> int:
        """
        classify, then put a step that goes on into the block as its next step and keep next_obs; the bits (CALL_PUT: put, CALL_KEPT: kept).
        """

    def extend(self, block: StepBlockCore, env: int, obs: object, action: object, reward: object | None, extras: object, next_obs: object, terminated: object, truncated: object) -> StepsPut:
        """
        ReplayBuffer.extend's T steps of one env (leaf tuples [T, ...]; the reward an array [T, ...]; the flags bool [T]), judged as add judges its calls and put into the one-lane block, nothing written (see StepsPut).
        """

class StepsPut:
    """What CallClassifier.extend did."""

    @property
    def judged(self) -> bool:
        """
        False: obs, next_obs or the reward are not as the classifier compares them; nothing was done.
        """

    @property
    def status(self) -> Put:
        """The block filler's status (OK: the steps are in the block)."""

    @property
    def starts(self) -> bool:
        """An episode starts at obs[first_step], before the steps."""

    @property
    def ended(self) -> bool:
        """The last step put ends its episode."""

    @property
    def steps(self) -> int:
        """The steps put (the call's, less its reset steps)."""

    @property
    def first_step(self) -> int:
        """The call's step of the first step put."""

    @property
    def last_step(self) -> int:
        """The call's step of the last step put."""

    @property
    def fault_step(self) -> int:
        """The call's step of a fault."""

    @property
    def fault_first(self) -> bool:
        """
        The fault is in obs[fault_step], an observation that starts an episode.
        """

    @property
    def reset(self) -> numpy.ndarray | None:
        """
        Per step of the call, a NEXT_STEP reset step (left out); None when there is none.
        """

def window_index(meta: object, capacity: int) -> tuple[numpy.ndarray, numpy.ndarray, bool]:
    """
    Flat store indices [B, L] of the records' windows, their mask of valid rows, and whether all are.
    """

def window_ends(meta: object, capacity: int) -> numpy.ndarray:
    """Flat store indices [2, B] of each window's first and last row."""

def prefetch_rows(columns: Sequence[object], index: object) -> None:
    """Request every cache line of the rows of every column."""

def take_rows(column: object, index: object, out: object) -> None:
    """Rows index of a [rows, bytes] column into out."""

def take_stacks(rings: StoreRings, column: object, index: object, frames: int, by_column: bool, out: object) -> None:
    """
    The frame stacks of flat rows index [A, M] of a stacked column into out.
    """

def values_pass(values: object, check: ValueCheck, low: float = 0.0, high: float = 0.0) -> bool:
    """
    Whether every value passes the check (finite floats, integers within [low, high] as float64).
    """

KEY: int = 0

LANE: int = 1

START: int = 2

LENGTH: int = 3

VALID: int = 4

TIMES: int = 5

class ItemSlots:
    """
    A Table's item slots: records, priorities, free stack, start-row index.
    """

    def __init__(self, *, meta: object, priority: object, row_slot: object, free: object) -> None: ...

    def place(self, num_free: int, next_seq: int, lanes: object, starts: object, lengths: object, valid: object, priorities: object) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray, int]:
        """
        Place items in the top free slots, index them by start row; (slots, keys, clash, clashes).
        """

    def remove(self, num_free: int, slots: object) -> tuple[int, numpy.ndarray]:
        """
        Free live slots; (their times sampled summed, whether each was outside its index cell).
        """

    def indexed(self, lane: int, lo: int, hi: int) -> numpy.ndarray:
        """The slots indexed at rows lo .. hi - 1 of lane."""

    def set_priorities(self, keys: object, priorities: object) -> tuple[numpy.ndarray, numpy.ndarray]:
        """
        Store the priorities of live keys, in order; (their slots, their values).
        """

class PlaceFault(enum.Enum):
    """Why a RowTable refused an item."""

    NONE = 0

    WINDOW = 1

    TAKEN = 2

    TWICE = 3

class DrawTally:
    """What a RowTable's draws left: the next draw, live items, retirements."""

    @property
    def size(self) -> int: ...

    @property
    def retired(self) -> int: ...

    @property
    def retired_times(self) -> int: ...

    @property
    def made(self) -> int:
        """How many draws are made (the next draw's index)."""

class RowSlots:
    """A RowTable's item slots: the item starting at a row lives in its slot."""

    def __init__(self, *, meta: object, lanes: int) -> None: ...

    def place(self, rings: StoreRings, cross_episodes: bool, next_seq: int, lanes: object, starts: object, lengths: object) -> tuple[int, PlaceFault, numpy.ndarray, numpy.ndarray]:
        """
        Check the windows, place each item in its start row's slot; (bad, fault, slots, keys).
        """

    def evict(self, lane: int, lo: int, hi: int) -> tuple[int, int]:
        """
        Empty the slots of rows lo .. hi - 1 of lane; (how many held an item, their times sampled).
        """

    def draw_stored(self, rings: StoreRings, uniforms: object, j: int, size: int, limit: int, slots: object, rows: object, probabilities: object) -> DrawTally:
        """
        Draws j, j + 1, ... from the uniforms; the tally (made: the next draw's index).
        """

    def draw_live(self, uniforms: object, live: object, limit: int, slots: object, rows: object, probabilities: object) -> DrawTally:
        """
        Draws each uniform over the live slots (retired ones leave live); the tally.
        """

def draw_rows(meta: object, slots: object) -> numpy.ndarray:
    """Count one sample of each drawn slot; a copy of each draw's record."""

def first_bad_priority(priorities: object) -> int:
    """The first priority that is negative, NaN or infinite, or -1."""

def dense_insert(items: object, where: object, live: object, count: int, slots: object) -> int:
    """Add the slots not held yet to a dense set; the new count."""

def dense_delete(items: object, where: object, live: object, count: int, slots: object) -> int:
    """Remove the held slots from a dense set; the new count."""

def uniform_pick(uniforms: object, items: object, where: object, live: object, count: int) -> numpy.ndarray:
    """len(uniforms) // 2 slots, each uniform over the held ones."""

class InsertionRing:
    def __init__(self, capacity: int) -> None: ...

    @property
    def seq_of(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]: ...

    def push(self, slots: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], seqs: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    def remove(self, slots: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    def first(self, n: int, newest: bool) -> Annotated[NDArray[numpy.int64], dict(shape=(None,))]: ...

    def clear(self) -> None: ...

class TournamentTree:
    def __init__(self, capacity: int) -> None: ...

    @property
    def leaves(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]: ...

    @property
    def k1(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def k2(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]: ...

    def set(self, slots: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], k1: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], k2: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    def set_k1(self, slots: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], k1: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    def clear(self, slots: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    def top(self, n: int) -> Annotated[NDArray[numpy.int64], dict(shape=(None,))]: ...

    def load(self, leaves: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], k1: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], k2: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

def shuffle(values: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu')], uniforms: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

class ValueCheck(enum.Enum):
    """How a block column's values are checked."""

    NONE = 0

    FINITE = 1

    BOUNDS = 2

class Part(enum.Enum):
    """A part of a step row."""

    ACTION = 0

    REWARD = 1

    EXTRAS = 2

    OBSERVATION = 3

    FINAL = 4

class Put(enum.Enum):
    """What StepBlockCore.put says of a step."""

    OK = 0

    CONVERT = 1

    FLAGS = 2

    LAST_MISMATCH = 3

    NO_EPISODE = 4

    STARTS_IN_EPISODE = 5

    ENDS_NO_EPISODE = 6

    FINAL_MISSING = 7

    VALUE = 8

    STACK_BREAK = 9

    STACK_START = 10

class BlockColumn:
    """One column of a StepBlock ([T, E, *shape]) and its value check."""

    def __init__(self, values: object, *, exact: bool, check: ValueCheck, low: float = 0.0, high: float = 0.0) -> None: ...

class StepBlockCore:
    """The block filler: one step of every lane, checked and copied."""

    def __init__(self, *, action: Sequence[BlockColumn], reward: Sequence[BlockColumn], extras: Sequence[BlockColumn], observation: Sequence[BlockColumn], final: Sequence[BlockColumn], lanes: object, first: object, terminated: object, truncated: object, is_open: object) -> None: ...

    def add_stack(self, column: int, open: object) -> None:
        """
        Observation column ``column`` holds frame stacks; ``open`` ([E, k, ...]) the lanes' open-row stacks.
        """

    def set_agents(self, column: int, active: object, zeroed: Sequence[int]) -> None:
        """
        Multi-agent rows: the active flags' observation column, the flags at the open rows, and the action columns zeroed for the agents not active.
        """

    @property
    def filled(self) -> int:
        """
        The steps put so far: the next put goes to this row; set 0 to empty the block.
        """

    @filled.setter
    def filled(self, arg: int, /) -> None: ...

    def put(self, action: object | None, reward: object | None, extras: object | None, observation: object | None, final: object | None, first: object | None, last: object | None, terminated: object | None, truncated: object | None) -> Put:
        """
        Check the next step (row ``filled``) and put it, counting it when it is good (each part a tuple of its leaves, or None: written to that row and checked already; ``final`` an empty tuple when there are no final observations).
        """

    def put_steps(self, count: int, action: object | None, reward: object | None, extras: object | None, observation: object | None, final: object | None, first: object | None, last: object | None, terminated: object | None, truncated: object | None, firsts: object | None = None) -> Put:
        """
        put for the next ``count`` steps at once: each leaf and flag array leads with the steps ([count, E, ...], or for one lane [count, ...]); a step that fails leaves the lanes' states and ``filled`` as they were. ``firsts``: the observations (a tuple of leaves [K, ...], checked already) of the lanes that start an episode, one per first flag in order, instead of their observation rows.
        """

    @property
    def fault_step(self) -> int:
        """The step of the last fault."""

    @property
    def fault_lane(self) -> int:
        """The lane of the last fault (-1: none)."""

    @property
    def fault_column(self) -> int:
        """The column (in its part) of the last fault."""

    @property
    def fault_part(self) -> Part:
        """The part of the last fault."""

class StoreRings:
    """A StepStore's ring cursors and episode marks."""

    def __init__(self, *, written: object, episode_id: object, episode_step: object, next_episode: object, next_step: object, reach: int) -> None: ...

    def overwritten(self, lanes: object, new_rows: object, ranges: object) -> int:
        """
        The rows that writing new_rows[i] rows to each of lanes overwrites, as ranges (lane, lo, hi); how many.
        """

    def mark(self, lanes: object, first: object, rows: object) -> None:
        """
        Mark the next row of lanes[i], in order (first[i]: it starts an episode; first empty: none does); rows[i] gets its index.
        """

    def check_windows(self, lanes: object, starts: object, lengths: object, cross_episodes: bool) -> tuple[int, numpy.ndarray]:
        """
        Check item windows are stored; (the first bad one or -1, each one's valid length: 0 when bad).
        """

class SumTree:
    def __init__(self, capacity: int) -> None: ...

    def __getstate__(self) -> tuple[int, Annotated[NDArray[numpy.float64], dict(shape=(None,))]]: ...

    def __setstate__(self, arg: tuple[int, Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]], /) -> None: ...

    @property
    def capacity(self) -> int: ...

    @property
    def total(self) -> float: ...

    @property
    def min(self) -> float: ...

    @property
    def sums(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def mins(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def leaves(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def offsets(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]: ...

    def update(self, slots: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], values: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], exponent: float = 1.0) -> None: ...

    def set_leaves(self, values: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    def find(self, targets: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> Annotated[NDArray[numpy.int64], dict(shape=(None,))]: ...

    def sample(self, uniforms: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], stratified: bool, beta: float) -> tuple[Annotated[NDArray[numpy.int64], dict(shape=(None,))], Annotated[NDArray[numpy.float64], dict(shape=(None,))], Annotated[NDArray[numpy.float32], dict(shape=(None,))]]: ...

    def sequential(self, leaves: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], retires: Annotated[NDArray[numpy.bool_], dict(shape=(None,), order='C', device='cpu', writable=False)], beta: float) -> tuple[Annotated[NDArray[numpy.float64], dict(shape=(None,))], Annotated[NDArray[numpy.float32], dict(shape=(None,))]]: ...

    def draws_left(self, times: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], limit: int, enough: int) -> int: ...

SUM_TREE_BRANCH: int = 8
