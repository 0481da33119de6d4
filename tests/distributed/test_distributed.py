"""rlflow.distributed: the replay server driven by asyncio alone, then whole runs on a local Ray instance
(loopback only, one instance for the test session, every wait bounded)."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from dist_parts import (
    BadPolicy,
    DyingLearner,
    GpuLearner,
    LockstepLearner,
    NodeFiles,
    OneAtATimeServer,
    OrderLearner,
    ParamsEnv,
    ParamsPolicy,
    ParityPolicy,
    PidFiles,
    RandomPolicy,
    RecordingLearner,
    StatefulLearner,
    VersionPolicy,
    WindowLearner,
    make_tagged,
    make_tagged_next_step,
    make_tagged_slowly_for_actor_1,
)

import rlflow
from rlflow import adders, distributed
from rlflow.adders import StepBlock
from rlflow.distributed.learning import LearnerWorker
from rlflow.distributed.server import BlockRefused, ReplayServer, ServerRestarted
from rlflow.loggers import read_csv
from rlflow.loop import checkpoint as run_checkpoint
from rlflow.replay import Fifo, MinSize, Queue, SampleToInsertRatio, StepStore, Table, Uniform
from rlflow.types import TimeStep


def test_rlflow_imports_no_ray_outside_distributed():
    """``import rlflow`` and every module outside rlflow.distributed (and rlflow.distributed itself, until
    run() is called) leave Ray unimported."""
    code = ("import importlib, pkgutil, sys, rlflow\n"
            "for m in pkgutil.walk_packages(rlflow.__path__, 'rlflow.'):\n"
            "    if not m.name.startswith('rlflow.distributed.'):\n"
            "        importlib.import_module(m.name)\n"
            "import rlflow.distributed\n"
            "print(sorted(k for k in sys.modules if k == 'ray' or k.startswith('ray.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- the server, without Ray
def parts(rate_limiter=None, lanes=4, capacity=64):
    env = make_tagged(0)
    store = StepStore(env.spec, capacity=capacity, lanes=lanes)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=rate_limiter, name="replay")
    return adders.NStepTransition(store, [table], n=1)


def blocks(actor, lanes, count, steps=4):
    """``count`` block states of actor ``actor`` (its env's steps on ``lanes``), as the actor ships them."""
    return list(block_stream(actor, lanes, count, steps))


def block_stream(actor, lanes, count, steps=4):
    """:func:`blocks`, made one at a time (an actor filling them as it goes)."""
    env = make_tagged(actor, len(lanes))
    block = StepBlock(parts().store.spec, lanes, steps, subset=True)
    ts = env.reset(seed=actor)
    block.start(np.zeros(len(lanes), bool))
    no = np.zeros(len(lanes), bool)
    block.put(block.act_zeros(), TimeStep(ts.observation, block.reward_zeros(), no, no, ts.first, no))
    made = 0
    while made < count:
        ts = env.step(np.zeros(len(lanes), np.int64))
        block.put(np.zeros(len(lanes), np.int64), ts)
        if block.steps == block.max_steps:
            yield block.state_dict()
            block.clear()
            made += 1


def test_blocks_land_in_each_actors_order_whatever_order_they_come_in():
    """Each actor's blocks are written in their order (a later one waits for the one before it), interleaved
    with the other actor's; the store ends as the same blocks written in order leave it."""
    shipped = {0: blocks(0, [0, 1], 3), 1: blocks(1, [2, 3], 3)}

    async def scenario(order):
        server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1], [2, 3]], steps=10_000, block_steps=4,
                              wait_timeout=5)
        for actor in (0, 1):
            await server.start_actor(actor)
        await asyncio.gather(*(server.insert_block(a, (server.incarnation, 1), seq, shipped[a][seq], 8)
                               for a, seq in order))
        return server

    in_order = asyncio.run(scenario([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]))
    shuffled = asyncio.run(scenario([(1, 2), (0, 1), (1, 0), (0, 2), (1, 1), (0, 0)]))
    for k, v in in_order.adder.store.state_dict().items():
        np.testing.assert_array_equal(v, shuffled.adder.store.state_dict()[k], err_msg=k)
    progress = asyncio.run(shuffled.progress())
    assert progress.env_steps == 48 and progress.blocks == 6
    # 6 blocks of 4 steps on 2 lanes, each actor's first step a reset (no item)
    assert progress.inserts == in_order.table.size == shuffled.table.size == (6 * 4 - 2) * 2


def test_a_bad_block_is_refused_naming_the_actor_and_changes_nothing():
    """A block with a value outside the spec, of another actor's lanes, or not following its lanes' state is
    refused (BlockRefused naming the actor); the store and table stay as they were, and the next good block
    of the actor is written."""
    good = blocks(0, [0, 1], 2)

    async def scenario():
        server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1], [2, 3]], steps=10_000, block_steps=4,
                              wait_timeout=5)
        await server.start_actor(0)
        before = {k: v.copy() for k, v in server.adder.store.state_dict().items()}
        nan = pickle.loads(pickle.dumps(good[0]))
        nan["observation"]["observation"][2, 1, 0] = np.nan
        with pytest.raises(BlockRefused, match=r"actor 0: .*observation.*finite"):
            await server.insert_block(0, (server.incarnation, 1), 0, nan, 8)
        with pytest.raises(BlockRefused, match=r"actor 1: .*lanes"):
            await server.start_actor(1)
            await server.insert_block(1, (server.incarnation, 1), 0, good[0], 8)
        with pytest.raises(BlockRefused, match=r"actor 0: .*follow"):
            # its first block never landed: no episode in progress
            await server.insert_block(0, (server.incarnation, 1), 1, good[1], 8)
        for k, v in server.adder.store.state_dict().items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)
        assert server.table.size == 0
        await server.insert_block(0, (server.incarnation, 1), 2, good[0], 8)
        assert server.table.size == 6  # its first step is the reset

    asyncio.run(scenario())


