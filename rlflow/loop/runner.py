"""The event loop: environment -> actor -> adder -> table -> learner, in the ratio the table allows.

One process, one thread. Each turn of the loop either trains or acts:

- if the table's rate limiter admits a sample of ``batch_size``, the learner takes one step on it (its
  new priorities, if any, go back to the table);
- otherwise every lane takes one env step: ``actor.select_action`` -> ``env.step`` -> the adder writes
  the step (``adder.add`` with a learner; ``adder.stage`` without one, written in blocks) ->
  ``EpisodeStats.update`` counts it. Every step takes this one path.

So the learner gets exactly the samples the limiter grants per insert: ``SampleToInsertRatio(spi, ...)``
makes one learner step per ``batch_size / spi`` inserted items, in both directions (neither side runs
ahead of the window), spread evenly over the env steps. With ``bursts`` a side keeps the turn until the
limiter refuses it: the lanes step until the table refuses an env step's items, then the learner trains
until it refuses a sample, so the limiter's window sets the bursts (SB3's ``train_freq`` and
``gradient_steps``: a window of about ``train_freq * spi`` samples gives bursts of ``train_freq * spi /
batch_size`` learner steps every ``train_freq`` inserted items; ``docs/loop.md`` has the exact bounds).

A limiter that never refuses samples (``MinSize``) would starve the actor, so :func:`run` refuses it; it
also refuses a window too narrow to take one env step's items after a learner step (which would
deadlock), and a table nothing samples whose limiter would refuse some of the run's items (its inserts
would wait for ever): :mod:`rlflow.loop.checks`. The loop itself never waits
inside a table; a wait for room that another writer took is made in slices that a stop request ends.

Around that (:class:`RunConfig`): the policy gets the learner's parameters every ``sync_period`` env steps
(:class:`VariableClient`), evaluation episodes run on a separate env every ``eval_every`` env steps
with ``evaluation=True``, metrics go to CSV and TensorBoard (:mod:`rlflow.loggers`), checkpoints are
written every ``checkpoint_every`` env steps (:mod:`rlflow.loop.checkpoint`), a progress bar shows the
run, and Ctrl-C or SIGTERM stops it cleanly after the current step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlflow.core import Learner, Policy, learner_step
from rlflow.loggers import MultiLogger, evaluation_line, make_logger, progress_bar
from rlflow.loop.actors import Actor, EpisodeStats, VariableClient
from rlflow.loop.actors import evaluate as evaluate_policy
from rlflow.loop.checks import check_bursts, check_limiter, check_parts, check_unsampled, unsampled_tables

if TYPE_CHECKING:
    from rlflow.adders.base import Adder
    from rlflow.environment import Environment
    from rlflow.replay.table import TableBase

__all__ = ["RunConfig", "RunResult", "run"]

# Seconds between the checks of a wait for room in a table (a stop request ends the wait within one).
_WAIT_SLICE = 0.01

Observer = Callable[[str, int, Mapping[str, float]], None]


@dataclass(frozen=True)
class RunConfig:
    """What :func:`run` does around its parts besides ``steps`` and ``batch_size``; every field is also a
    keyword of :func:`run` (``run(..., eval_every=5_000)`` is ``run(..., config=RunConfig(eval_every=5_000))``).

    Attributes:
        sync_period: env steps between parameter pulls (:class:`~rlflow.loop.actors.VariableClient`).
        eval_env, eval_every, eval_episodes: evaluate on ``eval_env`` every ``eval_every`` env steps and at
            the end (``eval_every=0``: only at the end; no ``eval_env``: never), ``eval_episodes`` episodes.
        logdir: write ``train.csv``, ``learner.csv``, ``eval.csv`` (and TensorBoard events) there.
        tensorboard: also write TensorBoard events under ``logdir``.
        log_every: env steps between rows of averaged learner metrics.
        progress: show a progress bar (tqdm).
        seed: seeds the env's first reset (and the evaluation env's resets).
        max_seconds: stop after this wall-clock time (None: no limit).
        observers: called as ``fn(stream, env_step, metrics)`` for every row the loggers get.
        checkpoint_every: env steps between run checkpoints (0: none); a checkpoint is also written at the
            end and when the run is stopped. It holds the env's state (``env.state_dict()``) and the episodes
            in progress, so a resumed run goes on exactly; an env that cannot be saved ends its episodes as
            truncated at each checkpoint instead (a warning says so once). See :mod:`rlflow.loop.checkpoint`
            and ``docs/loop.md``.
        checkpoint_dir: where checkpoints go (default ``<logdir>/checkpoints``).
        resume: continue from the latest checkpoint in ``checkpoint_dir``, if there is one.
        bursts: acting and training each go on until the learner's table refuses them (an env step's
            items, a sample): learner steps in bursts that use up the limiter's window, as SB3's
            ``train_freq`` and ``gradient_steps`` (default: a learner step whenever a sample is admitted,
            the steps spread evenly). The learner's limiter must refuse inserts at some diff (a finite
            ``max_diff``).
    """

    sync_period: int = 1
    eval_env: Environment | None = None
    eval_every: int = 0
    eval_episodes: int = 10
    logdir: str | Path | None = None
    tensorboard: bool = True
    log_every: int = 1_000
    progress: bool = True
    seed: int | None = None
    max_seconds: float | None = None
    observers: Sequence[Observer] = ()
    checkpoint_every: int = 0
    checkpoint_dir: str | Path | None = None
    resume: bool = False
    bursts: bool = False

    def __post_init__(self) -> None:
        for name in ("eval_every", "log_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected env steps >= 0, got {getattr(self, name)!r}")
        if self.eval_episodes < 1:
            raise ValueError(f"eval_episodes: expected an integer >= 1, got {self.eval_episodes!r}")

    def with_options(self, options: Mapping[str, Any]) -> RunConfig:
        """This config with ``options`` (field names) replaced; a TypeError names unknown options and the
        valid ones."""
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise TypeError(f"rlflow.run got unknown option(s) {', '.join(unknown)}: expected steps, batch_size, "
                            f"config, or the fields of RunConfig: {', '.join(names)}")
        return dataclasses.replace(self, **options) if options else self

    def checkpoint_path(self) -> Path | None:
        """Where checkpoints are written and read: ``checkpoint_dir``, else ``<logdir>/checkpoints`` when the
        run writes or reads any (None when it does neither)."""
        if self.checkpoint_dir is not None:
            return Path(self.checkpoint_dir)
        if self.checkpoint_every == 0 and not self.resume:
            return None
        if self.logdir is None:
            raise ValueError("checkpoints need a checkpoint_dir or a logdir")
        return Path(self.logdir) / "checkpoints"


@dataclass
class RunResult:
    """What a run did: counts, every finished training episode, and every evaluation.

    Attributes:
        env_steps: env steps taken, over all lanes (a resumed run counts those before its checkpoint).
        learner_steps: learner steps taken.
        episodes: every finished training episode as ``(env step it ended at, return, length)``.
        evaluations: every evaluation as ``(env step, mean return, standard deviation of the returns)`` over
            its episodes.
        learner_metrics: the metrics the last learner step returned.
        stopped: why the run ended early (``"max_seconds"``, or the signal's name: ``"SIGINT"`` for Ctrl-C,
            ``"SIGTERM"``), or ``""`` when it ran all its steps.
        eval_seconds: wall-clock seconds spent in evaluation episodes.
        final_evaluation: the last evaluation's mean return (None if there was none).
    """

    env_steps: int = 0
    learner_steps: int = 0
    episodes: list[tuple[int, float, int]] = field(default_factory=list)  # (env step, return, length)
    evaluations: list[tuple[int, float, float]] = field(default_factory=list)  # (env step, mean, std of returns)
    learner_metrics: dict[str, float] = field(default_factory=dict)  # of the last learner step
    stopped: str = ""  # why the run ended early ("" if it ran to the end)
    eval_seconds: float = 0.0  # wall-clock spent in evaluation episodes

    @property
    def final_evaluation(self) -> float | None:
        """The last evaluation's mean return (None if there was none)."""
        return self.evaluations[-1][1] if self.evaluations else None


