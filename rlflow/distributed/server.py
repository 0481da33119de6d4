"""The replay server: the adder's store and tables in one asyncio process, fed StepBlocks by remote actors.

:class:`ReplayServer` holds the very adder (with its store and tables) a one-process run would use. Each
actor owns some of the store's lanes and ships what it collected as StepBlocks of those lanes
(:meth:`insert_block`); the server writes each block through the adder's one write path, whole or not
at all, and the learner samples the table (:meth:`sample`) and sends priorities back
(:meth:`update_priorities`, stale-safe: keys of removed items are skipped).

All of it runs in one event loop (a Ray asyncio actor that reserves no CPU), so the store and tables see
one call at a time. Nothing here waits inside a table: a block waits (``await``) until every table admits
its items, a sample until the table admits it, each for at most ``wait_timeout`` seconds, and every wait
ends when :meth:`stop` is called. A waiting block or sample lets every other call through, which is how
the rate limiter's samples-per-insert holds across processes: actors pushing faster than the learner
samples wait for it, and the other way round.

The class has no Ray in it (:mod:`rlflow.distributed.launcher` makes it a Ray actor); it can be driven by
``asyncio`` alone, as its tests do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pickle
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlflow.adders import StepBlock

__all__ = ["BlockRefused", "Progress", "ReplayServer", "ServerRestarted"]


class BlockRefused(ValueError):
    """A block an actor shipped does not fit the server's store or does not follow from its lanes' state."""


class ServerRestarted(RuntimeError):
    """A block was filled for an earlier run of the server (before a restart): the actor must start again
    (:meth:`ReplayServer.start_actor`)."""


@dataclass
class Progress:
    """What the server has taken so far, for the driver's progress bar and logs."""

    env_steps: int = 0  # env steps written (over every actor's lanes)
    blocks: int = 0
    inserts: int = 0  # items inserted into the learner's table
    samples: int = 0  # items sampled from it
    episodes: list[tuple[int, int, float, int]] = field(default_factory=list)  # (actor, env step, return, length)
    table_size: int = 0
    stopping: bool = False
    restored_from: int | None = None  # env steps of the checkpoint this server came back from (None: none)
    checkpoints: int = 0  # written by this server
    incarnation: int = 0  # of the server process (another after a restart)


