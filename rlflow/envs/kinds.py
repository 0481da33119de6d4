"""What kind of environment an object is, so that each wrapper can name the right one when given another."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["env_kind", "make_envs", "wrapper_for"]

_WRAPPERS = {
    "aec": "envs.AECEnvironment([env, ...]) (one lane per (env, agent))",
    "parallel": "envs.ParallelEnvironment([env, ...]) (one lane per env)",
    "gymnasium": "envs.GymEnvironment(env), or envs.make(env_id, num_envs=...)",
    "vector": "envs.GymEnvironment(vector_env), or envs.make(env_id, num_envs=...)",
}


def env_kind(env: Any) -> str | None:
    """``"aec"`` (a PettingZoo turn-based env), ``"parallel"`` (a PettingZoo parallel env), ``"vector"`` (a
    gymnasium vector env), ``"gymnasium"`` (a gymnasium env), or None (none of these)."""
    if hasattr(env, "agent_iter") and hasattr(env, "last") and hasattr(env, "possible_agents"):
        return "aec"
    if hasattr(env, "possible_agents") and hasattr(env, "step"):
        return "parallel"
    gymnasium = sys.modules.get("gymnasium")
    if gymnasium is not None:  # an env of gymnasium's exists only once gymnasium is imported
        if isinstance(env, gymnasium.vector.VectorEnv):
            return "vector"
        if isinstance(env, gymnasium.Env):
            return "gymnasium"
    return None


def wrapper_for(env: Any) -> str:
    """The rlflow wrapper that takes ``env``, in words (empty when ``env`` is no env rlflow knows)."""
    kind = env_kind(env)
    return "" if kind is None else _WRAPPERS[kind]


def make_envs(envs: Any, kind: str, wrapper: str) -> list[Any]:
    """``envs`` (a list of ``kind`` envs or functions making them) as a list of envs; raises, naming
    ``wrapper`` and the wrapper to use instead, on one env not in a list, an empty list, or an env of
    another kind."""
    if env_kind(envs) is not None:
        raise TypeError(f"envs: {wrapper} expected a list of {_NAMES[kind]} envs, got one "
                        f"{type(envs).__name__}: pass [env]")
    if not isinstance(envs, Sequence) or isinstance(envs, str):
        raise TypeError(f"envs: {wrapper} expected a list of {_NAMES[kind]} envs or functions making them, "
                        f"got {type(envs).__name__}")
    if not len(envs):
        raise ValueError(f"envs: {wrapper} expected at least one {_NAMES[kind]} env, got none")
    made = [e() if callable(e) and not hasattr(e, "possible_agents") else e for e in envs]
    for i, env in enumerate(made):
        got = env_kind(env)
        if got != kind:
            other = f"; use {_WRAPPERS[got]}" if got is not None else ""
            raise TypeError(f"envs[{i}]: {wrapper} expected a {_NAMES[kind]} env, got "
                            f"{type(env).__name__}" + (f" (a {_NAMES[got]} env){other}" if got else ""))
    return made


_NAMES = {"aec": "PettingZoo AEC (turn-based)", "parallel": "PettingZoo parallel", "vector": "gymnasium vector",
          "gymnasium": "gymnasium"}
