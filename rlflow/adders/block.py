"""StepBlock: ``E`` lanes x ``T`` steps of what an env loop hands an adder, checked, in the store's dtypes.

Every way a step enters rlflow ends in a block: :meth:`~rlflow.adders.Adder.add` puts one step into
the adder's block and writes it, :meth:`~rlflow.adders.Adder.stage` puts it and writes the block when
it is full (or at :meth:`~rlflow.adders.Adder.flush`), ``add_steps`` fills a one-lane block with ``T``
steps at once. A block is numpy only and picklable: it is also what a remote actor ships.

Step ``s`` of block lane ``e`` (store lane ``lanes[e]``) is one :meth:`~rlflow.adders.Adder.add` of
that lane, with the flags of :class:`rlflow.types.TimeStep`:

==============================  ==================================================================
flags of step ``s``             what it writes on lane ``e``
==============================  ==================================================================
neither ``first`` nor ``last``  the action taken from the open row, its reward, flags and extras;
                                ``observation[s, e]`` becomes the new open row
``last`` (terminated and/or     the action as above; ``final[s, e]`` becomes the episode's final
truncated)                      row (``last=True``, zero action)
``last`` and ``first``          as ``last``, then ``observation[s, e]`` starts the next episode
``first`` only                  a lane with no episode in progress starts one at
                                ``observation[s, e]`` (the action is not read)
==============================  ==================================================================

Each step is checked when it is put: its values against the store's spec (a value is cast only where
numpy's ``same_kind`` casting allows it; floats must be finite, integers within bounds) and its flags
against the lane's state after the steps before it. A bad step raises and leaves the block as it was.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlflow import _core
from rlflow import specs as _specs
from rlflow.specs import Field, SpecError

__all__ = ["StepBlock"]

_PARTS = ("action", "reward", "extras")  # the parts an action fills in (in this order)
_BOOL = np.dtype(np.bool_)
_OK = _core.Put.OK
_BAD = (None,)  # the leaves of a value whose structure is not its part's (the block filler converts it)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + "/")


def bool_lanes(name: str, value: Any, n: int, *, subset: bool = False) -> np.ndarray:
    """``timestep.<name>`` as one bool per lane of ``n`` (the store's lanes, or the ``lanes=`` given:
    ``subset``); SpecError saying what came otherwise."""
    if type(value) is np.ndarray and value.dtype is _BOOL and value.shape[0] == n and value.ndim == 1:
        return value
    arr = np.asarray(value)
    if arr.shape == (n,) and arr.dtype == np.bool_:
        return arr
    if arr.ndim == 1:
        if subset:
            raise SpecError(f"timestep.{name}: the timestep has {arr.shape[0]} lanes, lanes= names {n}: expected "
                            "the timestep of exactly the lanes given")
        raise SpecError(f"timestep.{name}: the timestep has {arr.shape[0]} lanes, the adder's store {n}: expected "
                        "one store lane per env lane (build the store with lanes=env.num_envs)")
    raise SpecError(f"timestep.{name}: expected a bool array of shape ({n},), one flag per lane, got "
                    f"{arr.dtype} {arr.shape}")


class _Part:
    """One top-level part of a step row (``observation``, ``action``, ``reward`` or ``extras``): its spec and
    flat fields, and how values of it are checked into flat columns."""

    def __init__(self, key: str, spec: Any, fields: dict[str, Field]) -> None:
        self.key = key
        self.spec = spec
        self.fields = {name: f for name, f in fields.items() if _under(name, key)}
        self.single = isinstance(spec, Field)
        self._dest: dict[str, np.ndarray] = {}

    def bind(self, dest: dict[str, np.ndarray]) -> None:
        """Write :meth:`put_checked`'s rows into the block columns ``dest`` (``[T, E, *shape]`` per field)."""
        self._dest = dest

    def core_columns(self, cols: dict[str, np.ndarray]) -> list[_core.BlockColumn]:
        """The part's block columns of ``cols`` as the block filler takes them, with their value checks."""
        return [_core.BlockColumn(cols[name], exact=exact, check=check, low=low, high=high)
                for name, f in self.fields.items() for (check, low, high), exact in [_value_check(f)]]

    def leaves(self, value: Any) -> tuple[Any, ...]:
        """``value``'s leaves in column order, as the block filler takes them (``(None,)``, which it converts,
        when the structure is not the part's: :meth:`put_checked` then names the fault)."""
        if self.single:
            return (value,)
        try:
            flat = _specs.flatten_data(self.spec, value, self.key)
            return tuple(flat[name] for name in self.fields)
        except (SpecError, KeyError):
            return _BAD

    def put_checked(self, value: Any, s: int, what: str) -> None:
        """Check ``value`` (one step of every block lane) through :func:`rlflow.specs.validate` (casts where
        allowed) and copy it to row ``s``; SpecError naming ``what``."""
        n = next(iter(self._dest.values())).shape[1]
        for name, v in self.columns(value, n, what).items():
            self._dest[name][s] = v

    def columns(self, value: Any, n: int, what: str) -> dict[str, np.ndarray]:
        """``value`` (``n`` rows of the part) as checked flat columns; SpecError naming ``what``."""
        flat = self._flat(value, what)
        if all(_specs.fits(self.fields[name], v, n) for name, v in flat.items()):
            return flat
        try:
            return _specs.validate(self.fields, flat, (n,))
        except SpecError as exc:
            raise SpecError(f"{what}: {exc}") from None

    def _flat(self, value: Any, what: str) -> dict[str, Any]:
        """``value``'s leaves by column name (SpecError naming ``what`` when its structure is not the part's)."""
        if self.single:
            return {self.key: value}
        try:
            return _specs.flatten_data(self.spec, value, self.key)
        except SpecError as exc:
            raise SpecError(f"{what}: {exc}") from None

    def rows(self, value: Any, n: int, rows: np.ndarray, what: str) -> dict[str, np.ndarray]:
        """Rows ``rows`` of ``value`` (``n`` rows of the part) as checked flat columns (other rows unread)."""
        flat = {self.key: value} if self.single else _specs.flatten_data(self.spec, value, self.key)
        picked = {}
        for name, v in flat.items():
            arr = np.asarray(v)
            if arr.shape[:1] != (n,):
                raise SpecError(f"{what}: field {name!r}: expected a leading axis of {n} lanes, got {arr.shape}")
            picked[name] = arr[rows]
        try:
            return _specs.validate(self.fields, picked, (rows.size,))
        except SpecError as exc:
            raise SpecError(f"{what}: {exc}") from None