class ReplayServer:
    """The adder, its store and tables, taking blocks from actors and serving samples.

    Args:
        adder: the adder a one-process run would use (its store and tables with it), or its pickle (what
            another process sends: unpickled here, its arrays are the server's own and writable).
        table: the name of the table the learner samples (one of ``adder.tables``), or None.
        actor_lanes: per actor, the store lanes it fills.
        steps: the env steps to take in all; a block that reaches them gets ``stop`` in its answer.
        block_steps: the most steps an actor's block holds.
        wait_timeout: seconds a block or sample waits for the rate limiter before its call gives up.
        checkpoint_dir: where the server writes its checkpoints (:mod:`rlflow.loop.checkpoint`'s layout: the
            store, every table, the adder's state and the server's counters), None: none.
        checkpoint_every, checkpoint_seconds: a checkpoint when this many env steps (0: never) or seconds
            (None: never) have passed since the last one, checked after each block.
        restore: come back from the latest checkpoint in ``checkpoint_dir`` (a restarted server, or a
            resumed run), if there is one.
        on_policy: the actors act in lockstep with the learner (``rlflow.distributed``'s ``on_policy``): an
            actor that starts again has its unsampled items dropped (it acts them again with the latest
            parameters), and a restored server starts with empty tables (the rollouts in its checkpoint may
            belong to updates the learner has passed).
    """

    def __init__(self, adder: Any, table: str | None, actor_lanes: Sequence[Sequence[int]], steps: int,
                 block_steps: int, wait_timeout: float = 30.0, checkpoint_dir: str | None = None,
                 checkpoint_every: int = 0, checkpoint_seconds: float | None = None, *, restore: bool = False,
                 on_policy: bool = False) -> None:
        self.adder = adder = pickle.loads(adder) if isinstance(adder, bytes) else adder
        names = [t.name for t in adder.tables]
        if table is not None and table not in names:
            raise ValueError(f"table {table!r}: the adder writes tables {names}")
        self.table = next((t for t in adder.tables if t.name == table), None)
        self.spec = adder.store.spec
        self.steps = int(steps)
        self.block_steps = int(block_steps)
        self.wait_timeout = float(wait_timeout)
        self._lanes = [np.asarray(lanes, np.int64) for lanes in actor_lanes]
        self._receivers: dict[int, StepBlock] = {}
        self._next_seq = [0] * len(self._lanes)
        self._starts = [0] * len(self._lanes)  # per actor: its starts on this server (start_actor)
        self._queue: deque[int] = deque()  # tickets of the blocks waiting for the rate limiter, in order
        self._tickets = 0
        self._progress = Progress()
        self._changed: asyncio.Condition | None = None  # made in the event loop, on first use
        self.incarnation = time.time_ns()  # blocks filled for another incarnation are refused
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every, self.checkpoint_seconds = int(checkpoint_every), checkpoint_seconds
        self.on_policy = bool(on_policy)
        if restore and checkpoint_dir is not None:
            self._restore(checkpoint_dir)
        self._saved_at = (self._progress.env_steps, time.monotonic())

    # ------------------------------------------------------------------ checkpoints
    def _restore(self, checkpoint_dir: str) -> None:
        """Load the latest checkpoint in ``checkpoint_dir`` (store, tables, adder, counters), if one was written."""
        from rlflow.loop import checkpoint as run_checkpoint

        path = run_checkpoint.latest(checkpoint_dir)
        if path is None:
            return
        state = run_checkpoint.load_run(path, self.adder.store, self.adder.tables, self.adder)
        self.adder.load_state_dict(state["adder"])
        counters = state["server"]
        p = self._progress
        p.env_steps, p.blocks, p.inserts, p.samples = (int(counters[k]) for k in ("env_steps", "blocks", "inserts",
                                                                                   "samples"))
        p.restored_from = p.env_steps
        if self.on_policy:
            self._drop_items()

    async def checkpoint(self) -> str | None:
        """Write a checkpoint now (atomically: a crash while writing keeps the one before); its directory."""
        if self.checkpoint_dir is None:
            return None
        from rlflow.loop import checkpoint as run_checkpoint

        p = self._progress
        counters = {"env_steps": p.env_steps, "blocks": p.blocks, "inserts": p.inserts, "samples": p.samples}
        path = run_checkpoint.save_run(self.checkpoint_dir, p.env_steps, self.adder.store, self.adder.tables,
                                       {"adder": self.adder.state_dict(), "server": counters})
        p.checkpoints += 1
        self._saved_at = (p.env_steps, time.monotonic())
        return str(path)

    async def _maybe_checkpoint(self) -> None:
        steps, when = self._saved_at
        p = self._progress
        due_steps = self.checkpoint_every > 0 and p.env_steps - steps >= self.checkpoint_every
        due_time = self.checkpoint_seconds is not None and time.monotonic() - when >= self.checkpoint_seconds
        if due_steps or due_time:
            await self.checkpoint()

    # ------------------------------------------------------------------ waits
    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``ready()`` or :meth:`stop`; False if ``timeout`` seconds passed first. On True, ``ready()``
        holds now (it is checked again after every wake-up, with no await between that check and the return),
        so the caller acts on it before any other call runs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        changed = self._condition()
        while not (self._progress.stopping or ready()):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            async with changed:
                if self._progress.stopping or ready():  # changed while the lock was taken
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        return True

    async def _notify(self) -> None:
        changed = self._condition()
        async with changed:
            changed.notify_all()

    # ------------------------------------------------------------------ actors
    async def insert_block(self, actor: int, start: tuple[int, int], seq: int, state: Mapping[str, Any],
                           env_steps: int, episodes: Sequence[tuple[float, int]] = ()) -> bool:
        """Write actor ``actor``'s ``seq``-th block (a :meth:`StepBlock.state_dict`) since its ``start`` (what
        :meth:`start_actor` answered), once its blocks before it are written and every table admits its items;
        ``env_steps`` and ``episodes`` (return, length) are what the actor's env did to fill it. Returns whether
        the actor should stop (the run's steps are reached, or the server stops). Raises :class:`BlockRefused`
        naming the actor for a block that does not fit (the store and tables are then as they were) or of an
        earlier start of the actor (a process that died with blocks in flight), :class:`ServerRestarted` for a
        block filled before the server restarted."""
        if not 0 <= actor < len(self._lanes):
            raise BlockRefused(f"actor {actor}: the server knows actors 0..{len(self._lanes) - 1}")
        self._check_start(actor, start)
        stale = self._stale(actor, start)
        if not await self._until(lambda: stale() or self._next_seq[actor] == seq, self.wait_timeout):
            raise BlockRefused(f"actor {actor}: block {seq} came, block {self._next_seq[actor]} never did")
        self._check_start(actor, start)
        try:
            if self._progress.stopping:
                return True
            stop = await self._write(actor, stale, state, env_steps, episodes)
        finally:
            if not stale():  # (a block of an earlier start leaves the count of the new one alone)
                self._next_seq[actor] = seq + 1
            await self._notify()
        await self._maybe_checkpoint()
        return stop

    def _stale(self, actor: int, start: tuple[int, int]) -> Callable[[], bool]:
        """Whether, now, ``start`` is no longer actor ``actor``'s start on this server."""
        given = tuple(start)  # (a list when it came through Ray)
        return lambda: given != self._start_of(actor)

    def _start_of(self, actor: int) -> tuple[int, int]:
        """Actor ``actor``'s latest start on this server, as :meth:`start_actor` answered it."""
        return self.incarnation, self._starts[actor]

    def _drop_items(self, lanes: np.ndarray | None = None) -> None:
        """Delete every table's items (of ``lanes``; None: all), as rollouts the learner may have passed."""
        for table in self.adder.tables:
            items = table.items()
            table.delete(items["key"] if lanes is None else items["key"][np.isin(items["lane"], lanes)])

    def _check_start(self, actor: int, start: tuple[int, int]) -> None:
        """Raise unless ``start`` is actor ``actor``'s latest start on this server."""
        incarnation, starts = start
        if incarnation != self.incarnation:
            raise ServerRestarted(f"actor {actor}: the replay server restarted (from its checkpoint at env step "
                                  f"{self._progress.restored_from}); start the actor again")
        if starts != self._starts[actor]:
            raise BlockRefused(f"actor {actor}: a block of its start {starts}, and it started again since "
                               f"(start {self._starts[actor]}): not written")

    async def _write(self, actor: int, stale: Callable[[], bool], state: Mapping[str, Any], env_steps: int,
                     episodes: Sequence[tuple[float, int]]) -> bool:
        block = self._receiver(actor)
        try:
            block.load_state_dict(state)
        except (ValueError, TypeError, KeyError) as exc:
            raise BlockRefused(f"actor {actor}: its block does not fit the store: {exc}") from None
        adder = self.adder
        most = block.steps * block.num_lanes * adder.max_items_per_step
        tables = adder.tables
        # Blocks waiting for the rate limiter go in in the order they began to wait (no actor starves another).
        ticket = self._tickets
        self._tickets += 1
        self._queue.append(ticket)
        try:
            admitted = await self._until(lambda: stale() or (self._queue[0] == ticket and
                                                             all(t.can_insert(most) for t in tables)),
                                         self.wait_timeout)
        finally:
            self._queue.remove(ticket)  # (the next in the queue is woken when this call ends: insert_block)
        if stale():  # the actor started again while this block waited: the block loaded since is its new one's
            raise BlockRefused(f"actor {actor}: a block of an earlier start of the actor, which started again while "
                               "it waited: not written")
        if not admitted:
            block.clear()
            raise BlockRefused(f"actor {actor}: its block's {most} items waited {self.wait_timeout:g} s for the "
                               "rate limiter (is the learner sampling?)")
        if self._progress.stopping:
            block.clear()
            return True
        before = self.table.rate_limiter.inserts if self.table is not None else 0
        try:
            adder.write(block)
        except RuntimeError as exc:  # the steps do not follow from the lanes' state: nothing was written
            block.clear()
            raise BlockRefused(f"actor {actor}: {exc}") from None
        progress = self._progress
        progress.blocks += 1
        for ret, length in episodes:
            progress.episodes.append((actor, progress.env_steps + int(env_steps), float(ret), int(length)))
        progress.env_steps += int(env_steps)
        if self.table is not None:
            progress.inserts += self.table.rate_limiter.inserts - before
        return progress.env_steps >= self.steps

    def _receiver(self, actor: int) -> StepBlock:
        """The block actor ``actor``'s blocks are loaded into (its lanes, ``block_steps`` steps)."""
        block = self._receivers.get(actor)
        return block if block is not None else self._receivers.setdefault(
            actor, StepBlock(self.spec, self._lanes[actor], self.block_steps, subset=True))

    async def start_actor(self, actor: int) -> tuple[int, int]:
        """Actor ``actor`` (re)starts: the episodes in progress on its lanes end as truncated at their last
        step written (a restarted actor loses only the steps it had not shipped), its blocks count from 0
        again and blocks of its earlier starts still on their way are refused; with ``on_policy``, its items
        not yet sampled are dropped. Returns the start its blocks name: ``(the server's incarnation, the
        actor's starts on it)``."""
        lanes = self._lanes[actor]
        most = lanes.size * self.adder.max_items_per_step
        if not await self._until(lambda: all(t.can_insert(most) for t in self.adder.tables), self.wait_timeout):
            raise RuntimeError(f"actor {actor}: the tables admitted no room for the {most} items that end its "
                               f"episodes in progress within {self.wait_timeout:g} s")
        self.adder.truncate(lanes)
        if self.on_policy:
            self._drop_items(lanes)
        self._starts[actor] += 1
        self._next_seq[actor] = 0
        await self._notify()
        return self._start_of(actor)

    async def steps_to_items(self, actor: int) -> int:
        """The steps actor ``actor`` must still ship (one row on each of its lanes a step) before every one of
        its lanes has written its next item, if no episode ends first (the adder's ``rows_until_written``, which
        a Sequence adder has): the size of an ``on_policy`` actor's next block."""
        rows = getattr(self.adder, "rows_until_written", None)
        if rows is None:
            raise TypeError(f"{type(self.adder).__name__} cannot say when its next items are written: on_policy "
                            "actors need an adder with rows_until_written (a Sequence adder)")
        steps = rows(self._lanes[actor])
        if steps.min() != steps.max():
            raise RuntimeError(f"actor {actor}: its lanes would write their next items {steps.tolist()} steps from "
                               "now, not all at once: on_policy needs a Sequence adder with end_behavior='continue' "
                               "and envs of autoreset_mode='next_step' (one row per lane per step)")
        return int(steps[0])

    # ------------------------------------------------------------------ the learner
    async def sample(self, batch_size: int, timeout: float | None = None, count: int = 1) -> list[Any] | None:
        """Up to ``count`` samples of ``batch_size`` items of the learner's table: the first once the rate
        limiter admits it, the others as far as it admits them at once (one call brings a learner several
        steps' samples). None if ``timeout`` (default ``wait_timeout``) seconds pass before the first, or the
        server stops."""
        table = self._learner_table()
        ready = await self._until(lambda: table.can_sample(batch_size),
                                  self.wait_timeout if timeout is None else timeout)
        if not ready or self._progress.stopping:
            return None
        samples = [table.sample(batch_size)]
        while len(samples) < count and table.can_sample(batch_size):
            samples.append(table.sample(batch_size))
        self._progress.samples += batch_size * len(samples)
        await self._notify()  # samples are what let a waiting block in
        return samples

    async def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of the sampled items still present (see ``Table.update_priorities``)."""
        return self._learner_table().update_priorities(keys, priorities)

    def _learner_table(self) -> Any:
        if self.table is None:
            raise RuntimeError("this server has no learner's table (table=None)")
        return self.table

    # ------------------------------------------------------------------ the driver
    async def progress(self) -> Progress:
        """What was taken so far, with the episodes that ended since the last call (handed over once)."""
        p = self._progress
        episodes, p.episodes = p.episodes, []
        return dataclasses.replace(p, episodes=episodes, table_size=self.table.size if self.table is not None else 0,
                                   incarnation=self.incarnation)

    async def stop(self) -> None:
        """End every wait now and from now on: blocks are answered ``stop`` unwritten, samples None."""
        self._progress.stopping = True
        await self._notify()

    async def incarnation_now(self) -> int:
        """This server process's incarnation (another after a restart)."""
        return self.incarnation

    async def ping(self) -> int:
        """The server's process id (an answer shows the server is up)."""
        return os.getpid()
