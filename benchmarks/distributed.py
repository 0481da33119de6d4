"""rlflow.distributed on a local Ray instance: inserts, sampling, acting and start-up.

Each case runs in this process against one local Ray instance (loopback only) started here:

- ``inserts``: 2 pusher processes ship StepBlocks of 17-float observations (``--block-steps`` steps of
  ``--lanes`` lanes each, all continuing one episode per lane) to one replay server as fast as the
  server answers, with ``max_in_flight`` blocks unanswered each; reported: transitions written per second
  over ``--seconds``.
- ``learner``: a learner step of about 2 ms (a torch MLP on a batch of 256, one intra-op thread) fed by the
  replay server while 2 actors act, against the same learner sampling the same kind of table in this
  process; reported: learner steps per second of each and their ratio. The rate limiter never holds the
  learner back (a wide window). ``--learner-device cuda`` trains both on a GPU, ``--learner-actor`` puts the
  distributed one in a Ray actor of its own (``learner_options``, with ``num_gpus=1`` on a GPU).
- ``acting``: collect-only runs with CartPole costing ``--cost-ms`` of CPU per step, 1 actor then 2 actors
  (one env each); reported: env steps per second and the ratio.
- ``startup``: in a new process, the wall-clock from importing rlflow to the end of a run of one block per
  actor (its first stored steps) on a local Ray it starts (Ray's shutdown after the run not counted), with
  Python's bytecode cache as it is and with an empty cache directory (the compiled core is built at install).

    python benchmarks/distributed.py                      # every case
    python benchmarks/distributed.py --cases inserts --seconds 10
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import ray
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch import nn

import rlflow
from rlflow import adders, distributed, envs, specs
from rlflow.adders import StepBlock
from rlflow.distributed.server import ReplayServer
from rlflow.replay import Fifo, MinSize, SampleToInsertRatio, StepStore, Table, Uniform
from rlflow.types import TimeStep, step_spec

SPEC = step_spec(specs.Field((17,), np.float32), specs.Field((), np.int64, low=0, high=5))


# --------------------------------------------------------------------------- inserts
@ray.remote(num_cpus=1)
def push(server, actor: int, lanes: list[int], block_steps: int, seconds: float, max_in_flight: int) -> int:
    """Ship blocks of ``block_steps`` continuing steps on ``lanes`` for ``seconds``; the steps written."""
    n = len(lanes)
    rng = np.random.default_rng(actor)
    block = StepBlock(SPEC, lanes, block_steps, subset=True)
    no, yes = np.zeros(n, bool), np.ones(n, bool)
    obs = rng.uniform(-1, 1, (n, 17)).astype(np.float32)
    incarnation = ray.get(server.start_actor.remote(actor))
    block.start(no)
    block.put(np.zeros(n, np.int64), TimeStep(obs, np.zeros(n, np.float32), no, no, yes, no))
    while block.steps < block_steps:
        block.put(rng.integers(0, 6, n), TimeStep(obs, np.ones(n, np.float32), no, no, no, no))
    first = block.state_dict()
    block.clear()
    while block.steps < block_steps:
        block.put(rng.integers(0, 6, n), TimeStep(obs, np.ones(n, np.float32), no, no, no, no))
    steady = ray.put(block.state_dict())  # shipped again and again: each is a block of continuing steps
    in_flight, seq, written = [], 0, 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        state = first if seq == 0 else steady
        in_flight.append(server.insert_block.remote(actor, incarnation, seq, state, block_steps * n))
        seq += 1
        if len(in_flight) > max_in_flight:
            ray.get(in_flight.pop(0))
            written += block_steps * n
    ray.get(in_flight)
    return written + len(in_flight) * block_steps * n


def inserts(args: argparse.Namespace) -> dict[str, float]:
    lanes, out = args.lanes, {}
    for block_steps in args.block_steps:
        store = StepStore(SPEC, capacity=200_000, lanes=2 * lanes)
        table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1), name="replay")
        adder = adders.NStepTransition(store, [table], n=1)
        server = ray.remote(num_cpus=0)(ReplayServer).remote(pickle.dumps(adder), "replay",
                                                              [list(range(lanes)), list(range(lanes, 2 * lanes))],
                                                              10**12, block_steps, 60.0)
        ray.get(server.ping.remote())
        ray.get([push.remote(server, a, list(range(a * lanes, (a + 1) * lanes)), block_steps, 1.0, 4)
                 for a in range(2)])  # warm-up: kernels compiled, processes started
        start = time.perf_counter()
        before = ray.get(server.progress.remote()).env_steps
        ray.get([push.remote(server, a, list(range(a * lanes, (a + 1) * lanes)), block_steps, args.seconds, 4)
                 for a in range(2)])
        seconds = time.perf_counter() - start
        after = ray.get(server.progress.remote()).env_steps
        ray.kill(server)
        out[f"transitions_per_s@{block_steps * lanes}_a_block"] = (after - before) / seconds
    return out


# --------------------------------------------------------------------------- learner
class MLPLearner(rlflow.Learner):
    """A torch MLP regression step on each batch: about 2 ms for a batch of 256 on one CPU thread (or on
    ``device``); its state is when each step ended (what comes back from a learner in its own actor)."""

    def __init__(self, hidden: int, device: str = "cpu") -> None:
        torch.manual_seed(0)
        self.device = device
        self.times: list[float] = []  # when each step ended
        self.net = nn.Sequential(nn.Linear(17, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 6)).to(device)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-4)

    def step(self, sample):
        data = sample.data
        obs = torch.from_numpy(data.observation).to(self.device, non_blocking=True)
        action = torch.from_numpy(data.action).to(self.device, non_blocking=True)
        q = self.net(obs).gather(1, action[:, None])[:, 0]
        loss = ((q - torch.from_numpy(data.reward).to(self.device, non_blocking=True)) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.times.append(time.perf_counter())
        return {"loss": loss.item()}

    def rate(self, seconds: float) -> float:
        """Steps per second over the last ``seconds`` of its steps."""
        end = self.times[-1]
        return sum(t > end - seconds for t in self.times) / seconds

    def get_params(self):
        return None

    def state_dict(self):
        return {"times": self.times}

    def load_state_dict(self, state):
        self.times = list(state["times"])


class Randomish(rlflow.Policy):
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 6, len(observation)), None, state


class Box17(gym.Env):
    """17 random floats a step, 6 actions, episodes of 200 steps."""

    observation_space = gym.spaces.Box(-1, 1, (17,), np.float32)
    action_space = gym.spaces.Discrete(6)

    def __init__(self) -> None:
        self.rng, self.t = np.random.default_rng(0), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.rng.uniform(-1, 1, 17).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        return self.rng.uniform(-1, 1, 17).astype(np.float32), 1.0, False, self.t >= 200, {}


def make_box(actor: int):
    return envs.GymEnvironment(SyncVectorEnv([Box17] * 4, autoreset_mode=AutoresetMode.SAME_STEP), seed=actor)


def learner_table(lanes: int, limiter: object) -> tuple[adders.NStepTransition, Table]:
    store = StepStore(make_box(0).spec, capacity=50_000, lanes=lanes)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), name="replay", rate_limiter=limiter)
    return adders.NStepTransition(store, [table], n=1), table


def learner(args: argparse.Namespace) -> dict[str, float]:
    torch.set_num_threads(1)
    # In this process: a table filled by an adder here, then sampled in a loop.
    adder, table = learner_table(4, MinSize(1_000))
    env = make_box(0)
    adder.add_first(env.reset())
    rng = np.random.default_rng(0)
    for _ in range(2_000):
        actions = rng.integers(0, 6, 4)
        adder.add(actions, env.step(actions))
    local = MLPLearner(args.hidden, args.learner_device)
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds + 1:
        local.step(table.sample(256))
    # Distributed: 2 actors of 4 envs act as the rate limiter lets them (samples_per_insert 8: 32 env steps a
    # learner step) while the same learner trains in this process.
    adder, table = learner_table(8, SampleToInsertRatio(8.0, 1_000, 20_000))
    remote = MLPLearner(args.hidden, args.learner_device)
    options = None if not args.learner_actor else {"num_gpus": 1} if args.learner_device != "cpu" else {}
    distributed.run(make_box, Randomish, remote, adder, table, steps=10**9, batch_size=256, num_actors=2,
                    progress=False, max_seconds=args.seconds + 20, seed=0,  # (actors take seconds to start)
                    learner_options=options)
    ratio = remote.rate(args.seconds) / local.rate(args.seconds)
    return {"in_process_steps_per_s": local.rate(args.seconds), "distributed_steps_per_s": remote.rate(args.seconds),
            "ratio": ratio}


# --------------------------------------------------------------------------- acting
class CostlyCartPole(gym.Wrapper):
    """CartPole whose every step burns ``cost_ms`` of CPU time."""

    def __init__(self, cost_ms: float) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.cost_s = cost_ms / 1000

    def step(self, action):
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


class CostlyEnvs:
    def __init__(self, cost_ms: float) -> None:
        self.cost_ms = cost_ms

    def __call__(self, actor: int):
        return envs.GymEnvironment(SyncVectorEnv([lambda: CostlyCartPole(self.cost_ms)],
                                                 autoreset_mode=AutoresetMode.SAME_STEP), seed=actor)


class Random2(Randomish):
    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 2, len(observation)), None, state


def acting(args: argparse.Namespace) -> dict[str, float]:
    """Steady env steps per second: from the episodes the run logs (each with its env step), over the run's
    second half, so that starting the actors is not counted."""
    rates = {}
    for actors in (1, 2):
        store = StepStore(CostlyEnvs(args.cost_ms)(0).spec, capacity=20_000, lanes=actors)
        table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
        adder = adders.NStepTransition(store, [table], n=1)
        seen: list[tuple[float, int]] = []

        def note(stream: str, step: int, row: dict, seen: list = seen) -> None:
            seen.append((time.perf_counter(), step))

        distributed.run(CostlyEnvs(args.cost_ms), Random2, None, adder, table, steps=args.acting_steps,
                        num_actors=actors, progress=False, block_steps=16, observers=[note])
        half = [(t, step) for t, step in seen if step >= args.acting_steps // 2]
        rates[actors] = (half[-1][1] - half[0][1]) / (half[-1][0] - half[0][0])
    return {"one_actor_steps_per_s": rates[1], "two_actors_steps_per_s": rates[2], "ratio": rates[2] / rates[1]}


# --------------------------------------------------------------------------- start-up
STARTUP = """
import sys, time
sys.path.insert(0, {folder!r})
start = time.perf_counter()
import ray
from distributed import startup_run
from rlflow.distributed import init_local
init_local()  # as distributed.run starts it (here, so that its shutdown is not timed)
startup_run()
print(time.perf_counter() - start)
ray.shutdown()
"""


def startup_run() -> None:
    """A run of one block per actor (2 actors), starting its own local Ray instance."""
    store = StepStore(make_box(0).spec, capacity=1_000, lanes=8)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), rate_limiter=MinSize(1))
    adder = adders.NStepTransition(store, [table], n=1)
    distributed.run(make_box, Randomish, None, adder, table, steps=1, num_actors=2, progress=False, block_steps=4)


def startup(args: argparse.Namespace) -> dict[str, float]:
    """From ``import rlflow`` to the end of a run of one block per actor (its first stored steps), in a new
    process that starts its own Ray (its shutdown after that is not counted): with Python's bytecode cache as
    it is (warm), and with an empty cache directory (cold: every module the actors and the server import is
    compiled to bytecode)."""
    out = {}
    code = STARTUP.format(folder=os.path.dirname(os.path.abspath(__file__)))
    for label in ("warm_s", "cold_s"):
        times = []
        for _ in range(args.rounds):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                                              os.environ.get("PYTHONPATH")])))
            if label == "cold_s":
                env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="pycache-")
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            times.append(float(done.stdout.strip().splitlines()[-1]))
        out[label] = statistics.median(times)
    return out


CASES = {"inserts": inserts, "learner": learner, "acting": acting, "startup": startup}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", choices=list(CASES), default=list(CASES))
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds of the inserts and learner cases")
    parser.add_argument("--lanes", type=int, default=4, help="lanes per pusher (inserts)")
    parser.add_argument("--block-steps", type=int, nargs="*", default=[64, 256], help="steps a block (inserts)")
    parser.add_argument("--hidden", type=int, default=256, help="the learner MLP's width")
    parser.add_argument("--cost-ms", type=float, default=1.0)
    parser.add_argument("--acting-steps", type=int, default=6_000)
    parser.add_argument("--rounds", type=int, default=3, help="start-up runs (medians)")
    parser.add_argument("--learner-device", default="cpu", help="where the learner case's MLP trains (cuda: a GPU)")
    parser.add_argument("--learner-actor", action="store_true",
                        help="the learner case's distributed learner in a Ray actor of its own (with a GPU "
                             "for a cuda --learner-device)")
    args = parser.parse_args(argv)
    print(f"ray {ray.__version__}, numpy {np.__version__}, torch {torch.__version__}, {os.cpu_count()} cores")
    for name in args.cases:
        if name != "startup" and not ray.is_initialized():
            distributed.init_local(num_cpus=4, log_to_driver=False, object_store_memory=500 * 2**20,
                                   _temp_dir=tempfile.mkdtemp(prefix="rlflow-ray-"))
        if name == "startup" and ray.is_initialized():
            ray.shutdown()
        figures = CASES[name](args)
        print(f"{name:8s} " + "  ".join(f"{k} {v:,.2f}" for k, v in figures.items()), flush=True)
    if ray.is_initialized():
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