def run(env: Environment, policy: Policy, learner: Learner | None, adder: Adder, table: TableBase, *, steps: int,
        batch_size: int = 32, config: RunConfig | None = None, **options: Any) -> RunResult:
    """Train for ``steps`` env steps (counted over all lanes); see the module docstring.

    Args:
        env: an :class:`~rlflow.environment.Environment`: :class:`rlflow.envs.GymEnvironment`,
            :class:`rlflow.envs.ParallelEnvironment` or a class of one's own with its members (its lanes are the
            adder's store's lanes).
        policy: the user's :class:`~rlflow.core.Policy`.
        learner: the user's :class:`~rlflow.core.Learner` (``learner=None``: only collect).
        adder: the :class:`~rlflow.adders.Adder` writing ``env``'s steps.
        table: the table the learner samples from (a :class:`~rlflow.replay.Table` or
            :class:`~rlflow.replay.RowTable`, one of the adder's tables).
        steps: env steps to run to (a resumed run counts those before its checkpoint).
        batch_size: items per learner step.
        config: what the run does around its parts (a :class:`RunConfig`).
        **options: the config's fields as keywords (``sync_period``, ``eval_env``, ``eval_every``,
            ``eval_episodes``, ``logdir``, ``tensorboard``, ``log_every``, ``progress``, ``seed``,
            ``max_seconds``, ``observers``, ``checkpoint_every``, ``checkpoint_dir``, ``resume``), which replace
            the config's.
    """
    config = (config if config is not None else RunConfig()).with_options(options)
    return _Loop(env, policy, learner, adder, table, steps, batch_size, config).run()