def test_blocks_of_an_earlier_start_of_an_actor_are_refused():
    """Blocks still on their way from an actor process that died (its earlier start) are refused once the
    actor started again, whether one was waiting for its turn then or comes after; the new start's blocks go
    in, counted from 0, as if the old ones had never come."""
    shipped = blocks(0, [0, 1], 3)

    async def scenario():
        server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1], [2, 3]], steps=10_000, block_steps=4,
                              wait_timeout=5)
        first = await server.start_actor(0)
        await server.insert_block(0, first, 0, shipped[0], 8)
        waiting = asyncio.create_task(server.insert_block(0, first, 2, shipped[2], 8))  # its block 1 never came
        await asyncio.sleep(0.05)
        second = await server.start_actor(0)
        assert second != first
        with pytest.raises(BlockRefused, match="started again"):
            await waiting
        with pytest.raises(BlockRefused, match="started again"):
            await server.insert_block(0, first, 1, shipped[1], 8)
        await server.insert_block(0, second, 0, shipped[0], 8)  # (the lanes' episodes were cut: a fresh start)
        await server.insert_block(0, second, 1, shipped[1], 8)
        return server

    server = asyncio.run(scenario())
    progress = asyncio.run(server.progress())
    assert progress.blocks == 3 and progress.env_steps == 24


def test_on_policy_restarts_drop_rollouts_the_learner_may_have_passed(tmp_path):
    """``on_policy``: an actor that starts again has its unsampled items dropped (it acts them again with the
    latest parameters), the other actors' stay; a server restored from its checkpoint starts with empty
    tables and the checkpoint's rows. Without ``on_policy`` both keep their items."""
    shipped = {0: blocks(0, [0, 1], 2), 1: blocks(1, [2, 3], 2)}

    async def filled(on_policy, restore=False):
        server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1], [2, 3]], steps=10_000, block_steps=4,
                              wait_timeout=5, checkpoint_dir=str(tmp_path / str(on_policy)), restore=restore,
                              on_policy=on_policy)
        if restore:
            return server
        for actor in (0, 1):
            start = await server.start_actor(actor)
            for seq, state in enumerate(shipped[actor]):
                await server.insert_block(actor, start, seq, state, 8)
        await server.checkpoint()
        saved[on_policy] = server.adder.store.count.copy()
        await server.start_actor(0)
        return server

    saved = {}

    for on_policy in (False, True):
        server = asyncio.run(filled(on_policy))
        lanes = sorted(set(server.table.items()["lane"].tolist()))
        assert lanes == ([0, 1, 2, 3] if not on_policy else [2, 3])
        restored = asyncio.run(filled(on_policy, restore=True))
        assert restored.table.size == (0 if on_policy else (2 * 4 - 1) * 4)
        np.testing.assert_array_equal(restored.adder.store.count, saved[on_policy])  # the checkpoint's rows


def test_samples_and_blocks_wait_for_each_other_under_the_rate_limiter():
    """A sample waits until enough items are in; a block waits while the limiter refuses its items, and goes
    in once a sample makes room; stop ends every wait."""
    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=6, error_buffer=12)
    shipped = blocks(0, [0, 1], 8)

    async def scenario():
        server = ReplayServer(pickle.dumps(parts(limiter)), "replay", [[0, 1]], steps=10_000, block_steps=4,
                              wait_timeout=5)
        await server.start_actor(0)
        early = asyncio.create_task(server.sample(6, timeout=5))
        await asyncio.sleep(0.05)
        assert not early.done()
        await server.insert_block(0, (server.incarnation, 1), 0, shipped[0], 8)  # 6 items (after the reset): a sample
        (sample,) = await early  # one sample (count=1)
        assert len(sample) == 6
        seq = 1
        while server.table.can_insert(8):  # blocks go in until the limiter's window is full
            await server.insert_block(0, (server.incarnation, 1), seq, shipped[seq], 8)
            seq += 1
        assert seq > 2
        size = server.table.size
        task = asyncio.create_task(server.insert_block(0, (server.incarnation, 1), seq, shipped[seq], 8))
        await asyncio.sleep(0.05)
        assert not task.done() and server.table.size == size  # it waits for room
        await server.sample(8)  # makes room: the waiting block goes in
        await asyncio.wait_for(task, 5)
        assert server.table.size == size + 8
        seq += 1
        while server.table.can_insert(8):
            await server.insert_block(0, (server.incarnation, 1), seq, shipped[seq], 8)
            seq += 1
        size = server.table.size
        stuck = asyncio.create_task(server.insert_block(0, (server.incarnation, 1), seq, shipped[seq], 8))
        await asyncio.sleep(0.05)
        await server.stop()
        assert await asyncio.wait_for(stuck, 5) is True  # told to stop, not written
        assert server.table.size == size
        assert await server.sample(8) is None
        return await server.progress()

    progress = asyncio.run(scenario())
    assert progress.samples == 14 and progress.stopping


