"""A program run by ``test_local_ray.py`` in a fresh process, as a user's would: it imports Ray first (the
order that leaves rlflow no chance to set Ray's variables before Ray reads them), then runs the docs' worked
example of ``rlflow.distributed.run`` with ``address=None``, or, given ``init_local``, after starting Ray
itself with ``distributed.init_local`` as ``docs/distributed.md`` shows. At its 20th step the learner lists every socket
that a process of the run (this process and all its descendants) listens on; the program prints them as JSON,
with what it sees of Ray after the run: whether it is still started, and Ray's switch between loopback and the
machine's address (its environment variable and the flag Ray read from it at import)."""

import json
import os
import sys

import numpy as np
import psutil
import ray  # (before rlflow, on purpose)
from ray._private import ray_constants

import rlflow
from rlflow import adders, distributed, envs
from rlflow.replay import Fifo, SampleToInsertRatio, StepStore, Table, Uniform


def listening() -> list[list]:
    """``[process name, address, port]`` of every listening socket of this process and its descendants."""
    found = set()
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            for c in process.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((process.name(), c.laddr.ip, c.laddr.port))
        except psutil.Error:  # a process that ended while it was looked at
            pass
    return [list(row) for row in sorted(found)]


class RandomPolicy(rlflow.Policy):
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def act(self, observation, state, *, evaluation=False):
        return self.rng.integers(0, 2, len(observation)), None, state


class ListeningLearner(rlflow.Learner):
    def __init__(self):
        self.steps, self.listening = 0, None

    def step(self, sample):
        self.steps += 1
        if self.steps == 20:
            self.listening = listening()
        return {}

    def get_params(self):
        return self.steps


def make_env(actor):
    return envs.make("CartPole-v1", num_envs=2, seed=100 * actor)


if __name__ == "__main__":
    if sys.argv[1:] == ["init_local"]:
        distributed.init_local(num_cpus=4, object_store_memory=100 * 2**20)
    store = StepStore(make_env(0).spec, capacity=20_000, lanes=2 * 2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(),
                  rate_limiter=SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=500, error_buffer=1_000))
    adder = adders.NStepTransition(store, [table], n=3, discount=0.99)
    learner = ListeningLearner()
    distributed.run(make_env, RandomPolicy, learner, adder, table, steps=3_000, batch_size=64, num_actors=2,
                    progress=False, seed=0)
    resources = ray.cluster_resources() if ray.is_initialized() else {}
    json.dump({"listening": learner.listening, "learner_steps": learner.steps,
               "ray_still_initialized": ray.is_initialized(),
               "cpus": resources.get("CPU"),
               "switch": [os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray_constants.ENABLE_RAY_CLUSTER]},
              sys.stdout)
