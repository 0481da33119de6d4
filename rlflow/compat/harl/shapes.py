"""HARL's shapes of a space: ``get_shape_from_obs_space`` and ``get_shape_from_act_space``."""

from __future__ import annotations

from typing import Any

__all__ = ["act_dim", "obs_shape"]


def obs_shape(space: Any) -> tuple[int, ...]:
    """An observation space's shape: a Box's shape (HARL's list spaces: their first entry)."""
    if isinstance(space, list | tuple):
        return (int(space[0]),) if not isinstance(space[0], list | tuple) else tuple(space[0])
    return tuple(int(d) for d in space.shape)


def act_dim(space: Any) -> int:
    """An action's width as HARL stores it: 1 for Discrete, the shape's first entry otherwise."""
    name = type(space).__name__
    if name == "Discrete":
        return 1
    if name in ("Box", "MultiDiscrete", "MultiBinary"):
        return int(space.shape[0])
    raise ValueError(f"act_spaces: expected Discrete, Box, MultiDiscrete or MultiBinary spaces, got {space}")