class StepBlock:
    """``E`` lanes x up to ``T`` steps of rows with their episode marks (see the module docstring).

    Args:
        spec: the store's step spec (:func:`rlflow.types.step_spec`).
        lanes: the store lane of each block lane (distinct).
        steps: the most steps the block holds.

    Attributes:
        lanes: ``[E]`` int64.
        steps: the steps put so far.
        act, observation, final: flat columns ``[T, E, *shape]``: what an action fills in (action,
            reward, extras), the observations (the next open row), the final observations (ended lanes).
        first, terminated, truncated: ``[T, E]`` bool.
    """

    def __init__(self, spec: Mapping[str, Any], lanes: Any, steps: int, *, subset: bool = False) -> None:
        self.lanes = np.array(lanes, np.int64).reshape(-1)  # its own (a caller may reuse theirs)
        self._subset = bool(subset)  # the lanes are some of the store's (errors speak of lanes=)
        if int(steps) < 1:
            raise ValueError(f"a StepBlock holds at least one step, got steps={steps}")
        self.max_steps = int(steps)
        self.spec = spec
        fields = self._fields = _specs.flatten_spec(spec)
        self._parts = {key: _Part(key, spec[key], fields) for key in ("observation", *_PARTS) if key in spec}
        t, e = self.max_steps, self.lanes.size

        def columns(part_keys: tuple[str, ...]) -> dict[str, np.ndarray]:
            return {name: np.zeros((t, e, *f.shape), f.dtype) for key in part_keys if key in self._parts
                    for name, f in self._parts[key].fields.items()}

        self.act = columns(_PARTS)
        self.observation = columns(("observation",))
        for key, part in self._parts.items():
            part.bind(self.observation if key == "observation" else self.act)
        self._has_extras = "extras" in self._parts
        self._action, self._reward, self._observation = (self._parts[k] for k in ("action", "reward", "observation"))
        self._extras = self._parts.get("extras")
        self.final = columns(("observation",))
        self.first, self.terminated, self.truncated = np.zeros((3, t, e), np.bool_)
        self._open = np.zeros(e, np.bool_)  # each lane's state after the steps put: an episode in progress
        # Multi-agent rows (rlflow.envs.ParallelEnvironment): an agent not active at its open row takes no
        # action there; its action is zero-filled before it is checked.
        active, flags = fields.get("observation/active"), fields.get("observation/terminated")
        self._agents = (active is not None and flags is not None and active.dtype == np.bool_
                        and len(active.shape) == 1 and flags.shape == active.shape)
        self._active = np.ones((e, *(active.shape if self._agents and active is not None else ())), np.bool_)
        # Frame stacks (Field stack=k): each lane's open-row stack, which the lane's next row must continue.
        self._stacks = {name: np.zeros((e, *f.shape), f.dtype) for name, f in self._parts["observation"].fields.items()
                        if f.stack > 1}
        self._core = self._filler()

    def _filler(self) -> _core.StepBlockCore:
        """The block filler (:meth:`put`'s checks and copies) over this block's columns, flags and lane states."""
        parts = self._parts
        extras = parts["extras"].core_columns(self.act) if "extras" in parts else []
        core = _core.StepBlockCore(
            action=parts["action"].core_columns(self.act), reward=parts["reward"].core_columns(self.act),
            extras=extras, observation=self._observation.core_columns(self.observation),
            final=self._observation.core_columns(self.final), lanes=self.lanes, first=self.first,
            terminated=self.terminated, truncated=self.truncated, is_open=self._open)
        obs_names = list(self.observation)
        for name, stack in self._stacks.items():
            core.add_stack(obs_names.index(name), stack)
        if self._agents:
            agents = self._active.shape[1:]
            zeroed = [j for j, name in enumerate(parts["action"].fields) if self.act[name].shape[2:3] == agents]
            core.set_agents(obs_names.index("observation/active"), self._active, zeroed)
        return core

    @property
    def steps(self) -> int:
        """The steps put so far (the block filler counts the steps it takes)."""
        return self._core.filled

    @steps.setter
    def steps(self, n: int) -> None:
        self._core.filled = n

    @property
    def filler(self) -> _core.StepBlockCore:
        """The compiled block filler over this block's columns, which the block writer reads."""
        return self._core

    def columns(self, key: str, value: Any, n: int, what: str) -> dict[str, np.ndarray]:
        """``n`` rows of part ``key`` of a step (``observation``, ``action``, ``reward``, ``extras``) as checked
        flat columns (cast where allowed); SpecError naming ``what``."""
        return self._parts[key].columns(value, n, what)

    def leaves(self, key: str, value: Any) -> tuple[Any, ...]:
        """Part ``key``'s leaves of ``value`` in column order (``(None,)`` when its structure is not the part's)."""
        return self._parts[key].leaves(value)

    def leaves_of(self, key: str) -> Callable[[Any], tuple[Any, ...]]:
        """:meth:`leaves` of part ``key``, as one function of the value."""
        return self._parts[key].leaves

    def leading_rows(self, observations: Any, what: str) -> int:
        """How many observations ``observations`` holds (the leading axis of its first leaf); SpecError naming
        ``what`` when its structure is not the spec's or it has no leading axis."""
        return _leading(observations, self._parts["observation"], what)

    def act_zeros(self) -> Any:
        """A zero action for every lane (nested as the spec's ``action``), for steps that only start episodes."""
        return self._zeros("action")

    def reward_zeros(self) -> np.ndarray:
        """A zero reward for every lane."""
        return self._zeros("reward")

    def extras_zeros(self) -> Any:
        """Zero extras for every lane (None when the store has no extras)."""
        return self._zeros("extras") if "extras" in self._parts else None

    def _zeros(self, key: str) -> Any:
        part = self._parts[key]
        flat = {name: np.zeros(self.act[name].shape[1:], self.act[name].dtype) for name in part.fields}
        return flat[key] if part.single else _specs.unflatten(part.spec, flat, key)

    @property
    def num_lanes(self) -> int:
        return int(self.lanes.size)

    @property
    def multi_agent(self) -> bool:
        """Whether the rows are multi-agent (an ``observation/active`` mask per agent)."""
        return self._agents

    def start(self, is_open: np.ndarray, active: np.ndarray | None = None,
              stacks: Mapping[str, np.ndarray] | None = None) -> None:
        """Empty the block; the next step is checked against lanes whose episode is in progress where
        ``is_open`` (``[E]`` bool), whose agents active at the open row are ``active`` (``[E, A]``;
        multi-agent rows only), and whose open rows hold the frame stacks ``stacks`` (per stacked observation
        column, ``[E, k, ...]``; stacked stores only)."""
        self.steps = 0
        self._open[:] = is_open
        if active is not None:
            self._active[:] = active
        for name, value in (stacks or {}).items():
            self._stacks[name][:] = value

    @property
    def stacked(self) -> list[str]:
        """The observation columns that hold frame stacks (``Field(stack=k)``)."""
        return list(self._stacks)

    # ------------------------------------------------------------------ filling
    def put(self, actions: Any, timestep: Any, extras: Any = None) -> None:
        """Check one step of every lane (an :meth:`~rlflow.adders.Adder.add` call's arguments: the actions, the
        TimeStep that followed, the extras) and add it; a step that raises leaves the block as it was."""
        s = self.steps
        if s >= self.max_steps:
            raise ValueError(f"the block is full ({self.max_steps} steps): write it before putting more")
        ts = timestep
        if (extras is None) == self._has_extras:
            self._action_parts(actions, ts.reward, extras, "add")  # raises, naming what is missing
        # The block filler copies the leaves that are arrays of their columns' dtypes and shapes and checks the
        # step in one call; a part it cannot take as it is gets converted here (cast where the spec allows,
        # SpecError otherwise), written to row s, and the step is put again without it.
        final = ts.final_observation
        obs = self._observation
        a, r = self._action.leaves(actions), self._reward.leaves(ts.reward)
        x = () if self._extras is None else self._extras.leaves(extras)
        o, f = obs.leaves(ts.observation), () if final is None else obs.leaves(final)
        status = self._core.put(a, r, x, o, f, ts.first, ts.last, ts.terminated, ts.truncated)
        if status is not _OK:
            self._put_converted(status, s, actions, ts, extras, [a, r, x, o, f])

    def _put_converted(self, status: _core.Put, s: int, actions: Any, ts: Any, extras: Any,
                       parts: list[tuple[Any, ...] | None]) -> None:
        """:meth:`put` of a step the filler did not take as it came (``status``): each part it cannot take is
        converted, written to row ``s`` and left out; flags it cannot read are converted; a fault raises."""
        flags = [ts.first, ts.last, ts.terminated, ts.truncated]
        converted_flags = False
        while status is not _OK:
            if status is _core.Put.CONVERT:
                part = self._core.fault_part
                self._convert(part, s, actions, ts, extras, flags[1])
                parts[part.value] = None
            elif status is _core.Put.FLAGS and converted_flags:
                raise RuntimeError(f"put: the block filler refuses the flags {[f.dtype for f in flags]} it was given")
            elif status is _core.Put.FLAGS:
                n, sub = self.lanes.size, self._subset
                flags = [np.ascontiguousarray(bool_lanes(name, flag, n, subset=sub))
                         for name, flag in zip(("first", "last", "terminated", "truncated"), flags, strict=True)]
                converted_flags = True
            else:
                self._step_fault(status, s, actions, ts, extras, flags[1])
            status = self._core.put(*parts, *flags)

    def check(self, actions: Any, timestep: Any, extras: Any = None) -> None:
        """Raise as :meth:`put` would, adding nothing (the block's free row is used as scratch)."""
        if self.steps >= self.max_steps:
            raise ValueError(f"the block is full ({self.max_steps} steps): nothing to check a step in")
        steps, is_open, active = self.steps, self._open.copy(), self._active.copy()
        stacks = {name: stack.copy() for name, stack in self._stacks.items()}
        try:
            self.put(actions, timestep, extras)
        finally:
            self.steps, self._open[:], self._active[:] = steps, is_open, active
            for name, stack in stacks.items():
                self._stacks[name][:] = stack

    def _convert(self, part: _core.Part, s: int, actions: Any, ts: Any, extras: Any, last: np.ndarray) -> None:
        """Check part ``part`` of step ``s`` (casting where the spec allows) and write it to row ``s``; SpecError
        naming what does not fit."""
        if part is _core.Part.FINAL:
            self._put_final(s, last, ts.final_observation)
        elif part is _core.Part.OBSERVATION:
            self._observation.put_checked(ts.observation, s, "timestep.observation")
        elif part is _core.Part.ACTION:
            self._action.put_checked(_zero_inactive(actions, self._active) if self._agents else actions, s, "add")
        elif part is _core.Part.REWARD:
            self._reward.put_checked(ts.reward, s, "add")
        else:
            self._parts["extras"].put_checked(extras, s, "add")

    def _step_fault(self, status: _core.Put, s: int, actions: Any, ts: Any, extras: Any, last: np.ndarray) -> None:
        """Raise the error of the block filler's fault ``status`` (where: the filler's ``fault_*``)."""
        core = self._core
        lanes = self.lanes[[core.fault_lane]]
        if status is _core.Put.VALUE:
            self._convert(core.fault_part, s, actions, ts, extras, last)  # raises, naming the field and value
        elif status is _core.Put.FINAL_MISSING:
            raise SpecError(f"timestep: lanes {np.flatnonzero(last).tolist()} are last but final_observation is None")
        elif status in (_core.Put.STACK_BREAK, _core.Put.STACK_START):
            raise self.stack_error(status, "timestep.final_observation" if core.fault_part is _core.Part.FINAL
                                   else "timestep.observation")
        else:
            self._flow_error(status, lanes)
        raise RuntimeError(f"put: fault {status} at lane {int(lanes[0])} that the spec's checks pass")

    def _put_final(self, s: int, last: np.ndarray, final_observation: Any) -> None:
        """Check the final observations of the lanes ending at step ``s`` and copy them to row ``s``."""
        ended = np.flatnonzero(last)
        if final_observation is None:
            raise SpecError(f"timestep: lanes {ended.tolist()} are last but final_observation is None")
        n = self.lanes.size
        final = self._parts["observation"].rows(final_observation, n, ended, "timestep.final_observation")
        for name, value in final.items():
            self.final[name][s, ended] = value

    def _action_parts(self, actions: Any, rewards: Any, extras: Any, what: str) -> list[tuple[_Part, Any]]:
        """The parts an action fills in with their values; SpecError when extras are given to a store without
        them, or missing for one with them."""
        if self._has_extras and extras is None:
            raise SpecError(f"{what}: the store has extras {list(self._parts['extras'].fields)}; pass extras=")
        if not self._has_extras and extras is not None:
            raise SpecError(f"{what}: extras given, but the store's spec has no 'extras'")
        parts = [(self._parts["action"], actions), (self._parts["reward"], rewards)]
        return parts if extras is None else [*parts, (self._parts["extras"], extras)]

    def _flow_error(self, status: _core.Put, lanes: np.ndarray) -> None:
        """Raise the error of a flag fault ``status`` of the block filler at store lanes ``lanes``."""
        lane = lanes.tolist()
        if status is _core.Put.LAST_MISMATCH:
            raise SpecError("timestep: expected last == terminated | truncated on every lane")
        if status is _core.Put.NO_EPISODE:
            raise ValueError(f"add: lanes {lane} have no episode in progress and the timestep does not start one "
                             "(call add_first with the reset timestep first)")
        if status is _core.Put.STARTS_IN_EPISODE:
            raise ValueError(f"add: lanes {lane} start a new episode while one is in progress and did not end "
                             "(last=False); call reset() to abandon an episode")
        raise ValueError(f"add: lanes {lane} have no episode in progress, so it cannot end")

    def put_steps(self, actions: Any, rewards: Any, next_observations: Any, ends: np.ndarray, terminated: np.ndarray,
                  first_observations: Any, extras: Any = None) -> None:
        """Check ``T`` consecutive steps of a one-lane block and add them (the block must be empty): the steps
        :meth:`put` would take one at a time, checked and copied by the same block filler in one call.

        Step ``i`` takes ``actions[i]`` and gets ``rewards[i]`` and ``next_observations[i]``; where
        ``ends[i]`` its episode ends there (``terminated[i]``, else truncated) with ``next_observations[i]``
        as its final observation, and where an episode follows it (the ``j``-th such end), it starts at
        ``first_observations[j]`` (``[K, ...]``, one per end that is followed).
        """
        if self.lanes.size != 1 or self.steps:
            raise ValueError("put_steps fills an empty one-lane block")
        t = int(ends.shape[0])
        if t > self.max_steps:
            raise ValueError(f"put_steps: {t} steps exceed the block's {self.max_steps}")
        if not self._open[0]:
            raise ValueError(f"add_steps: lane {int(self.lanes[0])} has no episode in progress")
        if (extras is None) == self._has_extras:
            self._action_parts(actions, rewards, extras, "add_steps")  # raises, naming what is missing
        obs = self._observation
        first = np.zeros(t, bool)
        restarts = firsts = None  # the steps that start an episode (each restart's observation: its first one)
        if first_observations is not None:
            restarts = np.flatnonzero(ends)[:_leading(first_observations, obs, "add_steps: first_observations")]
            firsts = obs.columns(first_observations, restarts.size, "add_steps: first_observations")
            first[restarts] = True
        flags = [first, ends, ends & terminated, ends & ~terminated]
        leaves = obs.leaves(next_observations)
        parts: list[tuple[Any, ...] | None] = [
            self._action.leaves(actions), self._reward.leaves(rewards),
            () if self._extras is None else self._extras.leaves(extras), leaves, leaves]
        first_leaves = None if firsts is None else tuple(np.ascontiguousarray(firsts[name]) for name in obs.fields)
        while True:
            status = self._core.put_steps(t, parts[0], parts[1], parts[2], parts[3], parts[4], flags[0], flags[1],
                                          flags[2], flags[3], first_leaves)
            if status is _OK:
                break
            core = self._core
            if status is _core.Put.CONVERT or status is _core.Put.VALUE:
                cols = self._steps_columns(core.fault_part, t, actions, rewards, extras, next_observations,
                                           (restarts, firsts))
                if status is _core.Put.VALUE:
                    raise RuntimeError(f"put_steps: fault {status} at step {core.fault_step} that the spec's checks "
                                       "pass")
                dest = {_core.Part.FINAL: self.final, _core.Part.OBSERVATION: self.observation}.get(core.fault_part,
                                                                                                    self.act)
                for name, v in cols.items():
                    dest[name][:t, 0] = v
                parts[core.fault_part.value] = None
            elif status in (_core.Put.STACK_BREAK, _core.Put.STACK_START):
                i = core.fault_step
                j = int(np.searchsorted(restarts, i)) if restarts is not None else 0
                raise self.stack_error(status, f"add_steps: first_observations[{j}]" if status is _core.Put.STACK_START
                                       else f"add_steps: next_observations[{i}]")
            else:
                raise RuntimeError(f"put_steps: fault {status} at step {core.fault_step} of a one-lane block")

    def _steps_columns(self, part: _core.Part, t: int, actions: Any, rewards: Any, extras: Any,
                       next_observations: Any, restarts: tuple[np.ndarray | None, dict[str, np.ndarray] | None]
                       ) -> dict[str, np.ndarray]:
        """Part ``part`` of :meth:`put_steps`' ``t`` steps as checked columns (cast where the spec allows; an
        agent's action zeroed where it is not active at its open row); SpecError naming what does not fit.
        ``restarts``: the steps that start an episode and their first observations (checked), or Nones."""
        obs = self._observation
        if part is _core.Part.FINAL or part is _core.Part.OBSERVATION:  # (the filler puts the first observations)
            return obs.columns(next_observations, t, "add_steps: next_observations")
        key = part.name.lower()
        value = {"action": actions, "reward": rewards, "extras": extras}[key]
        if self._agents and part is _core.Part.ACTION:  # each step's open row: the lane's, then the rows opened
            active = np.array(obs.columns(next_observations, t, "add_steps: next_observations")["observation/active"])
            steps, firsts = restarts
            if steps is not None and firsts is not None:
                active[steps] = firsts["observation/active"]
            value = _zero_inactive(value, np.concatenate([self._active[:1], active[:-1]]))
        return self._parts[key].columns(value, t, f"add_steps: {key}")

    def ended_last(self, lanes: np.ndarray) -> np.ndarray:
        """Per block lane of ``lanes`` (indices): whether its episode ended at the last step put, with no
        next one started there."""
        s = self.steps - 1
        if s < 0:
            return np.zeros(lanes.size, bool)
        return (self.terminated[s, lanes] | self.truncated[s, lanes]) & ~self.first[s, lanes]

    def clear(self) -> None:
        """Empty the block, each lane in the state its last step left it: the next step put follows on from
        the steps taken out (by :meth:`state_dict`, to ship them)."""
        self.steps = 0

    def restart(self, lanes: np.ndarray, observation: Any) -> None:
        """Start the next episode of block lanes ``lanes`` (indices) at ``observation`` (``[len(lanes), ...]``):
        their episodes ended at the last step put, which then also starts the next one (as an env that
        resets in the same step)."""
        s = self.steps - 1
        if not self.ended_last(lanes).all():
            raise ValueError(f"restart: lanes {self.lanes[lanes].tolist()} did not end at the block's last step")
        obs = self.starts(observation, self.lanes[lanes], "observation", "timestep.observation")
        for name, value in obs.items():
            self.observation[name][s, lanes] = value
            if name in self._stacks:
                self._stacks[name][lanes] = value
        self.first[s, lanes] = True
        self._open[lanes] = True
        if self._agents:
            self._active[lanes] = obs["observation/active"]

    def stack_error(self, status: _core.Put, what: str) -> SpecError:
        """The error of the block filler's frame-stack fault ``status`` (``STACK_BREAK``: a stack does not continue
        the one before it; ``STACK_START``: an episode's first stack is not its first frame repeated) at its
        fault column and lane, naming ``what``."""
        core = self._core
        name = list(self.observation)[core.fault_column]
        k, lanes = self._fields[name].stack, self.lanes[[max(core.fault_lane, 0)]]
        if status is _core.Put.STACK_START:
            return SpecError(_stack_start(name, k, lanes, what))
        return SpecError(_stack_break(what, name, k, lanes))

    def starts(self, observation: Any, lanes: np.ndarray, what: str, where: str) -> dict[str, np.ndarray]:
        """Observations that start episodes on store lanes ``lanes`` (one each) as checked columns; SpecError
        naming ``what`` (the values) or ``where`` (a frame stack) unless each fits the spec and each frame stack
        is its first frame repeated."""
        obs = self._parts["observation"].columns(observation, lanes.size, what)
        for name in self._stacks:
            bad = lanes[stack_not_repeated(obs[name])]
            if bad.size:
                raise SpecError(_stack_start(name, obs[name].shape[1], bad, where))
        return obs

    # ------------------------------------------------------------------ helpers
    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """The steps put, as plain arrays (copies)."""
        s = self.steps
        return {"steps": s, "lanes": self.lanes.copy(), "act": {k: v[:s].copy() for k, v in self.act.items()},
                "observation": {k: v[:s].copy() for k, v in self.observation.items()},
                "final": {k: v[:s].copy() for k, v in self.final.items()},
                "first": self.first[:s].copy(), "terminated": self.terminated[:s].copy(),
                "truncated": self.truncated[:s].copy(), "open": self._open.copy(), "active": self._active.copy()}

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise ValueError, naming what differs, unless ``state`` (:meth:`state_dict`'s output) fits this block."""
        s = state.get("steps")
        if not isinstance(s, int | np.integer) or not 0 <= int(s) <= self.max_steps:
            raise ValueError(f"staged steps: expected 0 to {self.max_steps}, got {s!r}")
        if not np.array_equal(np.asarray(state.get("lanes")), self.lanes):
            raise ValueError(f"staged steps: expected lanes {self.lanes.tolist()}, got {state.get('lanes')!r}")
        for key, mine in (("act", self.act), ("observation", self.observation), ("final", self.final)):
            cols = state.get(key)
            if not isinstance(cols, Mapping) or set(cols) != set(mine):
                raise ValueError(f"staged steps: expected columns {sorted(mine)} under {key!r}")
            for name, col in mine.items():
                arr = np.asarray(cols[name])
                if arr.shape != (int(s), *col.shape[1:]) or arr.dtype != col.dtype:
                    raise ValueError(f"staged steps: column {name!r}: expected {col.dtype} "
                                     f"{(int(s), *col.shape[1:])}, got {arr.dtype} {arr.shape}")
        for key, shape in (("first", (int(s), self.lanes.size)), ("terminated", (int(s), self.lanes.size)),
                           ("truncated", (int(s), self.lanes.size)), ("open", (self.lanes.size,)),
                           ("active", self._active.shape)):
            arr = np.asarray(state.get(key))
            if arr.shape != shape or arr.dtype != np.bool_:
                raise ValueError(f"staged steps: {key!r}: expected bool {shape}, got {arr.dtype} {arr.shape}")
        # The values the steps write, checked as put checks them: the action, reward and extras of every step
        # but those that only start an episode, the observation of every step that leaves its episode open
        # (or starts the next), the final observation of every step that ends one.
        first = np.asarray(state["first"])
        ends = np.asarray(state["terminated"]) | np.asarray(state["truncated"])
        for key, written in (("act", ~first | ends), ("observation", first | ~ends), ("final", ends)):
            names = self.act if key == "act" else self.observation
            try:
                _specs.validate({n: self._fields[n] for n in names},
                                {n: np.asarray(state[key][n])[written] for n in names}, (int(written.sum()),))
            except SpecError as exc:
                raise ValueError(f"staged steps: {key}: {exc}") from None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Hold the steps of :meth:`state_dict`'s output (checked first: a refusal changes nothing)."""
        self.check_state(state)
        s = int(state["steps"])
        for key, mine in (("act", self.act), ("observation", self.observation), ("final", self.final)):
            for name, col in mine.items():
                col[:s] = state[key][name]
        self.first[:s] = state["first"]
        self.terminated[:s] = state["terminated"]
        self.truncated[:s] = state["truncated"]
        self._open[:] = state["open"]
        self._active[:] = state["active"]
        self.steps = s

    def __getstate__(self) -> dict[str, Any]:  # arrays only (the block filler is built again from them)
        return {"spec": self.spec, "lanes": self.lanes, "max_steps": self.max_steps, "subset": self._subset,
                "state": self.state_dict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], state["lanes"], state["max_steps"], subset=state["subset"])  # type: ignore[misc]
        self.load_state_dict(state["state"])

    def __repr__(self) -> str:
        return f"StepBlock(lanes={self.lanes.tolist()}, steps={self.steps}/{self.max_steps})"