def test_blocks_at_a_full_window_go_in_in_turn_and_nothing_waits_inside_a_write(monkeypatch):
    """Two actors push blocks as fast as they fill them while a learner samples under the window of the rate
    limiter: each block goes in whole once the table admits it (a write never has to wait inside the table,
    which would stop the server's event loop: the admission is checked again after every wake-up, right
    before the write), and the blocks waiting go in in the order they came (neither actor starves)."""
    from rlflow.replay.table import TableBase

    def no_wait(self, deadline, what):
        raise AssertionError(f"a write waited inside the table: {what}")

    monkeypatch.setattr(TableBase, "_wait", no_wait)
    limiter = SampleToInsertRatio(samples_per_insert=8.0, min_size_to_sample=200, error_buffer=4_000)
    per_actor = 150
    landed = {0: 0, 1: 0}

    async def push(server, actor):
        incarnation = await server.start_actor(actor)
        for seq, state in enumerate(block_stream(actor, [2 * actor, 2 * actor + 1], per_actor, steps=16)):
            await server.insert_block(actor, incarnation, seq, state, 32)
            landed[actor] += 1

    async def learn(server):
        while min(landed.values()) < per_actor:
            if await server.sample(64, timeout=5, count=4) is None:
                return
            await asyncio.sleep(0.001)  # a learner step

    async def scenario():
        server = ReplayServer(pickle.dumps(parts(limiter, capacity=1_000)), "replay", [[0, 1], [2, 3]],
                              steps=10**6, block_steps=16, wait_timeout=10)
        await asyncio.wait_for(asyncio.gather(push(server, 0), push(server, 1), learn(server)), 120)
        return server

    server = asyncio.run(scenario())
    assert landed == {0: per_actor, 1: per_actor}
    assert server.table.rate_limiter.inserts == (per_actor * 16 - 1) * 2 * 2


@pytest.mark.parametrize("turns", [1, 2, 3, 4])
def test_a_wait_returns_only_while_what_it_waited_for_still_holds(turns):
    """A call waits for room for one; a notify makes it, and before the waiting call runs again another call
    arrives (after ``turns`` turns of the event loop) and takes it if it is still there. Only one of them may
    go on: a waiting call woken while the room was there must not go on once it is gone (to a write that would
    then have to wait inside the table, stopping the event loop)."""
    server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1]], steps=100, block_steps=4, wait_timeout=5)
    room, went = [0], []

    async def taker(name, timeout):
        if await server._until(lambda: room[0] > 0, timeout):
            room[0] -= 1  # what a block's write does with the room it waited for
            went.append(name)

    async def scenario():
        waiting = asyncio.create_task(taker("waiting", 0.5))
        await asyncio.sleep(0.05)
        room[0] = 1
        notified = asyncio.create_task(server._notify())
        for _ in range(turns):  # the notify runs, the waiting call wakes up and looks at the room
            await asyncio.sleep(0)
        await taker("arriving", 0.5)
        await asyncio.gather(waiting, notified)

    asyncio.run(scenario())
    assert len(went) == 1 and room == [0]  # one of them took the room; the other did not go on without it


def test_a_restored_server_holds_exactly_what_its_checkpoint_held(tmp_path):
    """A server checkpoints every 16 env steps; a new one restored from the directory holds the store, table and
    counters of the last checkpoint, not what came after it; a block of the old incarnation is refused with
    ServerRestarted, and the actor started again goes on (its open episodes ended where the checkpoint had
    them)."""
    shipped = blocks(0, [0, 1], 5)
    folder = str(tmp_path / "server")

    async def first():
        server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1]], steps=10_000, block_steps=4,
                              wait_timeout=5, checkpoint_dir=folder, checkpoint_every=16)
        incarnation = await server.start_actor(0)
        for seq in range(2):
            await server.insert_block(0, incarnation, seq, shipped[seq], 8)
        saved = {k: v.copy() for k, v in server.adder.store.state_dict().items()}
        items = server.table.items()
        await server.insert_block(0, incarnation, 2, shipped[2], 8)  # 24 env steps: 8 since the checkpoint
        assert (await server.progress()).checkpoints == 1
        return incarnation, saved, items

    async def second(old):
        server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1]], steps=10_000, block_steps=4,
                              wait_timeout=5, checkpoint_dir=folder, checkpoint_every=16, restore=True)
        progress = await server.progress()
        assert progress.restored_from == 16 and progress.env_steps == 16 and progress.blocks == 2
        store = {k: v.copy() for k, v in server.adder.store.state_dict().items()}
        items = server.table.items()
        with pytest.raises(ServerRestarted, match="restarted"):
            await server.insert_block(0, old, 2, shipped[2], 8)
        incarnation = await server.start_actor(0)
        assert incarnation != old
        fresh = blocks(0, [0, 1], 1)[0]  # the actor's envs reset: a block that starts new episodes
        await server.insert_block(0, incarnation, 0, fresh, 8)
        return store, items

    old, saved, saved_items = asyncio.run(first())
    store, items = asyncio.run(second(old))
    for k, v in saved.items():
        np.testing.assert_array_equal(v, store[k], err_msg=k)
    for k, v in saved_items.items():
        np.testing.assert_array_equal(v, items[k], err_msg=k)


