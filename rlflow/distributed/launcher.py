"""``rlflow.distributed.run``: the one-process run's parts, laid out as actors, a replay server and a learner.

The call mirrors :func:`rlflow.run`: the same Learner, adder and table objects (the adder with its store
and tables is moved into the replay server), plus factories for what each actor builds in its own
process (its env and its policy). See ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pickle
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlflow.adders.base import Adder
from rlflow.adders.sequence import EndBehavior
from rlflow.core import Learner, Policy
from rlflow.distributed.actor import ActorWorker
from rlflow.distributed.evaluator import Evaluator
from rlflow.distributed.learning import LearnerReport, LearnerWorker
from rlflow.distributed.local_ray import connect, import_ray
from rlflow.distributed.retry import until_answered
from rlflow.distributed.server import Progress, ReplayServer
from rlflow.distributed.variables import VariableSource
from rlflow.environment import Environment
from rlflow.loggers import evaluation_line, make_logger, progress_bar
from rlflow.loop import RunConfig, RunResult, StopRequest
from rlflow.loop import checkpoint as run_checkpoint
from rlflow.loop.checks import check_limiter, check_unsampled, unsampled_tables
from rlflow.replay.table import TableBase

__all__ = ["Layout", "run"]

_POLL = 0.2  # seconds between the driver's looks at the server's progress


@dataclass(frozen=True)
class Layout:
    """Where the parts of a distributed run go and how they talk; every field is also a keyword of :func:`run`.

    Attributes:
        num_actors: actor processes; the adder's store has the same number of lanes for each.
        address: None starts a local Ray instance that listens on 127.0.0.1 only (:func:`init_local`) and
            shuts it down at the end; ``"auto"`` or ``"HOST:PORT"`` joins a running cluster (so does None
            with ``RAY_ADDRESS`` set). A Ray this process already started is used as it is, whatever this is.
        block_steps: env steps an actor puts in a block before it ships it; fewer where the learner's
            rate limiter could not admit a block's items at once.
        max_in_flight: blocks an actor has shipped and not had answered, at most (then it waits).
        prefetch: samples one request of the learner brings at most (it keeps one request in flight).
        publish_every: learner steps between publications of its parameters (None: 10, or 1 with
            ``on_policy``, which needs 1).
        actor_cpus: CPUs Ray reserves for each actor (the replay server and variable source reserve none).
        wait_timeout: seconds a block or sample waits for the rate limiter at the server before it gives up
            (and that the actors and the driver wait for a restarting server, and the driver for every actor
            to be built before they all start acting).
        max_restarts: how many times Ray restarts a dead actor process or replay server (a restarted server
            comes back from its latest checkpoint).
        checkpoint_seconds: the replay server also checkpoints when this many seconds passed since its last
            checkpoint (None: only every ``checkpoint_every`` env steps).
        learner_options: None trains the learner in this process; a mapping trains it in a Ray actor of its
            own, made with these Ray actor options (e.g. ``{"num_gpus": 1}``, or ``{"num_cpus": 1,
            "resources": {"learner_node": 1}}``); the trained state comes back to the learner object at the end.
        actor_options: more Ray actor options for every actor process (e.g. ``{"resources": {...}}`` or a
            ``scheduling_strategy``), beside ``actor_cpus`` and ``max_restarts``.
        on_policy: the actors act in lockstep with the learner (synchronous rollouts, as PPO's): each actor's
            block is as long as it takes every one of its lanes to write its next item, and after each block
            the actor waits for the learner's next parameters. Needs a Sequence adder, envs of
            ``autoreset_mode="next_step"`` and a learner that samples every lane's items at once
            (``batch_size`` = the store's lanes); ``block_steps`` and ``sync_period`` are not used.
    """

    num_actors: int = 2
    address: str | None = None
    block_steps: int = 32
    max_in_flight: int = 2
    prefetch: int = 4
    publish_every: int | None = None
    actor_cpus: float = 1.0
    wait_timeout: float = 60.0
    max_restarts: int = 3
    checkpoint_seconds: float | None = None
    learner_options: Mapping[str, Any] | None = None
    actor_options: Mapping[str, Any] | None = None
    on_policy: bool = False

    def learner_publish_every(self) -> int:
        """Learner steps between publications: ``publish_every``, or its default (10; 1 with ``on_policy``)."""
        return self.publish_every if self.publish_every is not None else 1 if self.on_policy else 10

    def __post_init__(self) -> None:
        if self.on_policy and self.publish_every not in (None, 1):
            raise ValueError("publish_every: on_policy actors wait for each learner update, so the learner publishes "
                             f"after every step: expected publish_every=1 (or None), got {self.publish_every!r}")
        for name in ("learner_options", "actor_options"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"{name}: expected a mapping of Ray actor options (e.g. {{'num_gpus': 1}}) or None, "
                                f"got {type(value).__name__}")
        for name in ("num_actors", "block_steps", "max_in_flight", "prefetch", "publish_every"):
            value = getattr(self, name)
            if value is None and name == "publish_every":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts: expected an integer >= 0, got {self.max_restarts!r}")
        if self.checkpoint_seconds is not None and not self.checkpoint_seconds > 0:
            raise ValueError(f"checkpoint_seconds: expected seconds > 0 or None, got {self.checkpoint_seconds!r}")
        if not self.actor_cpus >= 0 or not self.wait_timeout > 0:
            raise ValueError(f"actor_cpus >= 0 and wait_timeout > 0 expected, got {self.actor_cpus!r} and "
                             f"{self.wait_timeout!r}")


def run(make_env: Callable[[int], Environment], make_policy: Callable[[int], Policy], learner: Learner | None,
        adder: Adder, table: TableBase, *, steps: int, batch_size: int = 32, config: RunConfig | None = None,
        layout: Layout | None = None, **options: Any) -> RunResult:
    """Train for ``steps`` env steps (over every actor's lanes) with ``layout.num_actors`` actor processes.

    Args:
        make_env: ``make_env(actor)`` builds actor ``actor``'s env (an rlflow env), in the actor's process.
        make_policy: ``make_policy(actor)`` builds its policy there (e.g. a per-actor exploration rate).
        learner: trains in this process (None: only collect).
        adder: the adder (its store has ``num_actors`` x ``num_envs`` lanes); it moves into the replay server.
        table: the table the learner samples; it moves into the replay server.
        steps: as :func:`rlflow.run`.
        batch_size: as :func:`rlflow.run`.
        config: what the run does around its parts (:class:`~rlflow.RunConfig`, except its checkpoint fields and
            ``bursts``).
        layout: where the parts go (:class:`Layout`).
        **options: fields of ``config`` or ``layout`` as keywords; each replaces theirs.
    """
    names = {f.name for f in dataclasses.fields(Layout)}
    config = (config if config is not None else RunConfig()).with_options(
        {k: v for k, v in options.items() if k not in names})
    layout = dataclasses.replace(layout if layout is not None else Layout(),
                                 **{k: v for k, v in options.items() if k in names})
    config.checkpoint_path()  # raises when checkpoints are asked for with nowhere to write them
    return _Launch(make_env, make_policy, learner, adder, table, int(steps), int(batch_size), config, layout).run()


class _Launch:
    """One call of :func:`run`: checked parts, the Ray actors, and the driver's loop."""

    def __init__(self, make_env: Callable[[int], Environment], make_policy: Callable[[int], Policy],
                 learner: Learner | None, adder: Adder, table: TableBase, steps: int, batch_size: int,
                 config: RunConfig, layout: Layout) -> None:
        if steps < 1 or batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
        if config.bursts:
            raise ValueError("bursts: actor processes write while the learner trains, so there are no turns to "
                             "keep; bursts of learner steps need the one-process rlflow.run (or bursts=False)")
        if table not in adder.tables:
            raise ValueError(f"table {getattr(table, 'name', table)!r} is not one of the adder's tables "
                             f"{[t.name for t in adder.tables]}")
        lanes, actors = adder.num_lanes, layout.num_actors
        if lanes % actors:
            raise ValueError(f"the adder's store has {lanes} lanes for {actors} actors: expected a store of "
                             f"num_actors x num_envs lanes (e.g. StepStore(spec, capacity, lanes={actors} * num_envs))")
        per_actor = lanes // actors
        self.actor_lanes = [list(range(i * per_actor, (i + 1) * per_actor)) for i in range(actors)]
        if layout.on_policy:
            if learner is None:
                raise ValueError("on_policy: the actors wait for each learner update, so a run without a learner "
                                 "would never act past its first rollouts: pass a learner, or on_policy=False")
            self.block_steps = _lockstep_block_steps(adder, table, batch_size, per_actor)
        else:
            self.block_steps = _fit_block_steps(table if learner is not None else None, batch_size,
                                                layout.block_steps, per_actor * adder.max_items_per_step)
        check_unsampled(unsampled_tables(adder, table, learner), -(-steps // lanes) * lanes + lanes * self.block_steps,
                        adder.max_items_per_step, table if learner is not None else None)
        self.make_env, self.make_policy, self.learner, self.adder, self.table = (make_env, make_policy, learner,
                                                                                 adder, table)
        self.steps, self.batch_size, self.config, self.layout = steps, batch_size, config, layout
        self.result = RunResult()
        # Ray actor handles (and the learner's worker, in this process or its own Ray actor), made by run()
        self.server: Any = None
        self.source: Any = None
        self.evaluator: Any = None
        self.trainer: Any = None
        self.training: Any = None
        self.incarnation: int | None = None  # of the replay server, as last seen (another: it restarted)

    def run(self) -> RunResult:
        started = connect(self.layout.address)
        ray = self.ray = import_ray()
        self.server = self.source = self.evaluator = self.trainer = None
        self.workers: list[Any] = []
        try:
            self._start()
            self._drive()
            return self.result
        finally:
            remote_learner = None if isinstance(self.trainer, LearnerWorker) else self.trainer
            for handle in (*self.workers, self.server, self.source, self.evaluator, remote_learner):
                if handle is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(handle, no_restart=True)
            if started:
                ray.shutdown()

    def _start(self) -> None:
        """The replay server (from its checkpoint with ``resume``), the variable source, the learner and the
        actors."""
        ray, config, layout = self.ray, self.config, self.layout
        checkpoint_dir = config.checkpoint_path()
        self.learner_state = None if checkpoint_dir is None else checkpoint_dir / "learner.pt"
        learner_steps = 0
        if config.resume and self.learner is not None and self.learner_state is not None \
                and self.learner_state.exists():
            saved = run_checkpoint.load_state(self.learner_state)
            self.learner.load_state_dict(saved["learner"])
            learner_steps = self.result.learner_steps = int(saved["learner_steps"])
        name = f"rlflow-replay-server-{os.getpid()}-{time.time_ns()}"  # ray.get_actor(name) finds it
        # The adder's pickle, held here for the run: a server Ray restarts is built from it again.
        self.adder_ref = ray.put(pickle.dumps(self.adder))
        # The replay server, the variable source and the evaluator live on this node, beside the learner.
        here = _this_node()
        self.server = ray.remote(num_cpus=0, max_restarts=layout.max_restarts, name=name,
                                 scheduling_strategy=here)(_RemoteServer).remote(
            self.adder_ref, self.table.name, self.actor_lanes, self.steps, self.block_steps,
            layout.wait_timeout, None if checkpoint_dir is None else str(checkpoint_dir / "server"),
            config.checkpoint_every, layout.checkpoint_seconds, resume=config.resume, on_policy=layout.on_policy)
        ray.get(self.server.ping.remote())  # raises now what its building raised (e.g. a checkpoint that differs)
        restored = self._server_call("progress").restored_from
        self.resumed_at = restored if config.resume else None  # a resumed run's env step (its logs go on there)
        self.source = ray.remote(num_cpus=0, scheduling_strategy=here)(VariableSource).remote()
        self.trainer = self.training = None
        if self.learner is not None:
            settings: dict[str, Any] = dict(batch_size=self.batch_size, prefetch=layout.prefetch,
                            publish_every=layout.learner_publish_every(), wait_timeout=layout.wait_timeout,
                            learner_steps=learner_steps)
            if layout.learner_options is None:
                self.trainer = LearnerWorker(self.learner, self.server, self.source, **settings)
                self.trainer.publish(wait=True)
            else:
                self.trainer = ray.remote(LearnerWorker).options(max_restarts=0, **layout.learner_options).remote(
                    _pickled(self.learner, "learner"), self.server, self.source, **settings)
                ray.get(self.trainer.publish.remote(wait=True))  # raises now what its building raised
        seed = config.seed
        remote_worker = ray.remote(num_cpus=layout.actor_cpus, max_restarts=layout.max_restarts)(ActorWorker)
        if layout.actor_options:
            remote_worker = remote_worker.options(**layout.actor_options)
        self.workers = [remote_worker.remote(i, self.make_env, self.make_policy, self.server, self.source,
                                             self.adder.store.spec, lanes, block_steps=self.block_steps,
                                             sync_period=config.sync_period, max_in_flight=layout.max_in_flight,
                                             seed=None if seed is None else seed + 100_000 * i,
                                             wait_timeout=layout.wait_timeout, on_policy=layout.on_policy)
                        for i, lanes in enumerate(self.actor_lanes)]
        self._until_built(self.workers)
        self.runs = [w.run.remote() for w in self.workers]
        self.restarts = [0] * len(self.workers)
        self.evaluations: list[Any] = []  # evaluations asked for, not yet logged
        self.evaluator = None if config.eval_env is None else ray.remote(
            num_cpus=0, scheduling_strategy=here)(Evaluator).remote(
            _pickled(config.eval_env, "eval_env"), self.make_policy, self.source, config.eval_episodes, config.seed)

    def _drive(self) -> None:
        """Learn while the actors act, until the run's steps (or a stop); then stop the server and the actors."""
        config, result = self.config, self.result
        self.logger = make_logger(config.logdir, tensorboard=config.tensorboard, resume_at=self.resumed_at)
        self.bar = progress_bar(self.steps, enabled=config.progress)
        self.pending: dict[str, list[float]] = {}  # learner metrics since the last log: name -> [sum, count]
        self.checkpoints = (self.incarnation, 0)  # the server's checkpoints seen (its incarnation, count)
        next_log, next_eval = config.log_every, config.eval_every or math.inf
        started = time.monotonic()
        try:
            with StopRequest() as stop:
                while not stop.reason:
                    if config.max_seconds is not None and time.monotonic() - started > config.max_seconds:
                        result.stopped = "max_seconds"
                        break
                    next_poll = time.monotonic() + _POLL
                    self._take(self._server_call("progress"))
                    self._watch_actors()
                    self._evaluated(wait=False)
                    if result.env_steps >= self.steps:
                        break
                    if result.env_steps >= next_log and self.pending:
                        next_log += config.log_every
                        self._emit_learner()
                    if result.env_steps >= next_eval and config.eval_env is not None:
                        next_eval += config.eval_every
                        self._evaluate()
                    self._learn(until=next_poll)
                if stop.reason:
                    result.stopped = stop.reason
            self._finish()
        finally:
            self.bar.close()
            self.logger.close()

    def _learn(self, *, until: float) -> None:
        """Learner steps until ``until`` (``time.monotonic()``), in this process or by the learner's Ray actor
        (one ``train`` call kept in flight); only a wait without a learner."""
        ray = self.ray
        remaining = max(0.0, until - time.monotonic())
        if self.trainer is None:
            time.sleep(remaining)
        elif isinstance(self.trainer, LearnerWorker):
            self._learned(self.trainer.train(remaining))
        else:
            if self.training is None:
                self.training = self.trainer.train.remote(_POLL)
            ready, _ = ray.wait([self.training], timeout=remaining)
            if ready:
                report, self.training = ray.get(self.training), None
                self._learned(report)

    def _learned(self, report: LearnerReport) -> None:
        result = self.result
        result.learner_steps = report.learner_steps
        if report.last:
            result.learner_metrics = report.last
        for k, (total, count) in report.sums.items():
            mine = self.pending.setdefault(k, [0.0, 0])
            mine[0] += total
            mine[1] += count

    def _emit_learner(self) -> None:
        self._emit("learner", {k: total / count for k, (total, count) in self.pending.items()})
        self.pending = {}

    def _learner_state(self) -> dict[str, Any]:
        """The learner's state and step count (from its Ray actor, once its ``train`` call in flight ended)."""
        if isinstance(self.trainer, LearnerWorker):
            return self.trainer.state()
        if self.training is not None:
            self._learned(self.ray.get(self.training))
            self.training = None
        return self.ray.get(self.trainer.state.remote())

    def _save_learner(self) -> dict[str, Any] | None:
        """Write the learner's state to ``learner.pt`` (if the run checkpoints and has a learner); that state."""
        if self.trainer is None or self.learner_state is None:
            return None
        state = self._learner_state()
        run_checkpoint.save_state(self.learner_state, state)
        return state

    def _finish(self) -> None:
        """Stop the server and the actors, write the last checkpoints, log what is left and evaluate. A learner
        that trained in its own Ray actor hands its state back to the user's learner object."""
        ray, result, config = self.ray, self.result, self.config
        self._server_call("stop")
        ray.get(self.source.close.remote())  # (on_policy actors waiting for parameters stop)
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get(self.runs, timeout=self.layout.wait_timeout)  # (actors still running then are ended below)
        self._take(self._server_call("progress"))
        if self.learner_state is not None:
            self._server_call("checkpoint")
        state = self._save_learner()
        if self.learner is not None and self.trainer is not None and not isinstance(self.trainer, LearnerWorker):
            state = state if state is not None else self._learner_state()
            self.learner.load_state_dict(state["learner"])
        if self.pending:
            self._emit_learner()
        if config.eval_env is not None and not result.stopped:
            self._evaluate()
        if config.eval_env is not None:
            self._evaluated(wait=True)

    def _server_call(self, method: str, *args: Any) -> Any:
        """``server.method(*args)``, again while the server restarts (up to ``wait_timeout`` seconds)."""
        return until_answered(lambda: getattr(self.server, method).remote(*args), timeout=self.layout.wait_timeout,
                              errors=(self.ray.exceptions.RayActorError,))

    def _watch_actors(self) -> None:
        """Raise the error of an actor whose run or building (``make_env``, ``make_policy``, its checks) failed in
        its code; run again an actor Ray restarted after its process died (while it has restarts left), saying
        so."""
        ray = self.ray
        done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for ref in done:
            i = self.runs.index(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if exc.actor_init_failed or self.restarts[i] >= self.layout.max_restarts:
                    raise
                self.restarts[i] += 1
                warnings.warn(f"actor {i}'s process died; Ray restarted it ({self.restarts[i]} of max_restarts="
                              f"{self.layout.max_restarts}): its steps not yet shipped are lost, its episodes in "
                              "progress end where the server has them", RuntimeWarning, stacklevel=2)
                self._emit("faults", {"actor": i, "restarts": self.restarts[i]})
                self._until_up(self.workers[i])
                self.runs[i] = self.workers[i].run.remote()

    def _until_built(self, workers: list[Any]) -> None:
        """Wait (up to ``wait_timeout`` seconds) until every actor has built its env and policy, so that all
        start acting together: an actor whose process starts late does not find the run's steps taken by the
        others. Raises what building an actor raised, or a ``TimeoutError`` naming the actors not built."""
        ray = self.ray
        refs = [w.__ray_ready__.remote() for w in workers]
        ready, waiting = ray.wait(refs, num_returns=len(refs), timeout=self.layout.wait_timeout)
        ray.get(ready)  # an actor whose make_env, make_policy or checks raised: that error
        if waiting:
            late = [refs.index(r) for r in waiting]
            raise TimeoutError(f"actors {late} were not built within wait_timeout={self.layout.wait_timeout} s: "
                               "the cluster may lack the CPUs they ask for (Layout.actor_cpus), or make_env or "
                               "make_policy does not return")

    def _until_up(self, handle: Any) -> None:
        """Wait (up to ``wait_timeout`` seconds) for a restarting Ray actor to be up again."""
        until_answered(handle.__ray_ready__.remote, timeout=self.layout.wait_timeout,
                       errors=(self.ray.exceptions.ActorUnavailableError,))

    def _take(self, progress: Progress) -> None:
        """Count the server's env steps and log each episode it took since the last look (tagged with its
        actor); say so when the server came back from a checkpoint."""
        result = self.result
        seen, self.incarnation = self.incarnation, progress.incarnation
        if seen is not None and seen != progress.incarnation:
            warnings.warn(f"the replay server restarted from its checkpoint at env step {progress.restored_from}: "
                          f"what it took after that checkpoint is lost (it had taken {result.env_steps} env steps)",
                          RuntimeWarning, stacklevel=2)
            self._emit("faults", {"server_restored_from": -1 if progress.restored_from is None else
                                  progress.restored_from})
        for actor, env_step, ret, length in progress.episodes:
            result.episodes.append((env_step, ret, length))
            self._emit("train", {"return": ret, "length": length, "actor": actor}, env_step)
        written = (progress.incarnation, progress.checkpoints)
        if progress.checkpoints and written != self.checkpoints:  # the server wrote a checkpoint: the learner's too
            self._save_learner()
        self.checkpoints = written
        if self.config.progress:
            self.bar.update(max(0, min(progress.env_steps, self.steps) - min(result.env_steps, self.steps)))
        result.env_steps = progress.env_steps

    def _emit(self, stream: str, metrics: Mapping[str, float], env_steps: int | None = None) -> None:
        """Log ``metrics`` to ``stream`` and the observers, at ``env_steps`` (default: the run's env steps now)."""
        step = self.result.env_steps if env_steps is None else env_steps
        self.logger.write(stream, step, metrics)
        for fn in self.config.observers:
            fn(stream, step, metrics)

    def _evaluate(self) -> None:
        """Ask the evaluator for episodes with the latest parameters, at the current env step (the answer is
        logged when it comes: :meth:`_evaluated`)."""
        self.evaluations.append(self.evaluator.evaluate.remote(self.result.env_steps))

    def _evaluated(self, *, wait: bool) -> None:
        """Log the evaluations that have come (all of them with ``wait``), each at the env step it was asked at."""
        ray, result = self.ray, self.result
        while self.evaluations:
            ready, _ = ray.wait(self.evaluations[:1], timeout=None if wait else 0)
            if not ready:
                return
            done = ray.get(self.evaluations.pop(0))
            result.eval_seconds += done.seconds
            result.evaluations.append((done.env_steps, done.mean, done.std))
            self._emit("eval", {"return": done.mean, "return_std": done.std}, done.env_steps)
            self.bar.write(evaluation_line(done.env_steps, done.mean, done.std, self.config.eval_episodes))


def _fit_block_steps(table: Any, batch_size: int, block_steps: int, items_per_step: int) -> int:
    """The most steps (up to ``block_steps``) a block may hold so that the learner's table admits a block's
    items beside a sample (``rlflow.loop.checks.check_limiter``); raises its error when one step is too many."""
    if table is None:
        return block_steps
    for steps in range(block_steps, 1, -1):
        try:
            check_limiter(table, batch_size, steps * items_per_step)
            return steps
        except ValueError:
            continue
    check_limiter(table, batch_size, items_per_step)  # raises, naming the fix, when one step is too many
    return 1


def _lockstep_block_steps(adder: Any, table: Any, batch_size: int, lanes: int) -> int:
    """``on_policy``: the most steps an actor's block may need (``Sequence.rows_until_written`` is at most
    ``length + period + 1``); raises naming the fix where the adder cannot size blocks, the learner's batch
    is not every lane's items, or the learner's table cannot admit a block beside a batch."""
    if getattr(adder, "end_behavior", None) is not EndBehavior.CONTINUE:
        raise ValueError("on_policy: actors ship blocks that complete one item on each lane, which needs a Sequence "
                         "adder with end_behavior='continue' (it says when each lane's next item is written, and "
                         f"its lanes' items stay in step across episode ends); got {_adder_name(adder)}")
    if adder.period < 2:
        raise ValueError(f"on_policy: rollouts of one step (period={adder.period}) can complete two items on a lane "
                         "in one step, out of step with its other lanes: expected a Sequence of period >= 2")
    if batch_size != adder.num_lanes:
        raise ValueError(f"on_policy: the learner waits for every actor's rollout, one item per store lane: expected "
                         f"batch_size={adder.num_lanes} (the store's lanes), got {batch_size}")
    steps = adder.length + adder.period + 1
    check_limiter(table, batch_size, steps * lanes * adder.max_items_per_step)
    return steps


def _adder_name(adder: Any) -> str:
    behavior = getattr(adder, "end_behavior", None)
    return type(adder).__name__ + ("" if behavior is None else f" with end_behavior={behavior.value!r}")


class _RemoteServer(ReplayServer):
    """The replay server as a Ray actor: a process Ray restarted comes back from its latest checkpoint."""

    def __init__(self, *settings: Any, resume: bool, on_policy: bool) -> None:
        import ray

        with warnings.catch_warnings():  # (Ray's own deprecation warning from inside the call)
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        super().__init__(*settings, restore=resume or restarted, on_policy=on_policy)


def _pickled(value: Any, name: str) -> bytes:
    """``value`` pickled (with Ray's cloudpickle), for a process that needs its own writable copy; a TypeError
    names ``name`` when it cannot be."""
    from ray import cloudpickle

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:
        raise TypeError(f"{name}: rlflow.distributed.run moves it into another process, and it cannot be pickled "
                        f"({type(exc).__name__}: {exc})") from None


def _this_node() -> Any:
    """The driver's Ray node, as a scheduling strategy (a hard one: Ray places actors that reserve no resources
    anywhere under a soft one, and without the driver's node the run is over anyway)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
