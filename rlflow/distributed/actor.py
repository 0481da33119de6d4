"""A remote actor: its env(s) and policy, built in its own process, filling StepBlocks for the replay server.

:class:`ActorWorker` is what each Ray actor of :func:`rlflow.distributed.run` holds. It builds its env with
``make_env(index)`` and its policy with ``make_policy(index)``, acts as the one-process loop does (an
:class:`~rlflow.loop.actors.Actor` checks the policy's actions), and puts every step into a
:class:`~rlflow.adders.StepBlock` of its own lanes of the server's store. A full block is shipped straight to
the replay server (``insert_block``), with at most ``max_in_flight`` blocks unanswered: past that the actor
waits for the server, which waits for the rate limiter, so a fast actor runs only as far ahead of the
learner as the limiter lets it.

Parameters come from the :class:`~rlflow.distributed.variables.VariableSource`: when it ships a block and
``sync_period`` env steps (of this actor's lanes) have passed since its last pull, the actor asks for
parameters newer than its own and goes on acting; it sets them on its policy when they have arrived, at a
later block (so an actor asks at most once a block, however small ``sync_period`` is).

An ``on_policy`` actor acts in lockstep with the learner instead: its blocks are as long as it takes every
one of its lanes to write its next item (the server says how many steps: ``ReplayServer.steps_to_items``;
with envs that store one row per lane per step, ``autoreset_mode="next_step"``), and after each it waits
until the server has written it and the learner has published parameters newer than those that acted.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from rlflow.adders import StepBlock
from rlflow.core import Policy
from rlflow.distributed.retry import until_answered
from rlflow.distributed.server import ServerRestarted
from rlflow.environment import Environment
from rlflow.loop.actors import Actor, EpisodeStats
from rlflow.loop.checks import check_env
from rlflow.types import TimeStep

__all__ = ["ActorWorker"]

_LOOK = 1.0  # seconds an on_policy actor waits for parameters before it looks whether the server restarted


class _ServerGone(Exception):
    """The replay server died or restarted: the actor starts again on it."""


class ActorWorker:
    """One actor of a distributed run (see the module docstring).

    Args:
        index: the actor's number (0 ..), given to ``make_env`` and ``make_policy``.
        make_env, make_policy: build the actor's env (an rlflow env, ``num_envs`` lanes) and policy.
        server, source: Ray handles of the replay server and the variable source.
        spec, lanes: the server's store spec, and the store lanes this actor fills (one per env lane).
        block_steps: steps a block holds before it is shipped.
        sync_period: env steps (of this actor) between asks for newer parameters.
        max_in_flight: blocks shipped and not yet answered, at most.
        seed: the env's first reset is seeded ``seed`` (None: unseeded).
        wait_timeout: seconds to wait for the replay server to be up when (re)starting on it.
        on_policy: act in lockstep with the learner (see the module docstring); ``sync_period`` is then not
            used, and ``block_steps`` must hold the longest block the server asks for.
    """

    def __init__(self, index: int, make_env: Callable[[int], Environment], make_policy: Callable[[int], Policy],
                 server: Any, source: Any, spec: Any, lanes: Any, *, block_steps: int, sync_period: int,
                 max_in_flight: int, seed: int | None, wait_timeout: float = 60.0, on_policy: bool = False) -> None:
        self.index = index
        self.env = make_env(index)
        check_env(self.env, f"make_env({index})", "rlflow.distributed.run")
        lanes = np.asarray(lanes, np.int64)
        if self.env.num_envs != lanes.size:
            raise ValueError(f"make_env({index}) made an env of {self.env.num_envs} lanes; actor {index} was given "
                             f"{lanes.size} store lanes: make_env must build the same number of envs for every actor")
        if on_policy and getattr(self.env, "autoreset_mode", None) is not AutoresetMode.NEXT_STEP:
            raise ValueError(f"make_env({index}): on_policy actors need envs that store one row per lane per step: "
                             "expected an env with autoreset_mode='next_step' (e.g. envs.make(env_id, num_envs=4, "
                             f"autoreset_mode='next_step')), got {getattr(self.env, 'autoreset_mode', None)}")
        self.on_policy = bool(on_policy)
        self.policy = make_policy(index)
        self.actor = Actor(self.policy, self.env.action_spec, lanes.size, self.env.single_action_space)
        self.block = StepBlock(spec, lanes, block_steps, subset=True)
        self.stats = EpisodeStats(lanes.size)
        self.server, self.source = server, source
        self.sync_period, self.max_in_flight, self.seed = int(sync_period), int(max_in_flight), seed
        self.wait_timeout = float(wait_timeout)
        # Its start on the server, (server incarnation, start), as the server named it in start()
        self.started: tuple[int, int] = (-1, -1)
        self.version = -1  # of the parameters the policy has
        self.env_steps = 0  # this actor's, over its lanes
        self._pending_pull: Any = None
        self._in_flight: deque[Any] = deque()
        self._seq = 0
        self._unshipped_steps = 0
        self._episodes: list[tuple[float, int]] = []
        self._last_pull = 0
        self._ship_at = block_steps  # the block's steps when it is shipped

    def run(self) -> int:
        """Act until the server says the run's steps are taken (or it stops); return this actor's env steps.

        When the replay server restarts (from its checkpoint), the actor starts again on it: its episodes in
        progress end where the server's checkpoint has them, and the actor's envs reset."""
        ts = self.start()
        stop = False
        while not stop:
            actions, extras = self.actor.select_action(ts.observation, first=ts.first)
            ts = self.env.step(actions)
            self.block.put(actions, ts, extras)
            self.env_steps += self.block.num_lanes
            self._unshipped_steps += self.block.num_lanes
            self._episodes += self.stats.update(ts)
            try:
                if self.block.steps == self._ship_at:
                    stop = self.ship()
                    if self.on_policy and not stop:
                        stop = self.lockstep()
                    elif self.env_steps - self._last_pull >= self.sync_period:
                        self.pull(wait=False)
            except _ServerGone as gone:
                warnings.warn(f"actor {self.index}: {gone}; its episodes in progress are lost and its envs reset",
                              RuntimeWarning, stacklevel=1)
                ts = self.start()
        for ref in self._in_flight:  # the last answers (the run is over: a server gone now changes nothing)
            with contextlib.suppress(_ServerGone):
                self._answer(ref)
        return self.env_steps

    def start(self) -> TimeStep:
        """(Re)start on the replay server (waiting up to ``wait_timeout`` seconds for it to be up): reset the
        envs and begin every lane's episode; the parameters are pulled first."""
        import ray

        self.started = until_answered(lambda: self.server.start_actor.remote(self.index),
                                          timeout=self.wait_timeout, pause=0.5,
                                          errors=(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))
        self._in_flight.clear()
        self._seq, self._unshipped_steps, self._episodes = 0, 0, []
        self._pending_pull = None
        self.pull(wait=True)
        self._ship_at = self._steps_to_items() if self.on_policy else self.block.max_steps
        # The first reset is seeded with seed, a restart's with seed + the actor's env steps (as rlflow.run's)
        ts = self.env.reset(seed=None if self.seed is None else self.seed + self.env_steps)
        self.stats.reset()
        self.begin(ts)
        return ts

    def begin(self, ts: TimeStep) -> None:
        """Start every lane's episode at ``ts`` (the env's reset): the block's first step, with no action."""
        block = self.block
        block.start(np.zeros(block.num_lanes, bool))
        no = np.zeros(block.num_lanes, bool)
        block.put(block.act_zeros(), TimeStep(ts.observation, block.reward_zeros(), no, no, np.asarray(ts.first), no),
                  block.extras_zeros())
        self.actor.reset()

    def ship(self) -> bool:
        """Send the block to the server and empty it; whether an answer that came says stop."""
        import ray

        ref = self.server.insert_block.remote(self.index, self.started, self._seq, self.block.state_dict(),
                                              self._unshipped_steps, self._episodes)
        self._seq += 1
        self.block.clear()
        self._unshipped_steps, self._episodes = 0, []
        self._in_flight.append(ref)
        stop = self._answers_until(self.max_in_flight)
        ready, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
        for ref in ready:  # answers already here: a stop is seen without waiting
            self._in_flight.remove(ref)
            stop = self._answer(ref) or stop
        return stop

    def lockstep(self) -> bool:
        """``on_policy``, after a block is shipped: once the server has written every shipped block, size the
        next block and wait for parameters newer than those that acted, for as long as the run goes on (its
        end closes the variable source; a restarted server sends the actor to start again on it). Whether to
        stop (a server's answer said so, or the run ended while waiting)."""
        import ray

        if self._answers_until(0):
            return True
        self._ship_at = self._steps_to_items()
        while True:  # until the learner publishes, the run ends, or the server restarts (then start again on it)
            answer = ray.get(self.source.newer.remote(self.version, _LOOK))
            if answer is not None:
                self._set_params(answer)
                return False
            if ray.get(self.source.closed.remote()):
                return True
            if self._answer(self.server.incarnation_now.remote()) != self.started[0]:
                raise _ServerGone("the replay server restarted")

    def _answers_until(self, left: int) -> bool:
        """Wait for the answers to the oldest blocks in flight until ``left`` are; whether one says stop."""
        stop = False
        while len(self._in_flight) > left:
            stop = self._answer(self._in_flight.popleft()) or stop
        return stop

    def _steps_to_items(self) -> int:
        """The steps the next block needs for every lane of this actor to write its next item (the server's
        count; ``on_policy``)."""
        steps = self._answer(self.server.steps_to_items.remote(self.index))
        if steps > self.block.max_steps:
            raise RuntimeError(f"actor {self.index}: the server asks for a block of {steps} steps, the actor's blocks "
                               f"hold {self.block.max_steps}")
        return steps

    def _answer(self, ref: Any) -> Any:
        """The server's answer to a call (for a block: whether to stop); :class:`_ServerGone` when the server
        died or restarted since."""
        import ray

        try:
            return ray.get(ref)
        except ServerRestarted as exc:
            raise _ServerGone(str(exc).splitlines()[-1]) from None
        except ray.exceptions.RayActorError as exc:
            raise _ServerGone(f"the replay server is gone ({type(exc).__name__})") from None

    def pull(self, *, wait: bool) -> None:
        """Ask the variable source for parameters newer than the policy's; set them when they have come (at once
        with ``wait``; else at a later call, never blocking)."""
        import ray

        if self._pending_pull is None:
            self._pending_pull = self.source.newer.remote(self.version)
        ready, _ = ray.wait([self._pending_pull], timeout=None if wait else 0)
        if not ready:
            return
        answer = ray.get(self._pending_pull)
        self._pending_pull = None
        if answer is not None:
            self._set_params(answer)
        self._last_pull = self.env_steps

    def _set_params(self, answer: tuple[int, list[Any]]) -> None:
        """Give the policy the parameters of the variable source's answer ``(version, [ref])``."""
        import ray

        self.version, (params_ref,) = answer
        self.policy.set_params(ray.get(params_ref))
        self._last_pull = self.env_steps