# --------------------------------------------------------------------------- whole runs on Ray
def run_parts(error_buffer=256):
    store = StepStore(make_tagged(0).spec, capacity=2_000, lanes=4)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), name="replay",
                  rate_limiter=SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=64,
                                                   error_buffer=error_buffer))
    return adders.NStepTransition(store, [table], n=3, discount=0.5), table


@pytest.mark.timeout(240)
def test_two_actors_and_a_learner_keep_samples_per_insert_and_sample_whole_windows(ray_local):
    """Two actor processes and the learner in this one: the learner's samples follow the rate limiter
    (samples per insert within its error buffer), and every sampled transition is one lane's consecutive
    steps of one episode (the observations say where they come from)."""
    adder, table = run_parts()
    learner = WindowLearner()
    seen = []
    result = distributed.run(make_tagged, RandomPolicy, learner, adder, table, steps=6_000, batch_size=32,
                             num_actors=2, progress=False, seed=0, observers=[lambda *row: seen.append(row)])
    assert result.env_steps >= 6_000 and learner.bad == []
    inserts = result.env_steps  # one item per env step (n-step transitions; episode ends add none here)
    assert abs(learner.items - 2.0 * inserts) <= 256 + 2.0 * 4 * 32 * 3 + 64 * 2
    actors = {int(row[2]["actor"]) for row in seen if row[0] == "train"}
    assert actors == {0, 1} and len(result.episodes) > 100
    assert result.learner_steps == learner.steps > 0


@pytest.mark.timeout(120)
def test_actors_start_acting_together_when_every_one_is_built(ray_local):
    """Actor 1 takes 4 s to build; actor 0 alone would take the run's 2,000 steps well within that. Both act:
    the run starts them once both are built."""
    store = StepStore(make_tagged(0).spec, capacity=1_000, lanes=4)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    rows = []
    result = distributed.run(make_tagged_slowly_for_actor_1, RandomPolicy, None, adder, table, steps=2_000,
                             num_actors=2, progress=False, observers=[lambda *row: rows.append(row)])
    per_actor = [sum(int(r[2]["length"]) for r in rows if r[0] == "train" and r[2]["actor"] == a) for a in (0, 1)]
    assert result.env_steps >= 2_000 and min(per_actor) >= 200, per_actor


def test_bursts_are_refused_before_anything_starts():
    """Actor processes write while the learner trains: there are no turns for bursts to keep."""
    env = make_tagged(0)
    store = StepStore(env.spec, capacity=100, lanes=2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    with pytest.raises(ValueError, match=r"bursts: actor processes .* one-process rlflow.run \(or bursts=False\)"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=100, num_actors=2, progress=False,
                        bursts=True)
    assert table.size == 0 and len(store) == 0


@pytest.mark.timeout(240)
def test_a_collect_only_run_and_a_refused_actor(ray_local):
    """Without a learner the actors fill a table that only collects, and an evaluator process evaluates; an
    actor whose policy returns actions out of the action space fails the run with an error naming the policy
    and the space."""
    env = make_tagged(0)
    store = StepStore(env.spec, capacity=500, lanes=4)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    rows = []
    result = distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=2_000, num_actors=2,
                             progress=False, eval_env=make_tagged(7), eval_every=500, eval_episodes=3,
                             observers=[lambda *row: rows.append(row)])
    assert result.env_steps >= 2_000 and result.learner_steps == 0 and result.episodes
    # Evaluations run in the evaluator process, each logged at the env step it was asked at: every 500 as the
    # driver sees the steps go by (a fast run may pass them between two looks) and at the end (Tagged's
    # episodes return 1 + 2 + ... + length, length 3 to 9).
    asked = [step for step, _, _ in result.evaluations]
    assert asked and asked == sorted(asked) and asked[-1] == result.env_steps and result.eval_seconds > 0
    assert all(6 <= mean <= 45 and 0 <= std <= 40 for _, mean, std in result.evaluations)
    assert [(r[1], r[2]["return"], r[2]["return_std"]) for r in rows if r[0] == "eval"] == result.evaluations
    with pytest.raises(Exception, match=r"BadPolicy.act returned actions that do not fit"):
        distributed.run(make_tagged, BadPolicy, None, adder, table, steps=2_000, num_actors=2, progress=False)


@pytest.mark.timeout(240)
def test_the_last_evaluation_has_the_last_published_parameters(ray_local):
    """The evaluation at the end of a run (after the run's parts stopped) takes the learner's last published
    parameters (the evaluation's return is the step count the learner published)."""
    from rlflow.envs import GymEnvironment

    adder, table = run_parts()
    learner = RecordingLearner()
    result = distributed.run(make_tagged, ParamsPolicy, learner, adder, table, steps=3_000, batch_size=32,
                             num_actors=2, progress=False, seed=0, eval_env=GymEnvironment(ParamsEnv()),
                             eval_every=10**9, eval_episodes=1)
    published = result.learner_steps // 10 * 10  # (publish_every=10)
    assert published > 0 and result.evaluations[-1][1] in (published, published - 10)


