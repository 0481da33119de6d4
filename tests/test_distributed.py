"""rlflow.distributed: the replay server driven by asyncio alone, then whole runs on a local Ray instance
(loopback only, one instance for the test session, every wait bounded)."""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys

import numpy as np
import pytest
from dist_parts import BadPolicy, RandomPolicy, WindowLearner, make_tagged

from rlflow import adders, distributed
from rlflow.adders import StepBlock
from rlflow.distributed.server import BlockRefused, ReplayServer
from rlflow.replay import Fifo, MinSize, SampleToInsertRatio, StepStore, Table, Uniform
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
def parts(rate_limiter=None, lanes=4):
    env = make_tagged(0)
    store = StepStore(env.spec, capacity=64, lanes=lanes)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=rate_limiter, name="replay")
    return adders.NStepTransition(store, [table], n=1)


def blocks(actor, lanes, count, steps=4):
    """``count`` block states of actor ``actor`` (its env's steps on ``lanes``), as the actor ships them."""
    env = make_tagged(actor, len(lanes))
    block = StepBlock(parts().store.spec, lanes, steps, subset=True)
    ts = env.reset(seed=actor)
    block.start(np.zeros(len(lanes), bool))
    no = np.zeros(len(lanes), bool)
    block.put(block.act_zeros(), TimeStep(ts.observation, block.reward_zeros(), no, no, ts.first, no))
    out = []
    while len(out) < count:
        ts = env.step(np.zeros(len(lanes), np.int64))
        block.put(np.zeros(len(lanes), np.int64), ts)
        if block.steps == block.max_steps:
            out.append(block.state_dict())
            block.clear()
    return out


def test_blocks_land_in_each_actors_order_whatever_order_they_come_in():
    """Each actor's blocks are written in their order (a later one waits for the one before it), interleaved
    with the other actor's; the store ends as the same blocks written in order leave it."""
    shipped = {0: blocks(0, [0, 1], 3), 1: blocks(1, [2, 3], 3)}

    async def scenario(order):
        server = ReplayServer(pickle.dumps(parts()), "replay", [[0, 1], [2, 3]], steps=10_000, block_steps=4,
                              wait_timeout=5)
        for actor in (0, 1):
            await server.start_actor(actor)
        await asyncio.gather(*(server.insert_block(a, seq, shipped[a][seq], 8) for a, seq in order))
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
            await server.insert_block(0, 0, nan, 8)
        with pytest.raises(BlockRefused, match=r"actor 1: .*lanes"):
            await server.start_actor(1)
            await server.insert_block(1, 0, good[0], 8)
        with pytest.raises(BlockRefused, match=r"actor 0: .*follow"):
            await server.insert_block(0, 1, good[1], 8)  # its first block never landed: no episode in progress
        for k, v in server.adder.store.state_dict().items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)
        assert server.table.size == 0
        await server.insert_block(0, 2, good[0], 8)
        assert server.table.size == 6  # its first step is the reset

    asyncio.run(scenario())


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
        await server.insert_block(0, 0, shipped[0], 8)  # 6 items (its first step is the reset): the sample may go
        assert len(await early) == 6
        seq = 1
        while True:  # blocks go in until the limiter's window is full
            task = asyncio.create_task(server.insert_block(0, seq, shipped[seq], 8))
            await asyncio.sleep(0.05)
            seq += 1
            if not task.done():
                break
        assert seq > 2 and server.table.size == 6 + 8 * (seq - 2)
        await server.sample(8)  # makes room: the waiting block goes in
        await asyncio.wait_for(task, 5)
        assert server.table.size == 6 + 8 * (seq - 1)
        while True:
            stuck = asyncio.create_task(server.insert_block(0, seq, shipped[seq], 8))
            await asyncio.sleep(0.05)
            seq += 1
            if not stuck.done():
                break
        await server.stop()
        assert await asyncio.wait_for(stuck, 5) is True  # told to stop, not written
        assert server.table.size == 6 + 8 * (seq - 2)
        assert await server.sample(8) is None
        return await server.progress()

    progress = asyncio.run(scenario())
    assert progress.samples == 14 and progress.stopping


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


@pytest.mark.timeout(240)
def test_a_collect_only_run_and_a_refused_actor(ray_local):
    """Without a learner the actors fill a table that only collects; an actor whose policy returns actions out
    of the action space fails the run with an error naming the policy and the space."""
    env = make_tagged(0)
    store = StepStore(env.spec, capacity=500, lanes=4)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    result = distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=2_000, num_actors=2,
                             progress=False)
    assert result.env_steps >= 2_000 and result.learner_steps == 0 and result.episodes
    with pytest.raises(Exception, match=r"BadPolicy.act returned actions that do not fit"):
        distributed.run(make_tagged, BadPolicy, None, adder, table, steps=2_000, num_actors=2, progress=False)


def test_settings_that_cannot_work_are_refused_before_anything_starts():
    adder, table = run_parts()
    with pytest.raises(ValueError, match="4 lanes for 3 actors"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, num_actors=3)
    with pytest.raises(ValueError, match="checkpoint_every"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, checkpoint_every=5)
    with pytest.raises(TypeError, match="unknown option"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, num_actor=2)
    with pytest.raises(ValueError, match="error_buffer of at least"):
        tight, tight_table = run_parts(error_buffer=20)
        distributed.run(make_tagged, RandomPolicy, WindowLearner(), tight, tight_table, steps=10, num_actors=2)
    with pytest.raises(ValueError, match="block_steps: expected an integer >= 1"):
        distributed.run(make_tagged, RandomPolicy, None, adder, table, steps=10, block_steps=0)
