"""Specs: the columns of a step, declared once and checked on every write.

A spec is a nested structure (``dict`` of specs, ``tuple`` of specs, or a leaf :class:`Field`). Each
leaf is one column of the :class:`~rlflow.replay.StepStore`: a fixed per-row ``shape`` and ``dtype``.
Specs come from gymnasium spaces (:func:`from_space`) or are written by hand for extras::

    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> from rlflow import specs
    >>> obs = specs.from_space(spaces.Box(-1.0, 1.0, (3,), np.float32))
    >>> step = {"observation": obs, "action": specs.from_space(spaces.Discrete(4)),
    ...         "log_prob": specs.Field((), np.float32)}
    >>> sorted(specs.flatten_spec(step))
    ['action', 'log_prob', 'observation']

Flat column names join the path with ``/`` (tuple members by index): ``{"pos": ..., "img": (a, b)}``
gives ``pos``, ``img/0``, ``img/1``.

Validation (:func:`validate`) checks structure (missing or extra keys, tuple length), shape, dtype
(values must cast to the field's dtype under numpy's ``same_kind`` rule: a Python float fits a float32
column, a float does not fit an integer column), integer bounds for discrete fields, and finiteness of
float fields unless ``allow_nonfinite``. It raises :class:`SpecError` naming the field, what was
expected and what came; nothing is written by the caller when it raises.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from rlflow import _core

__all__ = [
    "AgentGroup",
    "Field",
    "Spec",
    "SpecError",
    "add_agent_axis",
    "check_mode",
    "fits",
    "flatten_data",
    "flatten_spec",
    "frame_stack",
    "from_space",
    "unflatten",
    "validate",
    "zeros",
]


class SpecError(ValueError):
    """Data does not match its spec; the message names the field, what was expected and what came."""


@dataclass(frozen=True, init=False)
class Field:
    """One column: the shape and dtype of a single row's value.

    ``low``/``high`` (inclusive) are checked for integer fields only (e.g. ``Discrete(n)`` gives
    ``low=0, high=n-1``): a number, or an array broadcastable to ``shape`` for a bound per element (e.g.
    ``MultiDiscrete([3, 5])`` gives ``high=(2, 4)``), kept as a tuple of the elements in C order (a
    number when all are equal). Float fields reject NaN and infinities unless ``allow_nonfinite``.

    ``stack=k`` (k >= 2) declares a frame stack: axis 0 of ``shape`` (of size ``k``) holds the last ``k``
    frames of the episode, oldest first, the episode's first frame repeated where the stack reaches
    before it (gymnasium's ``FrameStackObservation(env, k)``). A store keeps one frame per row (the
    newest, ``frame_shape``) and rebuilds every stack it returns from the rows before it; writes check
    that each stack continues the one before it (see ``docs/pixels.md``).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    low: Any
    high: Any
    allow_nonfinite: bool
    stack: int

    def __init__(self, shape: Iterable[int], dtype: DTypeLike, low: Any = None, high: Any = None,
                 allow_nonfinite: bool = False, stack: int = 1) -> None:
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise SpecError(f"Field shape must be non-negative, got {shape}")
        if isinstance(stack, bool) or not isinstance(stack, int | np.integer) or stack < 1:
            raise SpecError(f"Field stack: expected an integer >= 1 (the frames of a stack, 1 for none), got {stack!r}")
        if stack > 1 and (not shape or shape[0] != stack):
            raise SpecError(f"Field stack={stack}: expected a shape whose axis 0 holds the {stack} frames, got shape "
                            f"{shape} (stack frames on axis 0, as FrameStackObservation does)")
        object.__setattr__(self, "stack", int(stack))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", np.dtype(dtype))
        object.__setattr__(self, "allow_nonfinite", bool(allow_nonfinite))
        for name, bound in (("low", low), ("high", high)):
            if bound is not None and np.ndim(bound) != 0:
                try:
                    arr = np.broadcast_to(np.asarray(bound), shape)
                except ValueError:
                    raise SpecError(f"Field {name}: expected a number or an array broadcastable to {shape}, "
                                    f"got shape {np.shape(bound)}") from None
                flat = [x.item() for x in arr.reshape(-1)]
                bound = flat[0] if flat and all(x == flat[0] for x in flat) else tuple(flat)
            object.__setattr__(self, name, bound)

    def bounds(self) -> tuple[Any, Any]:
        """``low`` and ``high`` as numbers, or as arrays of ``shape`` where they differ per element."""
        low, high = (np.asarray(b).reshape(self.shape) if type(b) is tuple else b for b in (self.low, self.high))
        return low, high

    @property
    def nbytes(self) -> int:
        """Bytes of one value (a whole stack for a stacked field)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @functools.cached_property
    def value_check(self) -> tuple[int, float, float] | None:
        """:func:`check_mode` of this field, computed once (hot checks read it on every call)."""
        return check_mode(self)

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """The shape a store keeps per row: ``shape`` without its stack axis (``shape`` when not stacked)."""
        return self.shape[1:] if self.stack > 1 else self.shape


@dataclass(frozen=True)
class AgentGroup:
    """Agents that share one observation space and one action space, stored with one agent axis.

    A team whose agents all share their spaces is one group; a team of agents that differ (a speaker and
    a listener, predators and prey) is several, each group's columns with their own shapes and dtypes
    (see :class:`rlflow.envs.ParallelEnvironment`).

    Attributes:
        name: the group's key in the step row (``observation["obs"][name]``, ``action[name]``).
        agents: its agents' names, in the team's order.
        indices: their positions on the team's agent axis (``possible_agents``), which the per-agent
            ``reward``, ``active``, ``terminated`` and ``truncated`` columns use for every agent.
        observation_space: one agent's observation space (without its action mask), when known.
        action_space: one agent's action space, when known.
    """

    name: str
    agents: tuple[str, ...]
    indices: tuple[int, ...]
    observation_space: Any = dataclasses.field(default=None, compare=False)
    action_space: Any = dataclasses.field(default=None, compare=False)


Spec = Field | Mapping[str, "Spec"] | tuple["Spec", ...]
"""A spec: a :class:`Field`, or dicts and tuples of specs nested as the data they describe."""


def from_space(space: Any) -> Spec:
    """The spec of one value of a gymnasium space (Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return Field(space.shape, space.dtype)
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return Field((), space.dtype, low=start, high=start + int(space.n) - 1)
    if isinstance(space, spaces.MultiDiscrete):
        starts = np.asarray(space.start)
        return Field(space.shape, space.dtype, low=starts, high=starts + np.asarray(space.nvec) - 1)
    if isinstance(space, spaces.MultiBinary):
        return Field(space.shape, space.dtype, low=0, high=1)
    if isinstance(space, spaces.Dict):
        return {key: from_space(sub) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(from_space(sub) for sub in space.spaces)
    raise SpecError(
        f"cannot build a spec from {type(space).__name__}: expected Box, Discrete, MultiDiscrete, "
        "MultiBinary, Dict or Tuple; declare the field by hand with rlflow.specs.Field"
    )


def frame_stack(spec: Any, k: int) -> Field:
    """The spec of observations that are stacks of the last ``k`` frames on axis 0 (gymnasium's
    ``FrameStackObservation(env, k)``): ``spec`` (a :class:`Field` or a gymnasium Box space of shape ``[k,
    *frame]``) with ``stack=k``, so that a store keeps each frame once."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 2:
        raise SpecError(f"frame stacks: expected k >= 2 frames, got {k!r}")
    if not isinstance(spec, Field | Mapping | tuple):
        spec = from_space(spec)
    if not isinstance(spec, Field) or not spec.shape or spec.shape[0] != k:
        got = f"shape {spec.shape}" if isinstance(spec, Field) else f"a {type(spec).__name__} of fields"
        raise SpecError(f"frame stacks of {k}: expected one array observation whose axis 0 holds the {k} frames, as "
                        f"gymnasium's FrameStackObservation(env, {k}) makes it, got {got}; wrap each env in "
                        f"FrameStackObservation(env, {k}) (inside the vector env)")
    return replace(spec, stack=int(k))


def stack_reach(spec: Spec) -> int:
    """The rows before a row that its frame stacks read: the largest ``stack`` of ``spec``'s fields minus one
    (0 without stacks). A store keeps them stored with every item that starts at that row."""
    return max((f.stack for f in flatten_spec(spec).values()), default=1) - 1


def add_agent_axis(spec: Spec, num_agents: int) -> Spec:
    """The same spec with a leading agent axis of size ``num_agents`` on every field."""
    if num_agents < 1:
        raise SpecError(f"num_agents must be >= 1, got {num_agents}")
    def add(f: Field) -> Field:
        if f.stack > 1:
            raise SpecError(f"add_agent_axis: a frame stack (Field stack={f.stack}) is a single-agent observation; "
                            "stack each agent's frames in its own observation field without stack=")
        low, high = f.bounds()  # per-element bounds broadcast over the agents
        return replace(f, shape=(num_agents, *f.shape), low=low, high=high)

    return _map(spec, add)


def _map(spec: Spec, fn: Any) -> Spec:
    if isinstance(spec, Field):
        return fn(spec)
    if isinstance(spec, Mapping):
        return {k: _map(v, fn) for k, v in spec.items()}
    if isinstance(spec, tuple):
        return tuple(_map(v, fn) for v in spec)
    raise SpecError(f"a spec is a Field, a dict or a tuple of specs, got {type(spec).__name__}")


def _walk(spec: Spec, prefix: str) -> Iterator[tuple[str, Field]]:
    if isinstance(spec, Field):
        yield prefix, spec
    elif isinstance(spec, Mapping):
        for key, sub in spec.items():
            if not isinstance(key, str) or "/" in key or not key:
                raise SpecError(f"spec keys must be non-empty strings without '/', got {key!r}")
            yield from _walk(sub, f"{prefix}/{key}" if prefix else key)
    elif isinstance(spec, tuple):
        for i, sub in enumerate(spec):
            yield from _walk(sub, f"{prefix}/{i}" if prefix else str(i))
    else:
        raise SpecError(f"a spec is a Field, a dict or a tuple of specs, got {type(spec).__name__}")


def flatten_spec(spec: Spec) -> dict[str, Field]:
    """The leaves of ``spec`` by column name (path joined with ``/``), in declaration order."""
    return dict(_walk(spec, ""))


def flatten_data(spec: Spec, data: Any, prefix: str = "") -> dict[str, Any]:
    """The leaves of ``data`` by column name, checking that its structure is exactly ``spec``'s."""
    out: dict[str, Any] = {}
    _flatten_into(spec, data, prefix, out)
    return out


def _flatten_into(spec: Spec, data: Any, path: str, out: dict[str, Any]) -> None:
    where = path or "<root>"
    if isinstance(spec, Field):
        if isinstance(data, Mapping | tuple):
            raise SpecError(f"field {where!r}: expected an array, got a {type(data).__name__}")
        out[path] = data
    elif isinstance(spec, Mapping):
        if not isinstance(data, Mapping):
            raise SpecError(f"field {where!r}: expected a dict with keys {sorted(spec)}, got {type(data).__name__}")
        missing = [k for k in spec if k not in data]
        extra = [k for k in data if k not in spec]
        if missing or extra:
            raise SpecError(
                f"field {where!r}: expected keys {sorted(spec)}, got {sorted(map(str, data))}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unexpected {extra}" if extra else "")
            )
        for key, sub in spec.items():
            _flatten_into(sub, data[key], f"{path}/{key}" if path else key, out)
    else:
        if not isinstance(data, tuple | list) or len(data) != len(spec):
            got = f"{type(data).__name__} of length {len(data)}" if isinstance(data, tuple | list) else (
                type(data).__name__)
            raise SpecError(f"field {where!r}: expected a tuple of length {len(spec)}, got {got}")
        for i, (sub, item) in enumerate(zip(spec, data, strict=True)):
            _flatten_into(sub, item, f"{path}/{i}" if path else str(i), out)


def unflatten(spec: Spec, flat: Mapping[str, Any], prefix: str = "") -> Any:
    """Rebuild ``spec``'s nesting from columns named as by :func:`flatten_spec`."""
    if isinstance(spec, Field):
        return flat[prefix]
    if isinstance(spec, Mapping):
        return {k: unflatten(v, flat, f"{prefix}/{k}" if prefix else k) for k, v in spec.items()}
    return tuple(unflatten(v, flat, f"{prefix}/{i}" if prefix else str(i)) for i, v in enumerate(spec))


def unflatten_plan(spec: Spec, prefix: str = "") -> Any:
    """:func:`unflatten`'s walk of ``spec`` done once, for :func:`unflatten_by`: a leaf's column name, or
    ``(dict, ((key, plan), ...))`` / ``(tuple, (plan, ...))``."""
    if isinstance(spec, Field):
        return prefix
    if isinstance(spec, Mapping):
        return dict, tuple((k, unflatten_plan(v, f"{prefix}/{k}" if prefix else k)) for k, v in spec.items())
    return tuple, tuple(unflatten_plan(v, f"{prefix}/{i}" if prefix else str(i)) for i, v in enumerate(spec))


def unflatten_by(plan: Any, flat: Mapping[str, Any]) -> Any:
    """:func:`unflatten` with the walk of :func:`unflatten_plan`: the same nesting, without re-walking the spec."""
    if type(plan) is str:
        return flat[plan]
    kind, parts = plan
    if kind is dict:
        return {k: flat[p] if type(p) is str else unflatten_by(p, flat) for k, p in parts}
    return tuple(flat[p] if type(p) is str else unflatten_by(p, flat) for p in parts)


def validate(
    fields: Mapping[str, Field], flat: Mapping[str, Any], batch_shape: tuple[int, ...]
) -> dict[str, np.ndarray]:
    """Check and convert flat data whose every column has leading ``batch_shape``; return the arrays.

    Raises :class:`SpecError` on the first mismatch; converts nothing in place.
    """
    out: dict[str, np.ndarray] = {}
    for name, field in fields.items():
        value = flat[name]
        arr = value if type(value) is np.ndarray else np.asarray(value)
        expected_shape = (*batch_shape, *field.shape)
        if arr.shape != expected_shape:
            raise SpecError(f"field {name!r}: expected shape {expected_shape}, got {arr.shape}")
        if arr.dtype != field.dtype:
            if not np.can_cast(arr.dtype, field.dtype, casting="same_kind"):
                raise SpecError(f"field {name!r}: expected dtype {field.dtype}, got {arr.dtype}")
            arr = arr.astype(field.dtype)
        kind = field.dtype.kind
        if kind == "f" and not field.allow_nonfinite and arr.size and not _all_finite(arr):
            raise SpecError(f"field {name!r}: expected finite values, got NaN or infinity")
        if kind in "iu" and arr.size and (field.low is not None or field.high is not None):
            _check_bounds(name, field, arr)
        out[name] = arr
    return out


def _check_bounds(name: str, field: Field, arr: np.ndarray) -> None:
    """Raise naming the first value of ``arr`` (rows of ``field``) outside the field's bounds."""
    for bound, side, outside in zip(field.bounds(), (">=", "<="), (np.less, np.greater), strict=True):
        if bound is None:
            continue
        if not isinstance(bound, np.ndarray):
            worst = arr.min() if side == ">=" else arr.max()
            if outside(worst, bound):
                raise SpecError(f"field {name!r}: expected values {side} {bound}, got {worst}")
            continue
        bad = np.argwhere(outside(arr, bound))  # per-element bounds: name the element
        if bad.size:
            at = tuple(int(i) for i in bad[0])
            element = at[arr.ndim - bound.ndim:]
            raise SpecError(f"field {name!r}: expected values {side} {bound.tolist()} element by element, got "
                            f"{arr[at]} at element {element} (bound {bound[element]})")


def fits(field: Field, value: Any, n: int) -> bool:
    """Whether ``value`` needs no conversion to be ``n`` rows of ``field``: an ndarray of exactly its dtype
    and shape ``(n, *field.shape)``, finite (floats) and within bounds (integers). A quick check for hot
    paths; ``False`` means "run :func:`validate`" (which converts or raises), not "invalid"."""
    if type(value) is not np.ndarray or value.shape != (n, *field.shape):
        return False
    dtype = value.dtype
    if dtype is not field.dtype and dtype != field.dtype:
        return False
    check = field.value_check
    if check is None:  # bounds per element, or integers float64 does not hold exactly
        low, high = field.bounds()
        return bool((low is None or np.all(value >= low)) and (high is None or np.all(value <= high)))
    mode, low, high = check
    if mode == NO_CHECK:
        return True
    if value.size == 1:  # one value (one lane of a scalar field): no compiled call
        x = value.item()
        return math.isfinite(x) if mode == FINITE else low <= x <= high
    return _all_finite(value) if mode == FINITE else _within(value, low, high)


# How :func:`fits` checks a field's values, as compiled checks take it: not at all, finite, or within bounds.
NO_CHECK, FINITE, BOUNDS = 0, 1, 2


def check_mode(field: Field) -> tuple[int, float, float] | None:
    """:func:`fits`'s value check of ``field`` as ``(mode, low, high)`` (mode :data:`NO_CHECK`,
    :data:`FINITE` or :data:`BOUNDS`, the bounds as float64); None where it cannot be put so (integer
    bounds beyond float64's exact integers, bounds per element)."""
    kind = field.dtype.kind
    if kind == "f":
        return (NO_CHECK if field.allow_nonfinite else FINITE), 0.0, 0.0
    if kind in "iu" and (field.low is not None or field.high is not None):
        if type(field.low) is tuple or type(field.high) is tuple or not _float_exact(field.low, field.high):
            return None
        low = -math.inf if field.low is None else float(field.low)
        high = math.inf if field.high is None else float(field.high)
        return BOUNDS, low, high
    return NO_CHECK, 0.0, 0.0


def _float_exact(*bounds: Any) -> bool:
    """Whether every finite bound (None and infinities aside) is an integer float64 holds exactly, so that
    values compared with it as float64 compare as they would exactly."""
    return all(b is None or not math.isfinite(b) or abs(b) < 2.0**53 for b in bounds)


def _all_finite(arr: np.ndarray) -> bool:
    """Whether every value of a float array is finite (a compiled pass for native float32/float64)."""
    if arr.dtype.itemsize not in (4, 8) or not arr.dtype.isnative:
        return bool(np.isfinite(arr).all())
    return bool(_core.values_pass(np.ascontiguousarray(arr), _core.ValueCheck.FINITE))


def _within(arr: np.ndarray, low: float, high: float) -> bool:
    """Whether every value of an integer array lies in ``[low, high]`` (:func:`check_mode`'s bounds, exact in
    float64; a compiled pass for native ints)."""
    if not arr.dtype.isnative:
        return bool(arr.min() >= low and arr.max() <= high) if arr.size else True
    return bool(_core.values_pass(np.ascontiguousarray(arr), _core.ValueCheck.BOUNDS, low, high))


def zeros(fields: Mapping[str, Field], batch_shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Zero-filled columns with leading ``batch_shape``."""
    return {name: np.zeros((*batch_shape, *f.shape), f.dtype) for name, f in fields.items()}
