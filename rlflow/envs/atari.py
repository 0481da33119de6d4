"""Atari games (the Arcade Learning Environment, through gymnasium and ``ale-py``) with the standard
preprocessing, as a :class:`~rlflow.envs.GymEnvironment` whose observations are frame stacks stored once.

Each env is ``gymnasium.make(env_id, frameskip=1)`` (the ALE's own frame skip off: the preprocessing does it)
wrapped in gymnasium's ``AtariPreprocessing`` (up to ``noop_max`` no-op actions after each reset, the action
repeated ``frame_skip`` frames with the last two max-pooled, ``screen_size`` x ``screen_size`` grey frames),
:class:`FireReset` (FIRE after each reset and each life lost, in the games that have it) and
``FrameStackObservation(env, frame_stack)`` (the last ``frame_stack`` frames on axis 0, the first frame
repeated at an episode's start). The returned env's observation spec has ``stack=frame_stack``, so a store
keeps each 84 x 84 frame once (``docs/pixels.md``).

The rewards are the game's (clip them in the learner's loss, so that what is logged and evaluated is the
game's score). An episode is a whole game (``ALE/...-v5`` games also end at 108,000 frames, gymnasium's
``max_num_frames_per_episode``), or, with ``episodic_life=True`` (for training), one life: :class:`EpisodicLife`
under the frame stack ends an episode at each life lost and marks ``info["game_over"]``, so that the loop's
episode statistics still count whole games.

Needs the ``atari`` extra: ``pip install "rlflow[atari]"`` (ale-py ships the game ROMs, and OpenCV, which
``AtariPreprocessing`` resizes with).
"""

from __future__ import annotations

import functools
from typing import Any, SupportsFloat

import gymnasium
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from rlflow.envs.gymnasium import GymEnvironment, to_autoreset_mode, worker_ignoring_sigint

__all__ = ["EpisodicLife", "FireReset", "atari", "atari_env"]


class FireReset(gymnasium.Wrapper):
    """Press FIRE where a game waits for it to launch the ball (e.g. Breakout): after each reset, and after each
    life lost, as Stable-Baselines3's and CleanRL's Atari wrappers do (theirs fire at the reset that follows a
    life lost). ``reset`` returns the observation after one FIRE step (resetting again in the rare case that
    step ends the game); a ``step`` that loses a life and does not end the game is followed by a FIRE step,
    whose reward is added to it and whose observation and flags it returns. Games without FIRE pass through."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
        self.fire = meanings.index("FIRE") if "FIRE" in meanings else None
        self.lives = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.fire is not None:
            obs, _, terminated, truncated, info = self.env.step(self.fire)
            if terminated or truncated:
                obs, info = self.env.reset()
        self.lives = info.get("lives", 0)
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = info.get("lives", 0)
        if self.fire is not None and lives < self.lives and not (terminated or truncated):
            obs, more, terminated, truncated, info = self.env.step(self.fire)
            reward = float(reward) + float(more)
            lives = info.get("lives", 0)
        self.lives = lives
        return obs, reward, terminated, truncated, info


class EpisodicLife(gymnasium.Wrapper):
    """A life lost ends the episode, for training (the learner sees a terminal state where a life is lost, as
    DeepMind's DQN and Stable-Baselines3's and CleanRL's Atari wrappers do); evaluate without it, on whole games.

    A ``step`` that loses a life and does not end the game returns ``terminated=True``; the ``reset`` that
    follows goes on with the same game (one no-op step, action 0, whose observation starts the next
    episode; a new game if that step ends it) instead of starting a new one. A reset after the game ended
    (or the first one, or one given a ``seed`` or options) resets the game. Every step's and reset's
    ``info`` holds ``game_over`` (bool): True where the step ended the game (terminated or truncated), False
    where only a life was lost or the game goes on; :class:`~rlflow.loop.actors.EpisodeStats` (the returns and lengths
    the loop logs) adds the episodes of one game up until ``game_over``. Put it under a frame stack, so that
    stacks start over at each life, as at each episode's start."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        if self.game_over or seed is not None or options:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        self.game_over = False
        self.lives = info.get("lives", 0)
        return obs, {**info, "game_over": False}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = info.get("lives", 0)
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, {**info, "game_over": self.game_over}


def _register() -> None:
    """Register the ALE's games with gymnasium (``ALE/Pong-v5``, ...), or say which extra to install."""
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError as exc:
        raise ImportError(f"Atari games need ale-py and OpenCV ({exc.name} is missing): "
                          "pip install \"rlflow[atari]\"") from exc
    gymnasium.register_envs(ale_py)


def atari_env(env_id: str, *, frame_stack: int = 4, noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84,
              episodic_life: bool = False, **kwargs: Any) -> gymnasium.Env:
    """One Atari game ``env_id``, preprocessed and frame-stacked (a ``gymnasium.Env``: wrap it further, e.g. to
    record videos, then in ``GymEnvironment(env, frame_stack=frame_stack)``). See ``atari`` for the
    arguments; ``kwargs`` go to ``gymnasium.make`` (e.g. ``render_mode="rgb_array"``)."""
    _register()
    env = gymnasium.make(env_id, frameskip=1, **kwargs)
    env = FireReset(AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size))
    if episodic_life:
        env = EpisodicLife(env)
    return FrameStackObservation(env, frame_stack)