def stack_not_repeated(new: np.ndarray) -> np.ndarray:
    """Per row of ``new`` (stacks ``[N, k, ...]``): whether its frames are not all its newest frame."""
    if not len(new):
        return np.zeros(0, bool)
    return (new[:, :-1] != new[:, -1:]).reshape(len(new), -1).any(axis=1)


def _stack_break(what: str, name: str, k: int, lanes: np.ndarray) -> str:
    return (f"{what}: field {name!r} (stacks of {k} frames) of lanes {lanes.tolist()}: the stack does not continue "
            f"the stack before it in its episode (its frames 0..{k - 2} must be that stack's frames 1..{k - 1}): "
            f"stack the frames on axis 0 with gymnasium's FrameStackObservation(env, {k}), or declare the field "
            "without stack=; nothing was added")


def _stack_start(name: str, k: int, lanes: np.ndarray, what: str) -> str:
    return (f"{what}: field {name!r} (stacks of {k} frames) of lanes {lanes.tolist()} starts an "
            f"episode with a stack that is not its first frame repeated {k} times, as gymnasium's "
            f"FrameStackObservation(env, {k}) (padding_type='reset', its default) gives it; nothing was added")


def _value_check(field: Field) -> tuple[tuple[_core.ValueCheck, float, float], bool]:
    """The block filler's check of ``field``'s values (check, low, high), and whether a value of its dtype and
    shape may be copied as is and left to that check (False: :func:`rlflow.specs.validate` checks it)."""
    dtype = field.dtype
    typed = sys.byteorder == "little" and dtype.isnative and (
        dtype.kind in "iu" or (dtype.kind == "f" and dtype.itemsize in (4, 8)))
    mode = _specs.check_mode(field) if typed else None
    if mode is None:
        return (_core.ValueCheck.NONE, 0.0, 0.0), False
    kind, low, high = mode
    if kind == _specs.FINITE:
        return (_core.ValueCheck.FINITE, 0.0, 0.0), True
    if kind == _specs.BOUNDS:
        return (_core.ValueCheck.BOUNDS, low, high), True
    return (_core.ValueCheck.NONE, 0.0, 0.0), True


def _leading(value: Any, part: _Part, what: str) -> int:
    """How many rows ``value`` holds (the leading axis of its first leaf); SpecError when it has none."""
    try:
        flat = {part.key: value} if part.single else _specs.flatten_data(part.spec, value, part.key)
    except SpecError as exc:
        raise SpecError(f"{what}: {exc}") from None
    shape = np.shape(next(iter(flat.values())))
    if not shape:
        raise SpecError(f"{what}: expected a leading axis of observations, got a scalar")
    return int(shape[0])


def _zero_inactive(actions: Any, active: np.ndarray) -> Any:
    """``actions`` (nested, each leaf ``[E, A, ...]``) with zeros for the agents not ``active`` (``[E, A]``)."""
    if active.all():
        return actions

    def zero(leaf: Any) -> Any:
        arr = np.asarray(leaf)
        if arr.shape[:2] != active.shape:
            return leaf  # the shape is wrong: the checks that follow name it
        return np.where(active.reshape(active.shape + (1,) * (arr.ndim - 2)), arr, np.zeros((), arr.dtype))

    return _map(zero, actions)


def _map(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _map(fn, v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_map(fn, v) for v in value)
    return fn(value)
