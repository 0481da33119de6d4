"""Gymnasium environments as a stream of batched TimeSteps, one lane per sub-environment.

:class:`GymEnvironment` wraps a ``gymnasium.Env`` (one lane) or a ``gymnasium.vector.VectorEnv`` (``E``
lanes, sync or async, any autoreset mode) and hands out :class:`~rlflow.types.TimeStep` s whose flags follow
the table in :mod:`rlflow.types`::

    env = make("CartPole-v1", num_envs=4)        # autoreset_mode="same_step"
    ts = env.reset(seed=0)                       # every lane: first=True
    ts = env.step(np.zeros(4, np.int64))         # reward [4] float32, flags [4] bool

How each gymnasium autoreset mode (``env.metadata["autoreset_mode"]``) becomes flags, per lane:

- ``NEXT_STEP``: the ending call gives ``last=True, first=False`` with ``final_observation`` (and
  ``observation``) the true final observation. On the next call gymnasium resets that sub-env and
  ignores its action; the wrapper reports ``first=True, last=False``, reward 0, both flags False.
- ``SAME_STEP``: the ending call gives ``first=last=True``; ``observation`` is the reset observation,
  ``final_observation`` the true final one, taken from ``info["final_obs"]``.
- ``DISABLED``: after a step where lanes ended, the wrapper resets them with
  ``env.reset(options={"reset_mask": ended})`` and reports ``first=last=True`` as in ``SAME_STEP``;
  the reset infos are added to ``info`` as ``info["reset_info"]`` (mask ``info["_reset_info"]``).

A plain ``gymnasium.Env`` is one lane in ``SAME_STEP`` mode: it gives what a one-env ``SyncVectorEnv`` in
``SAME_STEP`` mode would (infos batched like a vector env's), stepped directly (:class:`_OneEnv`); the
flag arrays of its steps are read-only (one shared ``[False]`` and ``[True]``: copy them to change them).

``final_observation`` is ``None`` when no lane is ``last``. Otherwise its rows for the lanes that are
not ``last`` carry no meaning: they are the lanes' observations under ``NEXT_STEP`` (where
``final_observation`` *is* ``observation``) and zero under ``SAME_STEP`` and ``DISABLED`` (a new array,
built from the ended lanes' rows only).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import create_empty_array

from rlflow.envs import state as env_state
from rlflow.envs.kinds import wrapper_for
from rlflow.specs import Spec, from_space
from rlflow.specs import frame_stack as frame_stack_spec
from rlflow.types import ONE_LANE_NO, ONE_LANE_YES, TimeStep, step_spec

__all__ = ["GymEnvironment", "make", "to_autoreset_mode"]

_MODE_NAMES = {
    "next_step": AutoresetMode.NEXT_STEP,
    "same_step": AutoresetMode.SAME_STEP,
    "disabled": AutoresetMode.DISABLED,
}


def to_autoreset_mode(value: AutoresetMode | str) -> AutoresetMode:
    """``value`` as an ``AutoresetMode``: the enum, its value (``"SameStep"``) or name (``"same_step"``)."""
    if isinstance(value, AutoresetMode):
        return value
    if isinstance(value, str):
        if value.lower() in _MODE_NAMES:
            return _MODE_NAMES[value.lower()]
        try:
            return AutoresetMode(value)
        except ValueError:
            pass
    raise ValueError(
        "autoreset_mode: expected 'next_step', 'same_step', 'disabled' or a gymnasium.vector.AutoresetMode, "
        f"got {value!r}"
    )


def _set_row(out: Any, i: int, value: Any) -> None:
    """Write one sub-env's (nested) observation into row ``i`` of the batched arrays ``out``."""
    if isinstance(out, Mapping):
        for key, sub in out.items():
            _set_row(sub, i, value[key])
    elif isinstance(out, tuple):
        for sub, item in zip(out, value, strict=True):
            _set_row(sub, i, item)
    else:
        out[i] = value