def atari(env_id: str, num_envs: int = 1, *, seed: int | None = None, frame_stack: int = 4, noop_max: int = 30,
          frame_skip: int = 4, screen_size: int = 84, episodic_life: bool = False, vectorization_mode: str = "sync",
          autoreset_mode: AutoresetMode | str = "same_step", **kwargs: Any) -> GymEnvironment:
    """``num_envs`` copies of the Atari game ``env_id`` (e.g. ``"ALE/Pong-v5"``), preprocessed and frame-stacked.

    Args:
        env_id: an ALE game id, ``ALE/<Game>-v5`` (sticky actions with probability 0.25, the minimal action
            set) or any id ale-py registers.
        num_envs: lanes (sub-envs of a gymnasium vector env).
        seed: the seed of the first ``reset()`` (sub-env ``i`` gets ``seed + i``).
        frame_stack: frames per observation (``[frame_stack, screen_size, screen_size]`` uint8).
        noop_max, frame_skip, screen_size: ``AtariPreprocessing``'s.
        episodic_life: a life lost ends an episode (:class:`EpisodicLife`; for training only: the logged
            returns and lengths are still whole games).
        vectorization_mode: ``"sync"`` (one process) or ``"async"`` (a process per env).
        autoreset_mode: the vector env's (``"same_step"``, ``"next_step"`` or ``"disabled"``).
        kwargs: more arguments of the game (``gymnasium.make``), e.g. ``repeat_action_probability=0.0``.

    Returns:
        A :class:`~rlflow.envs.GymEnvironment` whose observation spec is a frame stack (``stack=frame_stack``).
    """
    _register()
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
    if vectorization_mode not in ("sync", "async"):
        raise ValueError(f"vectorization_mode: expected 'sync' or 'async', got {vectorization_mode!r}")
    make = functools.partial(atari_env, env_id, frame_stack=frame_stack, noop_max=noop_max, frame_skip=frame_skip,
                             screen_size=screen_size, episodic_life=episodic_life, **kwargs)
    mode = to_autoreset_mode(autoreset_mode)
    if vectorization_mode == "sync":
        vec: gymnasium.vector.VectorEnv = gymnasium.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=mode)
    else:
        vec = gymnasium.vector.AsyncVectorEnv([make] * num_envs, autoreset_mode=mode, worker=worker_ignoring_sigint)
    return GymEnvironment(vec, seed=seed, frame_stack=frame_stack)