def test_settings_that_cannot_work_are_refused_before_anything_starts():
    adder, table = run_parts()
    with pytest.raises(ValueError, match="4 lanes for 3 actors"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, num_actors=3)
    with pytest.raises(ValueError, match="checkpoints need a checkpoint_dir or a logdir"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, checkpoint_every=5)
    with pytest.raises(TypeError, match="unknown option"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, num_actor=2)
    with pytest.raises(ValueError, match="error_buffer of at least"):
        tight, tight_table = run_parts(error_buffer=20)
        distributed.run(make_tagged, RandomPolicy, WindowLearner(), tight, tight_table, steps=10, num_actors=2)
    with pytest.raises(ValueError, match="block_steps: expected an integer >= 1"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, block_steps=0)
    with pytest.raises(TypeError, match=r"learner_options: expected a mapping of Ray actor options .* got str"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, learner_options="gpu")
    with pytest.raises(TypeError, match=r"actor_options: expected a mapping of Ray actor options .* got list"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, actor_options=["node"])


def kill_when(condition, pid_of, timeout=240):
    """In a thread: once ``condition()`` holds, SIGKILL the process ``pid_of()`` names (once)."""
    killed = []

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                pid = pid_of()
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return killed


@pytest.mark.timeout(300)
def test_a_killed_actor_restarts_and_the_run_completes(ray_local, tmp_path):
    """SIGKILL an actor's process mid-run: Ray restarts it, the run says so (a "faults" row), its steps go on
    and the run reaches its steps; every sampled window is still one lane's one episode."""
    adder, table = run_parts()
    learner = WindowLearner()
    rows = []
    pid_file = tmp_path / "actor-1.pid"
    # Ray reports a killed actor seconds later (up to about 11,000 of these env steps after the kill, unloaded):
    # the kill comes early and the run lasts long enough that the report, the restart and the restarted actor's
    # episodes come in before it ends.
    killed = kill_when(lambda: pid_file.exists() and len([r for r in rows if r[0] == "train"]) > 50,
                       lambda: int(pid_file.read_text()))
    with pytest.warns(RuntimeWarning, match="actor 1's process died"):
        result = distributed.run(PidFiles(str(tmp_path)), RandomPolicy, learner, adder, table, steps=40_000,
                                 batch_size=32, num_actors=2, progress=False, seed=0,
                                 observers=[lambda *row: rows.append(row)])
    assert killed and result.env_steps >= 40_000 and learner.bad == []
    faults = [r[2] for r in rows if r[0] == "faults"]
    assert faults == [{"actor": 1, "restarts": 1}]
    assert int(pid_file.read_text()) != killed[0]  # the restarted actor wrote its new process id
    actors_after = {int(r[2]["actor"]) for r in rows[rows.index(next(r for r in rows if r[0] == "faults")):]
                    if r[0] == "train"}
    assert actors_after == {0, 1}  # the restarted actor's episodes come in again


@pytest.mark.timeout(300)
def test_a_killed_replay_server_comes_back_from_its_checkpoint(ray_local, tmp_path):
    """SIGKILL the replay server's process after its first checkpoint: Ray restarts it, it comes back from that
    checkpoint (the run says from which env step), actors and learner go on, and the run completes."""
    adder, table = run_parts()
    learner = WindowLearner()
    rows = []
    latest = tmp_path / "checkpoints" / "server" / "latest"

    def server_pid():
        names = [n for n in ray_local.util.list_named_actors() if n.startswith("rlflow-replay-server-")]
        return ray_local.get(ray_local.get_actor(names[-1]).ping.remote())

    killed = kill_when(latest.exists, server_pid)
    with pytest.warns(RuntimeWarning, match="replay server restarted from its checkpoint"):
        result = distributed.run(make_tagged, RandomPolicy, learner, adder, table, steps=12_000, batch_size=32,
                                 num_actors=2, progress=False, seed=0, logdir=str(tmp_path), tensorboard=False,
                                 checkpoint_every=2_000, observers=[lambda *row: rows.append(row)])
    assert killed and result.env_steps >= 12_000 and learner.bad == []
    restored = [r[2]["server_restored_from"] for r in rows if r[0] == "faults"]
    assert len(restored) == 1 and restored[0] >= 2_000
    assert (tmp_path / "checkpoints" / "learner.pt").exists()