def _rows_where(obs: Any, mask: np.ndarray) -> Any:
    """New arrays shaped like ``obs``: its rows where ``mask``, zero elsewhere (only those rows are copied)."""
    if isinstance(obs, Mapping):
        return {key: _rows_where(sub, mask) for key, sub in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_rows_where(sub, mask) for sub in obs)
    arr = np.asarray(obs)
    out = np.zeros(arr.shape, arr.dtype)  # calloc: rows never written cost no copy
    out[mask] = arr[mask]
    return out


class _OneEnv:
    """A plain ``gymnasium.Env`` as a one-env ``SAME_STEP`` vector env: ``reset`` returns what
    ``SyncVectorEnv`` returns for one env, and :meth:`step_timestep` the TimeStep of its step (batched
    observations, rewards, flags and infos; ``final_obs`` / ``final_info`` in the info of an ending step),
    without its per-step overhead."""

    num_envs = 1

    def __init__(self, env: gymnasium.Env) -> None:
        self.env = env
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        space = env.observation_space
        self._box_dtype = None if isinstance(space, gymnasium.spaces.Dict | gymnasium.spaces.Tuple) else space.dtype

    def reset(self, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        seed = seed[0] if isinstance(seed, list | tuple) else seed
        obs, info = self.env.reset(seed=seed, options=options)
        return _batch_one(obs, self.single_observation_space), _batch_info(info)

    def step_timestep(self, actions: Any) -> TimeStep:
        """One step as the TimeStep :class:`GymEnvironment` makes of a one-env ``SAME_STEP`` vector env's
        step (infos included), built directly: one lane has no masks to combine and no final
        observations to stack. Its flags are shared read-only arrays (:data:`_NO`, :data:`_YES`)."""
        return self.timestep(*self.env.step(actions[0] if type(actions) is np.ndarray else _row_zero(actions)))

    def timestep(self, obs: Any, reward: Any, terminated: Any, truncated: Any, info: Any) -> TimeStep:
        """The TimeStep of what the env's ``step`` returned (resetting the env when the episode ended)."""
        space = self.single_observation_space
        dtype = self._box_dtype
        if terminated or truncated:
            final_obs, final_info = obs, info
            obs, info = self.env.reset()
            info = {**_batch_info(info), "final_obs": _objects(final_obs), "_final_obs": np.ones(1, np.bool_),
                    "final_info": _batch_info(final_info), "_final_info": np.ones(1, np.bool_)}
            return TimeStep(_batch_one(obs, space), np.array([reward], np.float32), _YES if terminated else _NO,
                            _YES if truncated else _NO, _YES, _YES, _batch_one(final_obs, space), info)
        return TimeStep(np.array(obs, dtype)[None] if dtype is not None else _batch_one(obs, space),
                        np.array([reward], np.float32), _NO, _NO, _NO, _NO, None, _batch_info(info) if info else {})

    def close(self) -> None:
        self.env.close()


# The one-env wrapper's flags: one lane's False and True, shared by every TimeStep it makes, so read-only.
_NO, _YES = ONE_LANE_NO, ONE_LANE_YES


def _objects(value: Any) -> np.ndarray:
    out = np.empty(1, object)
    out[0] = value
    return out


def _batch_one(obs: Any, space: gymnasium.Space) -> Any:
    """One env's observation with a leading axis of 1, in the space's dtypes (a copy, as SyncVectorEnv
    makes by default)."""
    if isinstance(space, gymnasium.spaces.Dict):
        return {key: _batch_one(obs[key], sub) for key, sub in space.spaces.items()}
    if isinstance(space, gymnasium.spaces.Tuple):
        return tuple(_batch_one(o, sub) for o, sub in zip(obs, space.spaces, strict=True))
    return np.array(obs, dtype=space.dtype)[None]


def _row_zero(actions: Any) -> Any:
    """Lane 0's action from batched actions."""
    if isinstance(actions, Mapping):
        return {key: _row_zero(sub) for key, sub in actions.items()}
    if isinstance(actions, tuple):
        return tuple(_row_zero(sub) for sub in actions)
    return actions[0]


def _batch_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """An env's info as a one-env vector env's: each value in an array of 1, with its ``_key`` mask."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, Mapping):
            out[key] = _batch_info(value)
        elif isinstance(value, int | float | bool | np.number | np.bool_):
            out[key] = np.array([value])
        else:
            out[key] = _objects(value)
        out[f"_{key}"] = np.ones(1, np.bool_)
    return out


class GymEnvironment:
    """A gymnasium env or vector env as a stream of batched :class:`~rlflow.types.TimeStep` s.

    Args:
        env: a ``gymnasium.Env`` (one lane, same-step form) or a ``gymnasium.vector.VectorEnv`` (one lane
            per sub-env; its autoreset mode is read from ``env.metadata["autoreset_mode"]``, ``NEXT_STEP``
            when missing, as gymnasium assumes).
        seed: the seed of the first :meth:`reset` when that call gives none (sub-env ``i`` gets ``seed + i``).
        frame_stack: ``k`` when each observation is a stack of the last ``k`` frames on axis 0 (each env
            wrapped in gymnasium's ``FrameStackObservation(env, k)``): the observation spec gets
            ``stack=k``, so a store keeps each frame once (see ``docs/pixels.md``).

    ``reset()`` must come before ``step()``. Observations are the arrays the vector env returns: new
    ones on every call with gymnasium's default ``copy=True``, its reused buffers with ``copy=False``
    (valid until the next ``step``/``reset``). The wrapper itself copies only the final observations
    of ended lanes (``SAME_STEP``, ``DISABLED``).
    """

    def __init__(self, env: gymnasium.Env | VectorEnv, *, seed: int | None = None,
                 frame_stack: int | None = None) -> None:
        if isinstance(env, VectorEnv):
            self._vec: VectorEnv = env
            mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        elif isinstance(env, gymnasium.Env):
            self._vec = _OneEnv(env)  # type: ignore[assignment]
            mode = AutoresetMode.SAME_STEP
        else:
            other = wrapper_for(env)
            raise TypeError(f"env: expected a gymnasium.Env or gymnasium.vector.VectorEnv, got {type(env).__name__}"
                            + (f"; use {other}" if other else ""))
        self._plain = isinstance(self._vec, _OneEnv)
        self._env = env
        self._mode = to_autoreset_mode(mode)
        self._num_envs = int(self._vec.num_envs)
        self._observation_spec = from_space(self._vec.single_observation_space)
        if frame_stack is not None:
            self._observation_spec = frame_stack_spec(self._observation_spec, frame_stack)
        self._action_spec = from_space(self._vec.single_action_space)
        self._seed = seed
        self._pending = np.zeros(self._num_envs, np.bool_)  # NEXT_STEP: lanes gymnasium resets on the next call
        self._needs_reset = True

    # ------------------------------------------------------------------ properties
    @property
    def env(self) -> gymnasium.Env | VectorEnv:
        """The wrapped env, as given."""
        return self._env

    @property
    def num_envs(self) -> int:
        """The number of lanes ``E``."""
        return self._num_envs

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """How the wrapped env resets ended episodes (``SAME_STEP`` for a plain ``gymnasium.Env``)."""
        return self._mode

    @property
    def single_observation_space(self) -> gymnasium.Space:
        return self._vec.single_observation_space

    @property
    def single_action_space(self) -> gymnasium.Space:
        return self._vec.single_action_space

    @property
    def observation_spec(self) -> Spec:
        """The spec of one lane's observation (from the single observation space)."""
        return self._observation_spec

    @property
    def action_spec(self) -> Spec:
        """The spec of one lane's action (from the single action space)."""
        return self._action_spec

    @property
    def spec(self) -> dict[str, Spec]:
        """The columns of a step row, without extras: ``rlflow.types.step_spec(observation, action)``."""
        return step_spec(self._observation_spec, self._action_spec)

    def step_spec(self, extras: Spec | None = None) -> dict[str, Spec]:
        """The columns of a step row with the user's ``extras`` (log-probs, values, RNN state, ...)."""
        return step_spec(self._observation_spec, self._action_spec, extras)

    # ------------------------------------------------------------------ stepping
    def reset(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> TimeStep:
        """Reset every lane: ``first=True``, ``last=False``, reward 0, both flags False."""
        if options is not None and "reset_mask" in options:
            raise ValueError("options: expected no 'reset_mask' (reset() resets every lane), got one")
        if seed is None and self._seed is not None:
            seed = self._seed
        self._seed = None
        obs, info = self._vec.reset(seed=seed, options=options)  # type: ignore[arg-type]  # (a list: one seed per env)
        n = self._num_envs
        self._pending = np.zeros(n, np.bool_)
        self._needs_reset = False
        return TimeStep(obs, np.zeros(n, np.float32), np.zeros(n, np.bool_), np.zeros(n, np.bool_),
                        np.ones(n, np.bool_), np.zeros(n, np.bool_), None, info)

    def step(self, actions: Any) -> TimeStep:
        """Take one action per lane (leading axis ``E``, also for a plain env) and report what happened."""
        if self._needs_reset:
            raise RuntimeError("step() before reset(): expected a call to reset() first")
        self._check_actions(actions)
        if self._plain:  # a plain env builds its TimeStep itself (one lane: nothing to combine)
            return self._vec.step_timestep(actions)  # type: ignore[attr-defined]
        return self._vector_timestep(actions)

    def _vector_timestep(self, actions: Any) -> TimeStep:
        """The TimeStep of the vector env's step, its flags and final observations read through its
        autoreset mode (the module docstring's table)."""
        obs, reward, terminated, truncated, info = self._vec.step(actions)
        reward = np.array(reward, dtype=np.float32)
        terminated = np.array(terminated, dtype=np.bool_)
        truncated = np.array(truncated, dtype=np.bool_)
        last = terminated | truncated
        final = None
        if self._mode is AutoresetMode.NEXT_STEP:
            first = self._pending
            if first.any():  # the reset pseudo-step: never a transition
                reward[first] = 0.0
                terminated[first] = truncated[first] = last[first] = False
            self._pending = last.copy()
            if last.any():
                final = obs
        elif self._mode is AutoresetMode.SAME_STEP:
            first = last.copy()
            if last.any():
                final = self._final_from_info(info, last)
        else:
            first = last.copy()
            if last.any():
                final = _rows_where(obs, last)  # before the reset, which may overwrite a shared buffer
                obs, reset_info = self._vec.reset(options={"reset_mask": last.copy()})
                info = {**info, "reset_info": reset_info, "_reset_info": last.copy()}
        return TimeStep(obs, reward, terminated, truncated, first, last, final, info)

    def _check_actions(self, actions: Any) -> None:
        """Raise ValueError unless every leaf of ``actions`` has a leading axis of one action per lane."""
        n = self._num_envs
        if type(actions) is np.ndarray and actions.shape[:1] == (n,):  # most calls: one array that fits
            return
        stack: list[tuple[str, Any]] = [("", actions)]
        while stack:
            path, value = stack.pop()
            if isinstance(value, Mapping):
                stack.extend((f"{path}[{k!r}]", v) for k, v in value.items())
            elif isinstance(value, tuple):
                stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
            else:
                shape = np.shape(value)
                if not shape or shape[0] != n:
                    raise ValueError(
                        f"actions{path}: expected a leading axis of size {n} (one action per lane), got shape {shape}"
                    )

    def _final_from_info(self, info: Mapping[str, Any], last: np.ndarray) -> Any:
        """The ended lanes' true final observations (``info["final_obs"]``), stacked into batched arrays."""
        lanes = np.flatnonzero(last)
        final_obs = info.get("final_obs")
        mask = info.get("_final_obs")
        if final_obs is None or (mask is not None and not np.asarray(mask)[lanes].all()):
            raise RuntimeError(
                f"a SAME_STEP env ended lanes {lanes.tolist()}: expected their final observations in "
                f"info['final_obs'], got {'none' if final_obs is None else 'a mask of ' + str(mask)}"
            )
        out = create_empty_array(self._vec.single_observation_space, n=self._num_envs, fn=np.zeros)
        for i in lanes:
            _set_row(out, int(i), final_obs[i])
        return out

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """The env's state as plain data (:mod:`rlflow.envs.state`: every wrapper's and sub-env's attributes,
        RNG states included) and the wrapper's own (the lanes ``NEXT_STEP`` resets on the next call, the
        seed of a first reset not yet made), for :meth:`load_state_dict` on an env built the same way.
        Raises :class:`~rlflow.envs.state.EnvStateError` when the env holds an object that is not plain
        data (e.g. a Box2D world, or an ``AsyncVectorEnv``'s worker processes)."""
        return {"env": env_state.capture(self._env), "pending": self._pending.copy(),
                "needs_reset": self._needs_reset, "seed": self._seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output: this env, built as the saved one was (and not reset
        since), then steps exactly as the saved env would have. Raises ``ValueError``, changing nothing,
        when it was built otherwise (other wrappers or env classes, another number of lanes)."""
        pending = np.asarray(state["pending"])
        if pending.shape != (self._num_envs,) or pending.dtype != np.bool_:
            raise ValueError(f"env state: expected the pending resets of {self._num_envs} lanes (bool), got "
                             f"{pending.dtype} {pending.shape}; build the env as the checkpointed run did")
        env_state.restore(self._env, state["env"])
        self._pending = pending.copy()
        self._needs_reset = bool(state["needs_reset"])
        self._seed = state["seed"]

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the wrapped env (and its worker processes)."""
        self._vec.close()

    def __enter__(self) -> GymEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GymEnvironment({self._env}, num_envs={self._num_envs}, autoreset_mode={self._mode.name})"


def make(
    env_id: str,
    num_envs: int | None = 1,
    *,
    vectorization_mode: str = "sync",
    autoreset_mode: AutoresetMode | str = "same_step",
    seed: int | None = None,
    **kwargs: Any,
) -> GymEnvironment:
    """Build a gymnasium env by id and wrap it.

    ``num_envs=None`` makes a plain env (``gymnasium.make``; one lane, same-step form); an integer
    (also 1) makes a vector env (``gymnasium.make_vec``) with that many lanes, ``vectorization_mode``
    ``"sync"``, ``"async"`` or ``"vector_entry_point"`` (the env's own vector class, whose autoreset
    mode must equal ``autoreset_mode``). ``kwargs`` go to the env constructor (e.g. ``max_episode_steps``)
    or, as ``vector_kwargs=``/``wrappers=``, to ``make_vec``. ``seed`` seeds the first ``reset()``.
    """
    if num_envs is None:
        return GymEnvironment(gymnasium.make(env_id, **kwargs), seed=seed)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:
        raise ValueError(f"num_envs: expected None or an integer >= 1, got {num_envs!r}")
    mode = to_autoreset_mode(autoreset_mode)
    if vectorization_mode == "vector_entry_point":
        env = gymnasium.make_vec(env_id, int(num_envs), vectorization_mode=vectorization_mode, **kwargs)
        got = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if to_autoreset_mode(got) is not mode:
            env.close()
            raise ValueError(
                f"autoreset_mode: {env_id}'s vector entry point resets in mode {to_autoreset_mode(got).name}, "
                f"got a request for {mode.name}; pass autoreset_mode={to_autoreset_mode(got).name.lower()!r} "
                "or vectorization_mode='sync'"
            )
    else:
        vector_kwargs = {**(kwargs.pop("vector_kwargs", None) or {}), "autoreset_mode": mode}
        if vectorization_mode == "async":
            vector_kwargs.setdefault("worker", worker_ignoring_sigint)
        env = gymnasium.make_vec(env_id, int(num_envs), vectorization_mode=vectorization_mode,
                                 vector_kwargs=vector_kwargs, **kwargs)
    return GymEnvironment(env, seed=seed)


def worker_ignoring_sigint(*args: Any) -> None:
    """The process of one env of a gymnasium ``AsyncVectorEnv`` (its ``worker=``): gymnasium's own, with SIGINT
    ignored. A Ctrl-C reaches every process of the terminal's group; the workers let it pass, so the main
    process alone stops, as a one-process run does (``rlflow.run`` ends its loop, writes its last checkpoint and
    logs), and then closes them."""
    from gymnasium.vector.async_vector_env import _async_worker

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _async_worker(*args)
