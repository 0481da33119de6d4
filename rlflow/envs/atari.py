"""Atari games (the Arcade Learning Environment, through gymnasium and ``ale-py``) with the standard
preprocessing, as a :class:`~rlflow.envs.GymEnvironment` whose observations are frame stacks stored once.

Each env is ``gymnasium.make(env_id, frameskip=1)`` (the ALE's own frame skip off: the preprocessing does it)
wrapped in gymnasium's ``AtariPreprocessing`` (up to ``noop_max`` no-op actions after each reset, the action
repeated ``frame_skip`` frames with the last two max-pooled, ``screen_size`` x ``screen_size`` grey frames)
and ``FrameStackObservation(env, frame_stack)`` (the last ``frame_stack`` frames on axis 0, the first frame
repeated at an episode's start). The returned env's observation spec has ``stack=frame_stack``, so a store
keeps each 84 x 84 frame once (``docs/pixels.md``).

The rewards are the game's (clip them in the learner's loss, so that what is logged and evaluated is the
game's score), and an episode is a whole game (``ALE/...-v5`` games also end at 108,000 frames, gymnasium's
``max_num_frames_per_episode``): a learner that wants a life loss as a terminal state reads it from the
``lives`` the env reports in ``info``.

Needs the ``atari`` extra: ``pip install "rlflow[atari]"`` (ale-py ships the game ROMs, and OpenCV, which
``AtariPreprocessing`` resizes with).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from rlflow.envs.gymnasium import GymEnvironment

__all__ = ["atari"]


def _register() -> None:
    """Register the ALE's games with gymnasium (``ALE/Pong-v5``, ...), or say which extra to install."""
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError as exc:
        raise ImportError(f"Atari games need ale-py and OpenCV ({exc.name} is missing): "
                          "pip install \"rlflow[atari]\"") from exc
    gymnasium.register_envs(ale_py)


def atari(env_id: str, num_envs: int = 1, *, seed: int | None = None, frame_stack: int = 4, noop_max: int = 30,
          frame_skip: int = 4, screen_size: int = 84, vectorization_mode: str = "sync",
          **kwargs: Any) -> GymEnvironment:
    """``num_envs`` copies of the Atari game ``env_id`` (e.g. ``"ALE/Pong-v5"``), preprocessed and frame-stacked.

    Args:
        env_id: an ALE game id, ``ALE/<Game>-v5`` (sticky actions with probability 0.25, the full action set
            off) or any id ale-py registers.
        num_envs: lanes (sub-envs of a gymnasium vector env, same-step autoreset).
        seed: the seed of the first ``reset()`` (sub-env ``i`` gets ``seed + i``).
        frame_stack: frames per observation (``[frame_stack, screen_size, screen_size]`` uint8).
        noop_max, frame_skip, screen_size: ``AtariPreprocessing``'s.
        vectorization_mode: ``"sync"`` (one process) or ``"async"`` (a process per env).
        kwargs: more arguments of the game (``gymnasium.make``), e.g. ``repeat_action_probability=0.0``.

    Returns:
        A :class:`~rlflow.envs.GymEnvironment` whose observation spec is a frame stack (``stack=frame_stack``).
    """
    _register()
    if int(num_envs) < 1:
        raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
    wrappers: list[Any] = [functools.partial(AtariPreprocessing, noop_max=noop_max, frame_skip=frame_skip,
                                  screen_size=screen_size),
                functools.partial(FrameStackObservation, stack_size=frame_stack)]
    vec = gymnasium.make_vec(env_id, int(num_envs), vectorization_mode=vectorization_mode,
                             vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, wrappers=wrappers,
                             frameskip=1, **kwargs)
    return GymEnvironment(vec, seed=seed, frame_stack=frame_stack)