@pytest.mark.timeout(300)
def test_a_run_resumes_from_its_last_checkpoint(ray_local, tmp_path):
    """A run that ends writes the server's checkpoint and the learner's state; run again with resume=True and
    more steps, it goes on from them: its env steps and learner steps continue."""
    options = dict(batch_size=32, num_actors=2, progress=False, seed=0, logdir=str(tmp_path), tensorboard=False,
                   checkpoint_every=1_000)
    adder, table = run_parts()
    first = distributed.run(make_tagged, RandomPolicy, WindowLearner(), adder, table, steps=3_000, **options)
    adder, table = run_parts()
    learner = WindowLearner()
    second = distributed.run(make_tagged, RandomPolicy, learner, adder, table, steps=6_000, resume=True, **options)
    assert first.env_steps >= 3_000 and second.env_steps >= 6_000
    assert learner.steps > 0 and second.learner_steps == first.learner_steps + learner.steps
    assert learner.bad == []
    # The logs go on from where the first run stopped: its rows up to that env step, then the second run's.
    train = [int(r["step"]) for r in read_csv(tmp_path / "train.csv")]
    assert train == sorted(train) and train[0] < first.env_steps < train[-1]
    assert min(int(r["step"]) for r in read_csv(tmp_path / "learner.csv")) < first.env_steps
    store, table = StepStore(make_tagged(0).spec, capacity=2_000, lanes=4), None
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), name="replay",
                  rate_limiter=SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=64, error_buffer=256))
    other = adders.NStepTransition(store, [table], n=2, discount=0.5)
    with pytest.raises(Exception, match=r"adder setting 'n'"):
        distributed.run(make_tagged, RandomPolicy, WindowLearner(), other, table, steps=9_000, resume=True, **options)



@pytest.mark.timeout(240)
def test_the_learner_trains_in_a_ray_actor_of_its_own(ray_local, tmp_path):
    """With ``learner_options`` the learner trains in a Ray actor of its own (another process), samples whole
    windows there, and its state comes back to the learner object; ``learner.pt`` holds it."""
    adder, table = run_parts()
    learner = StatefulLearner()
    result = distributed.run(make_tagged, RandomPolicy, learner, adder, table, steps=4_000, batch_size=32,
                             num_actors=2, progress=False, seed=0, learner_options={"num_cpus": 0},
                             checkpoint_dir=str(tmp_path), checkpoint_every=1_000)
    assert result.env_steps >= 4_000 and result.learner_steps > 0
    assert learner.pid is not None and learner.pid != os.getpid()
    assert learner.steps == result.learner_steps and learner.bad == []
    saved = run_checkpoint.load_state(tmp_path / "learner.pt")
    assert saved["learner_steps"] == result.learner_steps and saved["learner"]["steps"] == learner.steps


@pytest.mark.timeout(240)
def test_the_learner_state_is_saved_with_each_server_checkpoint(ray_local, tmp_path):
    """``learner.pt`` is written each time the replay server writes a checkpoint, not only at the end: a
    driver killed mid-run resumes with a trained learner."""
    adder, table = run_parts()
    learner = StatefulLearner()
    path = tmp_path / "learner.pt"
    seen = []

    def look(stream, step, row):
        if stream == "train" and path.exists():
            seen.append((step, run_checkpoint.load_state(path)["learner_steps"]))

    result = distributed.run(make_tagged, RandomPolicy, learner, adder, table, steps=8_000, batch_size=32,
                             num_actors=2, progress=False, seed=0, checkpoint_dir=str(tmp_path),
                             checkpoint_every=1_000, observers=[look])
    assert seen and seen[0][0] < result.env_steps - 1_000  # written well before the end
    counts = [count for _, count in seen]
    assert counts == sorted(counts) and 0 < counts[0] < result.learner_steps and len(set(counts)) >= 2


