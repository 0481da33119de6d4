"""``rlflow.distributed.run``: the one-process run's parts, laid out as actors, a replay server and a learner.

The call mirrors :func:`rlflow.run`: the same Learner, adder and table objects (the adder with its store
and tables is moved into the replay server), plus factories for what each actor builds in its own
process (its env and its policy). See ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import pickle
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlflow.actors import evaluate as evaluate_policy
from rlflow.core import Learner, learner_step
from rlflow.distributed.actor import ActorWorker
from rlflow.distributed.server import Progress, ReplayServer
from rlflow.distributed.variables import VariableSource
from rlflow.loggers import make_logger
from rlflow.loop import RunConfig, RunResult, StopRequest
from rlflow.run_checks import check_limiter, check_unsampled, unsampled_tables

__all__ = ["Layout", "run"]

_POLL = 0.2  # seconds between the driver's looks at the server's progress
_SAMPLE_WAIT = 0.5  # seconds a sample request waits at the server before the driver looks around again
_NOT_YET = ("checkpoint_every", "checkpoint_dir", "resume")  # RunConfig fields a distributed run does not take


@dataclass(frozen=True)
class Layout:
    """Where the parts of a distributed run go and how they talk; every field is also a keyword of :func:`run`.

    Attributes:
        num_actors: actor processes; the adder's store has the same number of lanes for each.
        address: None starts a local Ray instance (or uses the one this process started); ``"auto"`` or
            ``"HOST:PORT"`` joins a running cluster.
        block_steps: env steps an actor puts in a block before it ships it; fewer where the learner's
            rate limiter could not admit a block's items at once.
        max_in_flight: blocks an actor has shipped and not had answered, at most (then it waits).
        prefetch: sample requests the learner keeps in flight.
        publish_every: learner steps between publications of its parameters.
        actor_cpus: CPUs Ray reserves for each actor (the replay server and variable source reserve none).
        wait_timeout: seconds a block or sample waits for the rate limiter at the server before it gives up.
    """

    num_actors: int = 2
    address: str | None = None
    block_steps: int = 32
    max_in_flight: int = 2
    prefetch: int = 2
    publish_every: int = 1
    actor_cpus: float = 1.0
    wait_timeout: float = 60.0

    def __post_init__(self) -> None:
        for name in ("num_actors", "block_steps", "max_in_flight", "prefetch", "publish_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if not self.actor_cpus >= 0 or not self.wait_timeout > 0:
            raise ValueError(f"actor_cpus >= 0 and wait_timeout > 0 expected, got {self.actor_cpus!r} and "
                             f"{self.wait_timeout!r}")


def run(make_env: Callable[[int], Any], make_policy: Callable[[int], Any], learner: Learner | None, adder: Any,
        table: Any, *, steps: int, batch_size: int = 32, config: RunConfig | None = None,
        layout: Layout | None = None, **options: Any) -> RunResult:
    """Train for ``steps`` env steps (over every actor's lanes) with ``layout.num_actors`` actor processes.

    Args:
        make_env: ``make_env(actor)`` builds actor ``actor``'s env (an rlflow env), in the actor's process.
        make_policy: ``make_policy(actor)`` builds its policy there (e.g. a per-actor exploration rate).
        learner: trains in this process (None: only collect).
        adder, table: the adder (its store has ``num_actors`` x ``num_envs`` lanes) and the table the
            learner samples; both move into the replay server.
        steps, batch_size: as :func:`rlflow.run`.
        config, layout, options: what the run does around its parts (:class:`~rlflow.RunConfig`, except its
            checkpoint fields) and where they go (:class:`Layout`); their fields as keywords replace theirs.
    """
    names = {f.name for f in dataclasses.fields(Layout)}
    config = (config if config is not None else RunConfig()).with_options(
        {k: v for k, v in options.items() if k not in names})
    layout = dataclasses.replace(layout if layout is not None else Layout(),
                                 **{k: v for k, v in options.items() if k in names})
    unsupported = [name for name in _NOT_YET if getattr(config, name) != getattr(RunConfig(), name)]
    if unsupported:
        raise ValueError(f"rlflow.distributed.run does not take {', '.join(unsupported)}: run checkpoints are "
                         "written by rlflow.run only")
    return _Launch(make_env, make_policy, learner, adder, table, int(steps), int(batch_size), config, layout).run()


class _Launch:
    """One call of :func:`run`: checked parts, the Ray actors, and the driver's loop."""

    def __init__(self, make_env: Callable[[int], Any], make_policy: Callable[[int], Any], learner: Learner | None,
                 adder: Any, table: Any, steps: int, batch_size: int, config: RunConfig, layout: Layout) -> None:
        if steps < 1 or batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
        if table not in adder.tables:
            raise ValueError(f"table {getattr(table, 'name', table)!r} is not one of the adder's tables "
                             f"{[t.name for t in adder.tables]}")
        lanes, actors = adder.num_lanes, layout.num_actors
        if lanes % actors:
            raise ValueError(f"the adder's store has {lanes} lanes for {actors} actors: expected a store of "
                             f"num_actors x num_envs lanes (e.g. StepStore(spec, capacity, lanes={actors} * num_envs))")
        per_actor = lanes // actors
        self.actor_lanes = [list(range(i * per_actor, (i + 1) * per_actor)) for i in range(actors)]
        self.block_steps = _fit_block_steps(table if learner is not None else None, batch_size, layout.block_steps,
                                            per_actor * adder.max_items_per_step)
        check_unsampled(unsampled_tables(adder, table, learner), -(-steps // lanes) * lanes + lanes * self.block_steps,
                        adder.max_items_per_step, table if learner is not None else None)
        self.make_env, self.make_policy, self.learner, self.adder, self.table = (make_env, make_policy, learner,
                                                                                 adder, table)
        self.steps, self.batch_size, self.config, self.layout = steps, batch_size, config, layout
        self.result = RunResult()

    def run(self) -> RunResult:
        ray = _ray()
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.layout.address, include_dashboard=False, log_to_driver=True)
        server = source = None
        workers: list[Any] = []
        try:
            server = ray.remote(num_cpus=0)(ReplayServer).remote(
                pickle.dumps(self.adder), self.table.name, self.actor_lanes, self.steps, self.block_steps,
                self.layout.wait_timeout)
            source = ray.remote(num_cpus=0)(VariableSource).remote()
            if self.learner is not None:
                ray.get(source.publish.remote(0, [ray.put(self.learner.get_params())]))
            seed = self.config.seed
            remote_worker = ray.remote(num_cpus=self.layout.actor_cpus)(ActorWorker)
            workers = [remote_worker.remote(i, self.make_env, self.make_policy, server, source, self.adder.store.spec,
                                            lanes, block_steps=self.block_steps, sync_period=self.config.sync_period,
                                            max_in_flight=self.layout.max_in_flight,
                                            seed=None if seed is None else seed + 100_000 * i)
                       for i, lanes in enumerate(self.actor_lanes)]
            runs = [w.run.remote() for w in workers]
            self._drive(ray, server, source, runs)
            return self.result
        finally:
            for handle in (*workers, server, source):
                if handle is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(handle)
            if started:
                ray.shutdown()

    def _drive(self, ray: Any, server: Any, source: Any, runs: list[Any]) -> None:
        """Learn while the actors act, until the run's steps (or a stop); then stop the server and the actors."""
        from tqdm.auto import tqdm

        config, result, learner = self.config, self.result, self.learner
        logger = make_logger(config.logdir, tensorboard=config.tensorboard)
        bar = tqdm(total=self.steps, unit="step", disable=not config.progress, dynamic_ncols=True)
        samples: deque[Any] = deque()
        pending: dict[str, list[float]] = {}
        next_log, next_eval = config.log_every, config.eval_every or math.inf
        started, next_poll, version = time.monotonic(), 0.0, 0
        try:
            with StopRequest() as stop:
                while not stop.reason:
                    if config.max_seconds is not None and time.monotonic() - started > config.max_seconds:
                        result.stopped = "max_seconds"
                        break
                    if time.monotonic() >= next_poll:
                        self._take(ray.get(server.progress.remote(len(result.episodes))), logger, bar)
                        _raise_failed(ray, runs)
                        next_poll = time.monotonic() + _POLL
                        if result.env_steps >= self.steps:
                            break
                        if result.env_steps >= next_log and pending:
                            next_log += config.log_every
                            self._emit(logger, "learner", {k: sum(v) / len(v) for k, v in pending.items()})
                            pending = {}
                        if result.env_steps >= next_eval and config.eval_env is not None:
                            next_eval += config.eval_every
                            self._evaluate(ray, source, logger)
                    if learner is None:
                        time.sleep(_POLL / 4)
                        continue
                    while len(samples) < self.layout.prefetch:
                        samples.append(server.sample.remote(self.batch_size, _SAMPLE_WAIT))
                    sample = ray.get(samples.popleft())
                    if sample is None:
                        continue
                    sample = sample.copy()  # writable arrays of this process (Ray's are read-only views)
                    update = learner_step(learner, sample)
                    if update.priorities is not None:
                        server.update_priorities.remote(sample.keys, update.priorities)
                    result.learner_steps += 1
                    result.learner_metrics = update.metrics
                    for k, v in update.metrics.items():
                        pending.setdefault(k, []).append(v)
                    if result.learner_steps % self.layout.publish_every == 0:
                        version += 1
                        source.publish.remote(version, [ray.put(learner.get_params())])
                if stop.reason:
                    result.stopped = stop.reason
            ray.get(server.stop.remote())
            ray.get(runs, timeout=self.layout.wait_timeout)
            self._take(ray.get(server.progress.remote(len(result.episodes))), logger, bar)
            if pending:
                self._emit(logger, "learner", {k: sum(v) / len(v) for k, v in pending.items()})
            if config.eval_env is not None and not result.stopped:
                self._evaluate(ray, source, logger)
        finally:
            bar.close()
            logger.close()

    def _take(self, progress: Progress, logger: Any, bar: Any) -> None:
        """Count the server's new env steps and log each new episode (tagged with its actor)."""
        result = self.result
        for actor, env_step, ret, length in progress.episodes:
            result.episodes.append((env_step, ret, length))
            logger.write("train", env_step, {"return": ret, "length": length, "actor": actor})
            for fn in self.config.observers:
                fn("train", env_step, {"return": ret, "length": length, "actor": actor})
        if self.config.progress:
            bar.update(max(0, min(progress.env_steps, self.steps) - min(result.env_steps, self.steps)))
        result.env_steps = progress.env_steps

    def _emit(self, logger: Any, stream: str, metrics: Mapping[str, float]) -> None:
        logger.write(stream, self.result.env_steps, metrics)
        for fn in self.config.observers:
            fn(stream, self.result.env_steps, metrics)

    def _evaluate(self, ray: Any, source: Any, logger: Any) -> None:
        """Evaluation episodes in this process, with the policy of actor 0 given the latest parameters."""
        policy = self.make_policy(0)
        answer = ray.get(source.newer.remote(-1))
        if answer is not None:
            policy.set_params(ray.get(answer[1][0]))
        began = time.monotonic()
        returns = evaluate_policy(self.config.eval_env, policy, self.config.eval_episodes,
                                  seed=self.config.seed)
        self.result.eval_seconds += time.monotonic() - began
        mean = float(sum(returns) / len(returns))
        self.result.evaluations.append((self.result.env_steps, mean))
        self._emit(logger, "eval", {"return": mean})


def _fit_block_steps(table: Any, batch_size: int, block_steps: int, items_per_step: int) -> int:
    """The most steps (up to ``block_steps``) a block may hold so that the learner's table admits a block's
    items beside a sample (``rlflow.run_checks.check_limiter``); raises its error when one step is too many."""
    if table is None:
        return block_steps
    for steps in range(block_steps, 0, -1):
        try:
            check_limiter(table, batch_size, steps * items_per_step)
        except ValueError:
            if steps == 1:
                raise
            continue
        return steps
    return 1


def _raise_failed(ray: Any, runs: list[Any]) -> None:
    """Raise the error of an actor whose run ended with one."""
    done, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
    if done:
        ray.get(done)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("rlflow.distributed needs Ray: pip install \"rlflow[ray]\"") from None
    return ray