class StopRequest:
    """Set by Ctrl-C or SIGTERM while the loop runs (the loop finishes its step, then returns)."""

    def __init__(self) -> None:
        self.reason = ""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.reason = signal.Signals(signum).name

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Loop:
    """One call of :func:`run`: its parts, its counters, and what a turn of the loop does.

    Built, it has checked its parts (:mod:`rlflow.loop.checks`) and, with ``resume``, loaded the latest
    checkpoint; :meth:`run` then alternates :meth:`learn_once` and :meth:`act_once` as the table allows,
    and logs, evaluates and checkpoints when their env steps come."""

    def __init__(self, env: Environment, policy: Policy, learner: Learner | None, adder: Adder, table: TableBase,
                 steps: int, batch_size: int, config: RunConfig) -> None:
        if int(steps) < 1 or int(batch_size) < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
        check_parts(env, policy, learner, adder, table, config.eval_env)
        if adder.store is not table.store:
            raise ValueError(f"the adder writes another store than table {table.name!r} samples from")
        if adder.num_lanes != env.num_envs:
            raise ValueError(f"the adder's store has {adder.num_lanes} lanes, the env {env.num_envs}: expected one "
                             f"lane per env (build the store with lanes=env.num_envs)")
        self.env, self.policy, self.learner, self.adder, self.table = env, policy, learner, adder, table
        self.steps, self.batch_size, self.config = int(steps), int(batch_size), config
        self.lanes = env.num_envs
        self.step_items = self.lanes * adder.max_items_per_step  # the most items one env step writes
        if learner is not None:
            check_limiter(table, self.batch_size, self.step_items, bursts=config.bursts)
        self.actor = Actor(policy, env.action_spec, self.lanes, env.single_action_space)
        self.client = VariableClient(learner, policy, config.sync_period) if learner is not None else None
        self.stats = EpisodeStats(self.lanes)
        # Without a learner nothing samples the table during the run: steps are staged and written in blocks
        # (the adder flushes before anything else it does, e.g. the checkpoints' truncate).
        self.write = adder.add if learner is not None else getattr(adder, "stage", adder.add)
        self.result = RunResult()
        self.counters = {"next_eval": config.eval_every or math.inf, "next_log": config.log_every,
                         "next_checkpoint": config.checkpoint_every or math.inf}
        self.checkpoint_dir = config.checkpoint_path()
        self.saved_at = -1  # env steps of the last checkpoint written or loaded
        self.unsaved = ""  # why the env's state cannot be saved (said once per run)
        self.timestep: Any = None  # what the actor acts on next (None: the envs restart)
        self.learning = False  # with bursts: the learner has the turn (until the table refuses a sample)
        # A resumed run's variable-client state, and whether the checkpoint held a policy state.
        self.client_state: tuple[Any, bool] = (None, False)
        self.resumed = config.resume and self._resume()
        # Tables nothing samples here must take every item the rest of the run may write, without a sample.
        left = -(-max(self.steps - self.result.env_steps, 0) // self.lanes) * self.lanes
        unsampled = unsampled_tables(adder, table, learner)
        check_unsampled(unsampled, left, adder.max_items_per_step, table if learner is not None else None)
        if learner is not None and config.bursts:
            check_bursts(table, self.step_items, left * adder.max_items_per_step)
        self.bounded = [t for t in unsampled if t.rate_limiter.max_diff < sys.float_info.max]  # they may refuse
        self.pending: dict[str, list[float]] = {}  # learner metrics since the last row
        self.stop = StopRequest()

    # ------------------------------------------------------------------ the loop
    def run(self) -> RunResult:
        """Learn and act until ``steps`` env steps, a stop request or ``max_seconds``; then checkpoint, flush
        the staged steps, log and evaluate a last time."""
        config, result = self.config, self.result
        self.logger: MultiLogger = make_logger(config.logdir, tensorboard=config.tensorboard,
                                               resume_at=result.env_steps if self.resumed else None)
        self.bar = progress_bar(self.steps, initial=min(result.env_steps, self.steps), enabled=config.progress)
        self.started = time.monotonic()
        try:
            with self.stop:
                self.start()
                next_event = self.next_event()
                while result.env_steps < self.steps and not self.stopping():
                    if self.learns_now():
                        self.learn_once()
                    elif self.room_for_a_step():
                        self.act_once()
                        if result.env_steps >= next_event:
                            self.on_schedule()
                            next_event = self.next_event()
                self.finish()
        finally:
            with contextlib.suppress(Exception):  # a failed run keeps the steps it staged (after a normal end: none)
                self.flush()
            self.bar.close()
            self.logger.close()
        return result

    def learns_now(self) -> bool:
        """Whether this turn is a learner step: the table admits a sample of ``batch_size`` and, with
        ``bursts``, the last turn was one too or the table refuses an env step's items."""
        table = self.table
        if self.learner is None or not table.can_sample(self.batch_size):
            self.learning = False
            return False
        if self.config.bursts:
            self.learning = self.learning or not table.can_insert(self.step_items)
            return self.learning
        return True

    def act_once(self) -> None:
        """One env step of every lane: the actor acts, the env steps, the adder writes it, the episodes count."""
        ts = self.timestep
        actions, extras = self.actor.select_action(ts.observation, first=ts.first)
        self.timestep = ts = self.env.step(actions)
        self.write(actions, ts, extras)
        result = self.result
        result.env_steps += self.lanes
        if self.config.progress:
            self.bar.update(self.lanes)
        for ret, length in self.stats.update(ts):
            result.episodes.append((result.env_steps, ret, length))
            self.emit("train", {"return": ret, "length": length})
        if self.client is not None:
            self.client.update(result.env_steps)

    def learn_once(self) -> None:
        """One learner step on a sample of ``batch_size``; its priorities go back to the table."""
        if self.learner is None:
            raise RuntimeError("learn_once: the run has no learner")
        sample = self.table.sample(self.batch_size)
        update = learner_step(self.learner, sample)
        if update.priorities is not None:
            self.table.update_priorities(sample.keys, update.priorities)
        self.result.learner_steps += 1
        self.result.learner_metrics = dict(update.metrics)
        for k, v in update.metrics.items():
            self.pending.setdefault(k, []).append(v)

    def on_schedule(self) -> None:
        """Write the learner-metrics row, evaluate and checkpoint when their env steps have come."""
        counters, env_steps = self.counters, self.result.env_steps
        if env_steps >= counters["next_log"]:
            counters["next_log"] += self.config.log_every
            self.log()
        if env_steps >= counters["next_eval"] and self.config.eval_env is not None:
            counters["next_eval"] += self.config.eval_every
            self.evaluate()
        if env_steps >= counters["next_checkpoint"]:
            counters["next_checkpoint"] += self.config.checkpoint_every
            if self.checkpoint() and env_steps < self.steps:
                self.restart_envs()

    def next_event(self) -> float:
        """The env step of the next log row, evaluation or checkpoint."""
        evaluates = self.counters["next_eval"] if self.config.eval_env is not None else math.inf
        return min(self.counters["next_log"], evaluates, self.counters["next_checkpoint"])

    # ------------------------------------------------------------------ start, stop, end
    def start(self) -> None:
        """Pull the learner's parameters (a fresh run at once; a resumed one keeps its pull schedule), and
        restart the envs unless the run resumes at a saved timestep."""
        if self.client is not None:
            state, policy_restored = self.client_state
            self.client.resume(state, self.result.env_steps, policy_restored=policy_restored)
        if self.timestep is None:
            self.restart_envs()

    def restart_envs(self) -> None:
        """Reset every env (seeded with ``seed + env steps``) and start the adder's and actor's episodes."""
        seed = self.config.seed
        self.timestep = self.env.reset(seed=None if seed is None else seed + self.result.env_steps)
        self.adder.add_first(self.timestep)
        self.actor.reset()

    def stopping(self) -> bool:
        """Whether a stop request came or ``max_seconds`` passed (``result.stopped`` then says which)."""
        max_seconds = self.config.max_seconds
        if self.stop.reason or (max_seconds is not None and time.monotonic() - self.started > max_seconds):
            self.result.stopped = self.stop.reason or "max_seconds"
        return bool(self.result.stopped)

    def room_for_a_step(self) -> bool:
        """Whether one env step's items may enter every table; raises when the learner's table admits
        neither them nor a sample. Tables nothing samples admit them unless another writer filled them:
        then it waits for a sampler in another thread, in slices of :data:`_WAIT_SLICE` seconds that a stop
        request or ``max_seconds`` ends (False)."""
        table = self.table
        if self.learner is not None and not table.can_insert(self.step_items):
            raise RuntimeError(f"table {table.name!r}: the rate limiter admits neither a sample of {self.batch_size} "
                               f"nor an env step's items ({table.rate_limiter!r}, size {table.size})")
        if not self.bounded or all(t.can_insert(self.step_items) for t in self.bounded):
            return True
        warnings.warn(f"rlflow.run: table(s) {[t.name for t in self.bounded]} admit fewer than an env step's "
                      f"{self.step_items} items without a sample (another writer filled them); waiting for a sampler "
                      "in another thread, until one makes room or the run is stopped", RuntimeWarning, stacklevel=4)
        while not all(t.can_insert(self.step_items) for t in self.bounded):
            if self.stopping():
                return False
            time.sleep(_WAIT_SLICE)
        return True

    def finish(self) -> None:
        """After the last step (or a stop): a checkpoint a later run resumes from, the staged steps written,
        the last learner-metrics row, and a last evaluation (unless stopped, or one ran at this step)."""
        result, config = self.result, self.config
        if config.checkpoint_every > 0 and self.saved_at != result.env_steps:
            self.checkpoint()
        self.flush()  # (after the checkpoint, which holds the staged steps as a run that goes on holds them)
        if self.pending:
            self.emit("learner", self.averaged_metrics())
        if config.eval_env is not None and not result.stopped and (
                not result.evaluations or result.evaluations[-1][0] != result.env_steps):
            self.evaluate()

    def flush(self) -> None:
        """Write the steps the adder holds staged (an adder without ``flush`` holds none)."""
        flush = getattr(self.adder, "flush", None)
        if flush is not None:
            flush()

    # ------------------------------------------------------------------ logs and evaluation
    def emit(self, stream: str, metrics: Mapping[str, float]) -> None:
        """One row of ``stream`` at the current env step, to the loggers and the observers."""
        self.logger.write(stream, self.result.env_steps, metrics)
        for fn in self.config.observers:
            fn(stream, self.result.env_steps, metrics)

    def averaged_metrics(self) -> dict[str, float]:
        """The mean of each learner metric since the last row (and start the next row)."""
        out = {k: float(np.mean(v)) for k, v in self.pending.items()}
        self.pending.clear()
        return out

    def log(self) -> None:
        """The learner-metrics row, and the recent training return on the progress bar."""
        if self.pending:
            self.emit("learner", self.averaged_metrics())
        recent = [r for _, r, _ in self.result.episodes[-20:]]
        if recent:
            self.bar.set_postfix(train_return=f"{np.mean(recent):.1f}", learner_steps=str(self.result.learner_steps),
                                 refresh=False)  # drawn at the bar's own interval

    def evaluate(self) -> None:
        """``eval_episodes`` episodes on ``eval_env`` with ``evaluation=True``; their mean return is logged."""
        config, result = self.config, self.result
        if config.eval_env is None:
            raise RuntimeError("evaluate: the run has no eval_env")
        began = time.monotonic()
        seed = None if config.seed is None else config.seed + 10_000 + len(result.evaluations)
        returns = evaluate_policy(config.eval_env, self.policy, config.eval_episodes, seed=seed)
        mean, std = float(np.mean(returns)), float(np.std(returns))
        result.evaluations.append((result.env_steps, mean, std))
        result.eval_seconds += time.monotonic() - began
        self.emit("eval", {"return": mean, "return_std": std})
        self.bar.write(evaluation_line(result.env_steps, mean, std, len(returns)))

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self) -> bool:
        """Write a run checkpoint at the timestep the loop acts on next; whether the envs must restart (their
        state could not be saved, so the episodes in progress were ended)."""
        from rlflow.loop import checkpoint as run_checkpoint

        env_saved: dict[str, Any] | str | None = _env_state(self.env)
        if isinstance(env_saved, str):
            # The env's state cannot be saved: end the episodes in progress (truncated: they bootstrap),
            # save, and restart the envs, as a resumed run will at this step.
            if not self.unsaved:
                self.unsaved = env_saved
                warnings.warn(f"run checkpoints: the env's state cannot be saved ({env_saved}); every checkpoint "
                              "ends the episodes in progress as truncated and restarts the envs with seed + env "
                              "steps (see docs/loop.md)", stacklevel=5)
            self.adder.truncate()
            self.stats.reset()
            env_saved = None
        result = self.result
        run_checkpoint.save_run(self._checkpoint_dir(), result.env_steps, self.table.store, self.table, {
            "env_steps": result.env_steps, "learner_steps": result.learner_steps,
            "episodes": result.episodes, "evaluations": result.evaluations, "learner_metrics": result.learner_metrics,
            "counters": {k: (None if v == math.inf else v) for k, v in self.counters.items()},
            "adder": self.adder.state_dict(),
            "learner": self.learner.state_dict() if self.learner is not None else {},
            "policy": self.policy.state_dict(),
            "env": env_saved, "timestep": None if env_saved is None else _timestep_state(self.timestep),
            "episode_stats": self.stats.state_dict(), "actor": self.actor.state_dict(),
            "variable_client": self.client.state_dict() if self.client is not None else None,
            "learning": self.learning})
        self.saved_at = result.env_steps
        return env_saved is None

    def _checkpoint_dir(self) -> Path:
        if self.checkpoint_dir is None:
            raise RuntimeError("the run has no checkpoint directory (give checkpoint_dir or logdir)")
        return self.checkpoint_dir

    def _resume(self) -> bool:
        """Load the latest checkpoint in ``checkpoint_dir`` (False if there is none): the env, store and table
        first (:func:`rlflow.loop.checkpoint.load_run` checks everything before they change), then the adder,
        learner, policy, actor, statistics, counters and the timestep to act on next."""
        from rlflow.loop import checkpoint as run_checkpoint
        from rlflow.types import TimeStep

        path = run_checkpoint.latest(self._checkpoint_dir())
        if path is None:
            return False

        def restore_env(s: dict[str, Any]) -> None:
            if s["env"] is None:
                return
            load = getattr(self.env, "load_state_dict", None)
            if load is None:
                raise TypeError(f"the checkpoint holds the env's state, but {type(self.env).__name__} has no "
                                "load_state_dict() to restore it")
            load(s["env"])

        def check(s: dict[str, Any], where: str) -> None:
            run_checkpoint.check_run_state(s, where, self.lanes)
            self.actor.check_state(s["actor"])

        state = run_checkpoint.load_run(path, self.table.store, self.table, self.adder, before_replay=restore_env,
                                        check=check)
        self.adder.load_state_dict(state["adder"])
        if self.learner is not None:
            self.learner.load_state_dict(state["learner"])
        self.policy.load_state_dict(state["policy"])
        result = self.result
        result.env_steps, result.learner_steps = int(state["env_steps"]), int(state["learner_steps"])
        result.episodes = [tuple(e) for e in state["episodes"]]
        result.evaluations = [tuple(e) for e in state["evaluations"]]
        result.learner_metrics = dict(state["learner_metrics"])
        self.counters.update({k: (math.inf if v is None else v) for k, v in state["counters"].items()})
        self.learning = bool(state.get("learning", False))  # a run stopped in a burst goes on with it
        self.stats.load_state_dict(state["episode_stats"])
        self.actor.load_state_dict(state["actor"])
        if state["env"] is not None:
            self.timestep = TimeStep(**state["timestep"], info={})
        self.client_state = (state.get("variable_client"), bool(state["policy"]))
        self.saved_at = result.env_steps
        return True


def _env_state(env: Any) -> dict[str, Any] | str:
    """``env.state_dict()``, or why the env's state cannot be saved."""
    from rlflow.envs.state import EnvStateError

    state_dict = getattr(env, "state_dict", None)
    if state_dict is None:
        return f"{type(env).__name__} has no state_dict()"
    try:
        return state_dict()
    except EnvStateError as exc:
        return str(exc)


def _timestep_state(ts: Any) -> dict[str, Any]:
    """The timestep the loop acts on next, without its ``info`` (which may hold any object)."""
    return {f.name: getattr(ts, f.name) for f in dataclasses.fields(ts) if f.name != "info"}