@pytest.mark.timeout(300)
def test_an_actor_on_a_removed_node_comes_back_on_the_head(ray_cluster, ray_local, tmp_path):
    """Two nodes on this machine: actors placed on the second node (a soft node affinity, through
    ``actor_options``) come back on the head node when the second node is removed, and the run completes."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray_cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20)
    head = ray_local.get_runtime_context().get_node_id()
    files = [tmp_path / f"actor-{i}.node" for i in (0, 1)]
    removed = []

    def remove_when_placed():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(f.exists() and f.read_text() == node.node_id for f in files):
                time.sleep(1.0)  # a few blocks from the second node
                ray_cluster.remove_node(node)
                removed.append(True)
                return
            time.sleep(0.1)

    threading.Thread(target=remove_when_placed, daemon=True).start()
    adder, table = run_parts()
    learner = WindowLearner()
    rows = []
    with pytest.warns(RuntimeWarning, match="process died"):
        result = distributed.run(NodeFiles(str(tmp_path)), RandomPolicy, learner, adder, table, steps=20_000,
                                 batch_size=32, num_actors=2, progress=False, seed=0, actor_cpus=1,
                                 actor_options={"scheduling_strategy": NodeAffinitySchedulingStrategy(
                                     node.node_id, soft=True)}, observers=[lambda *row: rows.append(row)])
    assert removed and result.env_steps >= 20_000 and learner.bad == []
    assert [f.read_text() for f in files] == [head, head]  # built again on the head node
    assert {int(r[2]["actor"]) for r in rows if r[0] == "faults"} == {0, 1}


@pytest.mark.timeout(240)
def test_one_actor_and_a_queue_feed_the_learner_what_one_process_feeds_it(ray_local):
    """With one actor, sync_period=1, a policy whose actions follow from the observations, and a FIFO queue
    (each item sampled once, in insertion order), the distributed learner sees the very items, in the very
    order, that rlflow.run's learner sees: every sample of the distributed run is the one-process run's
    sample of the same number (the one-process run goes on longer, so that it has one for each)."""
    def parts():
        store = StepStore(make_tagged(0).spec, capacity=400, lanes=2)
        table = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, rate_limiter=Queue(64))
        return adders.NStepTransition(store, [table], n=2, discount=0.5), table

    adder, table = parts()
    alone = RecordingLearner()
    rlflow.run(make_tagged(0), ParityPolicy(), alone, adder, table, steps=3_000, batch_size=8, progress=False,
               seed=0)
    adder, table = parts()
    spread = RecordingLearner()
    distributed.run(make_tagged, lambda actor: ParityPolicy(), spread, adder, table, steps=1_500, batch_size=8,
                    num_actors=1, sync_period=1, progress=False, seed=0)
    assert 150 < len(spread.seen) < len(alone.seen)
    for i, seen in enumerate(spread.seen):
        np.testing.assert_array_equal(alone.seen[i], seen, err_msg=f"sample {i}")


@pytest.mark.timeout(60)
def test_the_learner_keeps_one_sample_request_in_flight_and_learns_in_the_order_served(ray_local):
    """Ray runs an asyncio actor's calls concurrently in no set order, so the learner keeps one sample request
    in flight: the server never runs two at once, and the learner learns from the samples in the order the
    server made them."""
    from rlflow.distributed.variables import VariableSource

    server = ray_local.remote(OneAtATimeServer).remote()
    source = ray_local.remote(VariableSource).remote()
    learner = OrderLearner()
    ray_local.get([server.most_at_once.remote(), source.newer.remote(-1)])  # both up
    worker = LearnerWorker(learner, server, source, batch_size=4, prefetch=3, publish_every=5, wait_timeout=10)
    for _ in range(100):
        worker.train(0.1)
        if len(learner.seen) > 20:
            break
    assert worker.learner_steps == len(learner.seen) > 20
    assert learner.seen == list(range(len(learner.seen)))
    assert ray_local.get(server.most_at_once.remote()) == 1
    assert ray_local.get(source.newer.remote(-1))[0] == len(learner.seen) // 5 - 1  # published every 5 steps


@pytest.mark.timeout(120)
def test_a_learner_that_cannot_be_pickled_is_refused_for_its_own_actor(ray_local):
    """With ``learner_options`` the learner moves into another process: one that cannot be pickled is refused,
    naming it (in the driver it trains as it is)."""
    adder, table = run_parts()
    learner = WindowLearner()
    learner.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"learner: rlflow\.distributed\.run moves it into another process"):
        distributed.run(make_tagged, RandomPolicy, learner, adder, table, steps=500, batch_size=32, num_actors=2,
                        progress=False, learner_options={"num_cpus": 0})


@pytest.mark.timeout(120)
def test_a_learner_process_that_dies_ends_the_run_with_its_error(ray_local):
    """Ray does not restart the learner's own actor (its training would be lost): the run ends with the error."""
    adder, table = run_parts()
    with pytest.raises(ray_local.exceptions.RayActorError):
        distributed.run(make_tagged, RandomPolicy, DyingLearner(), adder, table, steps=20_000, batch_size=32,
                        num_actors=2, progress=False, learner_options={"num_cpus": 0})


# --------------------------------------------------------------------------- on-policy lockstep
def lockstep_parts(n_steps=4, lanes=4, queue=64):
    """PPO's layout: each lane's rollouts of ``n_steps`` actions as items of ``n_steps + 1`` rows, running on
    across episode ends, in a FIFO queue; the rows carry the version of the parameters that acted."""
    env = make_tagged_next_step(0)
    spec = env.step_spec({"version": rlflow.specs.Field((), np.int64)})
    store = StepStore(spec, capacity=8 * (n_steps + 1), lanes=lanes)
    table = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, cross_episodes=True,
                  rate_limiter=Queue(queue), name="rollouts")
    return adders.Sequence(store, [table], length=n_steps + 1, period=n_steps, end_behavior="continue"), table


@pytest.mark.timeout(240)
def test_on_policy_actors_act_in_lockstep_with_the_learner(ray_local):
    """``on_policy``: every learner step gets one rollout of each of the 4 lanes (2 actors), each rollout
    acted by the parameters of that very step (its first action by the step before, as in one process: the
    action that completes the previous rollout's last row), and each lane's rollouts follow on from one
    another (the last row of one is the first of the next)."""
    adder, table = lockstep_parts()
    learner = LockstepLearner()
    result = distributed.run(make_tagged_next_step, VersionPolicy, learner, adder, table, steps=480, batch_size=4,
                             num_actors=2, on_policy=True, progress=False, seed=0)
    assert result.env_steps >= 480 and len(learner.seen) >= 25
    previous = None
    for k, obs, version, last in learner.seen:
        sources = obs[:, :, 0]
        assert (sources == sources[:, :1]).all()  # each item is one lane's
        order = np.argsort(sources[:, 0])
        assert sorted(sources[:, 0].tolist()) == [0, 1, 100, 101]  # one rollout of every lane
        acted = ~last
        assert (version[:, 1:][acted[:, 1:]] == k).all(), (k, version)
        assert (version[:, 0][acted[:, 0]] == max(k - 1, 0)).all(), (k, version)
        if previous is not None:  # each lane's rollout starts at the row its last one ended on
            np.testing.assert_array_equal(obs[order, 0], previous)
        previous = obs[order, -1]


