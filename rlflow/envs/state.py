"""The state of an environment object as plain data, for run checkpoints that load without pickle.

:func:`capture` walks an env object (a gymnasium ``Env`` and its wrapper chain, a ``VectorEnv`` and its
sub-envs, a PettingZoo env) and returns every instance attribute that is state, as plain data:

- **state**: numbers, strings, None, numpy arrays and scalars of numbers, ``np.random.Generator`` s
  (their bit generator's state), ``collections.deque`` s, and dicts, lists and tuples of these;
- **env objects** inside it (gymnasium ``Env``/``VectorEnv``, PettingZoo ``ParallelEnv``/``AECEnv``, and
  lists or tuples of them, e.g. ``SyncVectorEnv.envs``): walked the same way;
- **configuration**, not saved: spaces, ``EnvSpec`` s, enum members, numpy dtypes, classes and
  functions, and any dict, list or tuple holding one (``metadata``, ``env_fns``). A restored env gets
  its configuration from being built as the saved one was.

Any other object (a physics engine's world, a subprocess pipe, a renderer's surface) makes the env not
savable: :func:`capture` raises :class:`EnvStateError` naming where it is and what it is.

:func:`restore` puts a captured state back into an env built the same way (not reset): each env object
must be of the class it was, else ``ValueError`` before anything changes. Arrays are written in place
where the built env's array has the same dtype and shape (buffers shared between attributes stay
shared); generators get their state back. Gymnasium and PettingZoo are never imported here: their
classes are recognised only when their module is loaded.
"""

from __future__ import annotations

import collections
import enum
import functools
import sys
import types
from typing import Any

import numpy as np

__all__ = ["EnvStateError", "capture", "restore"]

_OBJECT = "__rlflow_env_object__"  # {_OBJECT: "module.Class", "attrs": {name: state}}
_GENERATOR = "__rlflow_generator__"  # {_GENERATOR: bit_generator.state}
_DEQUE = "__rlflow_deque__"  # {_DEQUE: [items], "maxlen": int or None}
_CONFIG = object()  # capture's mark for a configuration value (not saved)
_PLAIN = (bool, int, float, complex, str, type(None))


class EnvStateError(TypeError):
    """An env holds an object that is not plain data (its state cannot be saved without pickle)."""


def _env_classes() -> tuple[type, ...]:
    classes: list[type] = []
    gym = sys.modules.get("gymnasium")
    if gym is not None:
        classes += [gym.Env, gym.vector.VectorEnv]
    pz = sys.modules.get("pettingzoo")
    if pz is not None:
        classes += [pz.ParallelEnv, pz.AECEnv]
    return tuple(classes)


def _config_classes() -> tuple[type, ...]:
    classes: list[type] = [enum.Enum, np.dtype, type, types.FunctionType, types.BuiltinFunctionType,
                           types.MethodType, functools.partial]
    gym = sys.modules.get("gymnasium")
    if gym is not None:
        classes += [gym.Space, gym.envs.registration.EnvSpec]
    return tuple(classes)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def capture(env: Any, where: str = "env") -> dict[str, Any]:
    """The state of ``env`` (an env object, see the module docstring) as plain data; raises
    :class:`EnvStateError` naming the first attribute that is neither state nor configuration."""
    return _capture_object(env, where, _env_classes(), _config_classes(), set())


def _capture_object(obj: Any, where: str, envs: tuple[type, ...], config: tuple[type, ...],
                    seen: set[int]) -> dict[str, Any]:
    if id(obj) in seen:
        raise EnvStateError(f"{where}: the env object {type(obj).__name__} is reached twice (a cycle or a shared "
                            "env); expected a chain of wrappers")
    seen.add(id(obj))
    attrs: dict[str, Any] = {}
    for key, value in vars(obj).items():
        state = _capture_value(value, f"{where}.{key}", envs, config, seen)
        if state is not _CONFIG:
            attrs[key] = state
    return {_OBJECT: _name(type(obj)), "attrs": attrs}


def _capture_value(value: Any, where: str, envs: tuple[type, ...], config: tuple[type, ...], seen: set[int]) -> Any:
    """``value`` as plain data, or :data:`_CONFIG` for configuration."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject or value.dtype.names is not None:
            raise EnvStateError(f"{where}: a numpy value of dtype {value.dtype}: expected numbers")
        return value.copy()
    if isinstance(value, np.random.Generator):
        return {_GENERATOR: value.bit_generator.state}
    if envs and isinstance(value, envs):
        return _capture_object(value, where, envs, config, seen)
    if isinstance(value, config):
        return _CONFIG
    if isinstance(value, collections.deque):
        items = [_capture_value(v, f"{where}[{i}]", envs, config, seen) for i, v in enumerate(value)]
        return _CONFIG if any(v is _CONFIG for v in items) else {_DEQUE: items, "maxlen": value.maxlen}
    if type(value) in (dict, list, tuple):
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        out = {k: _capture_value(v, f"{where}[{k!r}]", envs, config, seen) for k, v in pairs}
        if any(v is _CONFIG for v in out.values()):
            return _CONFIG
        return out if isinstance(value, dict) else type(value)(out.values())
    raise EnvStateError(f"{where}: a {type(value).__module__}.{type(value).__qualname__} object, which is not plain "
                        "data (numbers, strings, None, numpy arrays, generators, containers of those) nor "
                        "configuration (spaces, specs, enums, functions)")


def restore(env: Any, state: dict[str, Any], where: str = "env", *, check_only: bool = False) -> None:
    """Put ``state`` (from :func:`capture`) back into ``env``, built as the captured env was. Raises
    ``ValueError``, having changed nothing, when an env object is not of the class it was
    (``check_only``: only that check)."""
    _restore_object(env, state, where, apply=False)
    if not check_only:
        _restore_object(env, state, where, apply=True)


def _restore_object(obj: Any, state: dict[str, Any], where: str, *, apply: bool) -> None:
    if not (isinstance(state, dict) and _OBJECT in state):
        raise ValueError(f"{where}: expected a saved env object's state, got {type(state).__name__}")
    if _name(type(obj)) != state[_OBJECT]:
        raise ValueError(f"{where}: the checkpoint holds the state of a {state[_OBJECT]}, got a {_name(type(obj))}; "
                         "build the env as the checkpointed run did")
    attrs = vars(obj)
    for key, saved in state["attrs"].items():
        value = _restore_value(attrs.get(key), saved, f"{where}.{key}", apply=apply)
        if apply and value is not attrs.get(key):
            attrs[key] = value


def _restore_value(current: Any, saved: Any, where: str, *, apply: bool) -> Any:
    """``saved`` as the value to hold (``current`` itself where it was updated in place)."""
    if isinstance(saved, dict) and _OBJECT in saved:
        _restore_object(current, saved, where, apply=apply)
        return current
    if isinstance(saved, dict) and _GENERATOR in saved:
        if not apply:
            return current
        if isinstance(current, np.random.Generator) and type(current.bit_generator).__name__ == saved[_GENERATOR][
                "bit_generator"]:
            current.bit_generator.state = saved[_GENERATOR]
            return current
        generator = np.random.Generator(getattr(np.random, saved[_GENERATOR]["bit_generator"])())
        generator.bit_generator.state = saved[_GENERATOR]
        return generator
    if isinstance(saved, dict) and _DEQUE in saved:
        return collections.deque((_restore_value(None, v, where, apply=apply) for v in saved[_DEQUE]),
                                 saved["maxlen"])
    if isinstance(saved, np.ndarray):
        if (apply and isinstance(current, np.ndarray) and current.dtype == saved.dtype
                and current.shape == saved.shape and current.flags.writeable):
            current[...] = saved
            return current
        return saved.copy()
    if isinstance(saved, dict):
        inner = current if isinstance(current, dict) else {}
        return {k: _restore_value(inner.get(k), v, f"{where}[{k!r}]", apply=apply) for k, v in saved.items()}
    if isinstance(saved, list | tuple):
        same = isinstance(current, list | tuple) and len(current) == len(saved)
        olds = current if same else [None] * len(saved)
        items = [_restore_value(c, v, f"{where}[{i}]", apply=apply)
                 for i, (c, v) in enumerate(zip(olds, saved, strict=True))]
        if isinstance(saved, tuple):
            return tuple(items)
        if same and isinstance(current, list):
            if apply:
                current[:] = items  # the list the env holds (others may hold it too)
            return current
        return items
    return saved