@pytest.mark.timeout(300)
def test_an_on_policy_actor_killed_mid_run_comes_back_in_step(ray_local, tmp_path):
    """SIGKILL an ``on_policy`` actor: Ray restarts it, the server cut its lanes' episodes, and its blocks are
    sized again so that every learner step still gets one rollout of every lane (else the learner would wait
    for the restarted actor's rollouts forever); the run completes."""
    adder, table = lockstep_parts()
    learner = LockstepLearner()
    rows = []
    pid_file = tmp_path / "actor-1.pid"
    killed = kill_when(lambda: pid_file.exists() and len(learner.seen) > 10, lambda: int(pid_file.read_text()))
    with pytest.warns(RuntimeWarning, match="actor 1's process died"):
        result = distributed.run(PidFiles(str(tmp_path), next_step=True), VersionPolicy, learner, adder, table,
                                 steps=1_600, batch_size=4, num_actors=2, on_policy=True, progress=False, seed=0,
                                 observers=[lambda *row: rows.append(row)])
    assert killed and result.env_steps >= 1_600
    assert [r[2] for r in rows if r[0] == "faults"] == [{"actor": 1, "restarts": 1}]
    for _, obs, _, _ in learner.seen:
        sources = obs[:, :, 0]
        assert (sources == sources[:, :1]).all() and sorted(sources[:, 0].tolist()) == [0, 1, 100, 101]
    assert len(learner.seen) > 15  # rollouts after the restart came in step too


@pytest.mark.timeout(240)
def test_on_policy_actors_refuse_envs_that_reset_in_the_same_step(ray_local):
    """An on-policy actor's env must store one row per lane per step: one in ``same_step`` mode fails the run
    with an error naming ``autoreset_mode='next_step'``, at once (an actor that fails to build is not a
    process that died: no restarts)."""
    import warnings

    adder, table = lockstep_parts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Exception, match=r"an env with autoreset_mode='next_step'.*got AutoresetMode.SAME_STEP"):
            distributed.run(make_tagged, VersionPolicy, LockstepLearner(), adder, table, steps=400, batch_size=4,
                            num_actors=2, on_policy=True, progress=False)
    assert not [w for w in caught if "process died" in str(w.message)]


def test_on_policy_settings_that_cannot_work_are_refused():
    adder, table = lockstep_parts()
    with pytest.raises(ValueError, match="expected publish_every=1"):
        distributed.run(make_tagged_next_step, VersionPolicy, LockstepLearner(), adder, table, steps=10,
                        batch_size=4, on_policy=True, publish_every=5)
    with pytest.raises(ValueError, match=r"expected batch_size=4 \(the store's lanes\), got 2"):
        distributed.run(make_tagged_next_step, VersionPolicy, LockstepLearner(), adder, table, steps=10,
                        batch_size=2, on_policy=True)
    with pytest.raises(ValueError, match="expected a Sequence of period >= 2"):
        store = StepStore(adder.store.spec, capacity=40, lanes=4)
        one_step = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, cross_episodes=True,
                         rate_limiter=Queue(64))
        distributed.run(make_tagged_next_step, VersionPolicy, LockstepLearner(),
                        adders.Sequence(store, [one_step], length=2, period=1, end_behavior="continue"), one_step,
                        steps=10, batch_size=4, on_policy=True)
    with pytest.raises(ValueError, match="a run without a learner would never act past its first rollouts"):
        distributed.run(make_tagged_next_step, VersionPolicy, None, adder, table, steps=10, on_policy=True)
    with pytest.raises(ValueError, match=r"needs a Sequence adder with end_behavior='continue'.*got NStepTransition"):
        transitions, replay = run_parts()
        distributed.run(make_tagged, RandomPolicy, WindowLearner(), transitions, replay, steps=10, batch_size=4,
                        on_policy=True)
    with pytest.raises(ValueError, match="got Sequence with end_behavior='zero_pad'"):
        store = StepStore(adder.store.spec, capacity=40, lanes=4)
        padded_table = Table(store, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, rate_limiter=Queue(64))
        padded = adders.Sequence(store, [padded_table], length=5, period=4)
        distributed.run(make_tagged_next_step, VersionPolicy, LockstepLearner(), padded, padded_table, steps=10,
                        batch_size=4, on_policy=True)
    with pytest.raises(ValueError, match=r"give the Queue a size of at least 64"):
        small, small_table = lockstep_parts(queue=32)
        distributed.run(make_tagged_next_step, VersionPolicy, LockstepLearner(), small, small_table, steps=10,
                        batch_size=4, on_policy=True)


@pytest.mark.timeout(240)
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_a_learner_given_a_gpu_trains_on_it_in_its_own_actor(ray_local):
    """``learner_options={"num_gpus": 1}``: Ray gives the learner's actor the GPU, the learner trains there
    (its tensors on cuda) and its state, cuda tensors included, comes back to the learner object."""
    adder, table = run_parts()
    learner = GpuLearner()
    result = distributed.run(make_tagged, RandomPolicy, learner, adder, table, steps=3_000, batch_size=32,
                             num_actors=2, progress=False, seed=0, learner_options={"num_gpus": 1})
    assert result.learner_steps == learner.steps > 0 and learner.bad == []
    assert learner.pid != os.getpid() and learner.gpu_ids and learner.total.is_cuda
    assert float(learner.total.item()) == learner.items  # every sampled item went through the GPU
