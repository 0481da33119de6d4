"""The event loop: environment -> actor -> adder -> table -> learner, in the ratio the table allows.

One process, one thread. Each turn of the loop either trains or acts:

- if the table's rate limiter admits a sample of ``batch_size``, the learner takes one step on it (its
  new priorities, if any, go back to the table);
- otherwise the actor acts on every lane, the env steps, and the adder writes what happened.

So the learner gets exactly the samples the limiter grants per insert: ``SampleToInsertRatio(spi, ...)``
makes one learner step per ``batch_size / spi`` inserted items, in both directions (neither side runs
ahead of the window). A limiter that never refuses samples (``MinSize``) would starve the actor, so
:func:`run` refuses it; it also refuses a window too narrow to take one env step's items after a
learner step (which would deadlock), and a table nothing samples whose limiter would refuse some of the
run's items (its inserts would wait for ever): :mod:`rlflow.run_checks`. The loop itself never waits
inside a table; a wait for room that another writer took is made in slices that a stop request ends.

Around that: the policy gets the learner's parameters every ``sync_period`` env steps
(:class:`VariableClient`), evaluation episodes run on a separate env every ``eval_every`` env steps
with ``evaluation=True``, metrics go to CSV and TensorBoard (:mod:`rlflow.loggers`), a progress bar
shows the run, and Ctrl-C or SIGTERM stops it cleanly after the current step.
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
from typing import Any

import numpy as np

from rlflow.actors import Actor, EpisodeStats, VariableClient, evaluate
from rlflow.core import Learner, LearnerUpdate, Policy
from rlflow.loggers import MultiLogger, make_logger
from rlflow.run_checks import check_limiter, check_parts, check_unsampled, unsampled_tables
from rlflow.types import ONE_LANE_NO as _NO

__all__ = ["RunResult", "run"]

# Whether run() takes one plain gymnasium env's steps that continue an episode in one compiled call
# (_OneEnvSteps); off, every step goes through the general body (the tests compare the two).
_ONE_ENV_STEPS = False

# Seconds between the checks of a wait for room in a table (a stop request ends the wait within one).
_WAIT_SLICE = 0.01


@dataclass
class RunResult:
    """What a run did: counts, every finished training episode, and every evaluation."""

    env_steps: int = 0
    learner_steps: int = 0
    episodes: list[tuple[int, float, int]] = field(default_factory=list)  # (env step, return, length)
    evaluations: list[tuple[int, float]] = field(default_factory=list)  # (env step, mean return)
    learner_metrics: dict[str, float] = field(default_factory=dict)  # of the last learner step
    stopped: str = ""  # why the run ended early ("" if it ran to the end)
    eval_seconds: float = 0.0  # wall-clock spent in evaluation episodes

    @property
    def final_evaluation(self) -> float | None:
        return self.evaluations[-1][1] if self.evaluations else None


class _Stop:
    """Set by Ctrl-C or SIGTERM while the loop runs (the loop finishes its step, then returns)."""

    def __init__(self) -> None:
        self.reason = ""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.reason = signal.Signals(signum).name

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _OneEnvSteps:
    """:func:`run`'s body without a learner on one plain gymnasium env, for the steps that continue an
    episode: the env's own ``step``, then one compiled call (:func:`~rlflow.adders._kernels.stage_env_step`)
    that checks and stages its action, reward and observation as the adder's :meth:`stage` stages the env
    wrapper's TimeStep of that step, and counts the episode's return and length as :class:`EpisodeStats`
    does. What that call cannot take (an episode's end, an observation of another dtype or shape, a reward
    that is not a float, extras, bad values) gets the wrapper's TimeStep of the step and goes through the
    general body, which raises on bad input as it always does. The store, table, statistics and results
    come out as the general body leaves them (tests check this)."""

    def __init__(self, env: Any, actor: Actor, adder: Any, stats: EpisodeStats, raw_step: Any, timestep: Any,
                 block: Any) -> None:
        self.env, self.actor, self.adder, self.stats = env, actor, adder, stats
        self.raw_step, self.timestep, self.block = raw_step, timestep, block
        # The kernel's control row: the episode's return and length while collect() runs, the value checks.
        self.ctl = np.concatenate([np.zeros(2), block.plan[6]])
        self.rows = tuple(col.reshape(-1) for col in (block.act, block.rew, block.obs))

    @classmethod
    def make(cls, env: Any, actor: Actor, adder: Any, stats: EpisodeStats) -> _OneEnvSteps | None:
        """The collector of ``env``'s steps into ``adder``, or None when the general body must take them."""
        one = getattr(env, "_one_env", None)
        sink = getattr(adder, "_env_sink", None)
        if one is None or sink is None or env.num_envs != 1 or not stats._one:
            return None
        got = one()
        block = sink() if got is not None else None
        if block is None:
            return None
        if got[2] != block.plan[2] or got[3] != block.plan[3][1:]:  # the wrapper's arrays would go the general way
            return None
        return cls(env, actor, adder, stats, got[0], got[1], block)

    def collect(self, ts: Any, limit: int, stop: _Stop, start: float,
                max_seconds: float | None) -> tuple[int, Any, tuple[Any, Any] | None]:
        """Act, step and stage up to ``limit`` steps from ``ts`` (until a stop or ``max_seconds``, as
        :func:`run` checks them). Returns how many steps were staged, the TimeStep to act on next, and
        ``(actions, extras)`` when that TimeStep is of one more step that the general body must write
        and count (None when there is none)."""
        select, raw_step, kernel = self.actor.select_action, self.raw_step, KA.stage_env_step
        adder, stats, ctl, blk = self.adder, self.stats, self.ctl, self.block
        staged, open_rows = blk.staged, adder._open
        is_open = open_rows[0] >= 0  # (as a flush leaves it: it ends no episode here)
        act_rows, rew_rows, obs_rows = self.rows
        act_dtype, act_shape, obs_dtype, obs_shape = blk.plan[0], blk.plan[1], blk.plan[2], blk.plan[3][1:]
        full = adder.stage_steps
        obs, first = ts.observation, ts.first
        last = None  # the env's output of the last step staged here
        taken = 0
        ctl[0], ctl[1] = stats._ret, stats._len
        try:
            while taken < limit:
                if stop.reason or (max_seconds is not None and time.monotonic() - start > max_seconds):
                    break
                actions, extras = select(obs, first=first)
                if (not is_open or extras is not None or type(actions) is not np.ndarray
                        or actions.dtype is not act_dtype or actions.shape != act_shape):
                    return taken, self.env.step(actions), (actions, extras)
                out = raw_step(actions[0])
                o, r, terminated, truncated, _ = out
                if (terminated or truncated or type(o) is not np.ndarray or o.dtype is not obs_dtype
                        or o.shape != obs_shape or (type(r) is not float and type(r) is not np.float64)):
                    return taken, self.timestep(*out), (actions, extras)
                s = kernel(staged, ctl, actions, act_rows, r, rew_rows, o, obs_rows)
                if s < 0:
                    return taken, self.timestep(*out), (actions, extras)
                taken += 1
                obs, first, last = o[None].copy(), _NO, out
                if s == full:
                    adder._staged = full
                    adder.flush()
                    is_open = open_rows[0] >= 0
            return taken, (ts if last is None else self.timestep(*last)), None
        finally:  # the adder and the statistics as the general body leaves them, also on an exception
            adder._staged = int(staged[0])
            stats._ret, stats._len = float(ctl[0]), int(ctl[1])


def run(env: Any, policy: Policy, learner: Learner | None, adder: Any, table: Any, *, steps: int,
        batch_size: int = 32, sync_period: int = 1, eval_env: Any = None, eval_every: int = 0,
        eval_episodes: int = 10, logdir: str | Path | None = None, tensorboard: bool = True,
        log_every: int = 1_000, progress: bool = True, seed: int | None = None, max_seconds: float | None = None,
        observers: Sequence[Callable[[str, int, Mapping[str, float]], None]] = (), checkpoint_every: int = 0,
        checkpoint_dir: str | Path | None = None, resume: bool = False) -> RunResult:
    """Train for ``steps`` env steps (counted over all lanes); see the module docstring.

    Args:
        env: an :class:`rlflow.envs.GymEnvironment` (its lanes are the adder's store's lanes).
        policy, learner: the user's :class:`~rlflow.core.Policy` and :class:`~rlflow.core.Learner`
            (``learner=None``: only collect).
        adder, table: the adder writing ``env``'s steps, and the table the learner samples from.
        batch_size: items per learner step.
        sync_period: env steps between parameter pulls (:class:`VariableClient`).
        eval_env, eval_every, eval_episodes: evaluate on ``eval_env`` every ``eval_every`` env steps and at
            the end (``eval_every=0``: only at the end; no ``eval_env``: never).
        logdir: write ``train.csv``, ``learner.csv``, ``eval.csv`` (and TensorBoard events) there.
        log_every: env steps between rows of averaged learner metrics.
        progress: show a progress bar (tqdm).
        seed: seeds the env's first reset (and the evaluation env's resets).
        max_seconds: stop after this wall-clock time.
        observers: called as ``fn(stream, env_step, metrics)`` for every row the loggers get.
        checkpoint_every: env steps between run checkpoints (0: none); a checkpoint is also written at the
            end and when the run is stopped. It holds the env's state (``env.state_dict()``) and the episodes
            in progress, so a resumed run goes on exactly; an env that cannot be saved ends its episodes as
            truncated at each checkpoint instead (a warning says so once). See :mod:`rlflow.run_checkpoint`
            and ``docs/loop.md``.
        checkpoint_dir: where checkpoints go (default ``<logdir>/checkpoints``).
        resume: continue from the latest checkpoint in ``checkpoint_dir``, if there is one.
    """
    from tqdm.auto import tqdm

    if int(steps) < 1 or int(batch_size) < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    check_parts(env, policy, learner, adder, table, eval_env)
    if adder.store is not table.store:
        raise ValueError(f"the adder writes another store than table {table.name!r} samples from")
    lanes = env.num_envs
    if adder.num_lanes != lanes:
        raise ValueError(f"the adder's store has {adder.num_lanes} lanes, the env {lanes}: expected one lane per env "
                         f"(build the store with lanes=env.num_envs)")
    if learner is not None:
        check_limiter(table, batch_size, lanes * adder.max_items_per_step)
    actor = Actor(policy, env.action_spec, lanes, env.single_action_space)
    client = VariableClient(learner, policy, sync_period) if learner is not None else None
    stats = EpisodeStats(lanes)
    result = RunResult()
    if checkpoint_dir is None and (checkpoint_every > 0 or resume):
        if logdir is None:
            raise ValueError("checkpoints need a checkpoint_dir or a logdir")
        checkpoint_dir = Path(logdir) / "checkpoints"
    restored = None
    if resume:
        from rlflow import run_checkpoint

        path = run_checkpoint.latest(checkpoint_dir)
        if path is not None:
            restored = run_checkpoint.load_run(path, table.store, table, adder, before_replay=lambda state: (
                env.load_state_dict(state["env"]) if state["env"] is not None else None),
                check=lambda state, where: (run_checkpoint.check_run_state(state, where, lanes),
                                            actor.check_state(state["actor"])))
    # Tables nothing samples here must take every item the rest of the run may write, without a sample.
    per_step = adder.max_items_per_step
    left = -(-max(int(steps) - (0 if restored is None else int(restored["env_steps"])), 0) // lanes) * lanes
    unsampled = unsampled_tables(adder, table, learner)
    check_unsampled(unsampled, left, per_step, table if learner is not None else None)
    bounded = [t for t in unsampled if t.rate_limiter.max_diff < sys.float_info.max]  # those that may refuse
    logger: MultiLogger = make_logger(logdir, tensorboard=tensorboard,
                                      resume_at=None if restored is None else int(restored["env_steps"]))
    pending: dict[str, list[float]] = {}
    start = time.monotonic()

    def emit(stream: str, metrics: Mapping[str, float]) -> None:
        logger.write(stream, result.env_steps, metrics)
        for fn in observers:
            fn(stream, result.env_steps, metrics)

    def run_eval() -> None:
        began = time.monotonic()
        returns = evaluate(eval_env, policy, eval_episodes, seed=None if seed is None else seed + 10_000 + len(
            result.evaluations))
        result.evaluations.append((result.env_steps, float(np.mean(returns))))
        result.eval_seconds += time.monotonic() - began
        emit("eval", {"return": float(np.mean(returns)), "return_std": float(np.std(returns))})
        bar.write(f"eval at {result.env_steps} env steps: mean return {np.mean(returns):.2f} "
                  f"over {len(returns)} episodes")

    counters = {"next_eval": eval_every if eval_every > 0 else math.inf, "next_log": log_every,
                "next_checkpoint": checkpoint_every if checkpoint_every > 0 else math.inf}
    saved = [-1]  # env steps of the last checkpoint written or loaded
    resumed_ts = None  # the timestep a resumed run acts on (None: the envs restart)
    if restored is not None:
        resumed_ts = _restore(restored, adder, learner, policy, actor, stats, result, counters)
        saved[0] = result.env_steps
    unsaved = [""]  # why the env's state cannot be saved (said once per run)

    def checkpoint(ts: Any) -> bool:
        """Write a run checkpoint at ``ts`` (the timestep the loop acts on next); whether the envs must
        restart (their state could not be saved, so the episodes in progress were ended)."""
        from rlflow import run_checkpoint

        env_saved = _env_state(env)
        if isinstance(env_saved, str):
            # The env's state cannot be saved: end the episodes in progress (truncated: they bootstrap),
            # save, and restart the envs, as a resumed run will at this step.
            if not unsaved[0]:
                unsaved[0] = env_saved
                warnings.warn(f"run checkpoints: the env's state cannot be saved ({env_saved}); every checkpoint "
                              "ends the episodes in progress as truncated and restarts the envs with seed + env "
                              "steps (see docs/loop.md)", stacklevel=3)
            adder.truncate()
            stats.reset()
            env_saved = None
        run_checkpoint.save_run(checkpoint_dir, result.env_steps, table.store, table, {
            "env_steps": result.env_steps, "learner_steps": result.learner_steps,
            "episodes": result.episodes, "evaluations": result.evaluations, "learner_metrics": result.learner_metrics,
            "counters": {k: (None if v == math.inf else v) for k, v in counters.items()},
            "adder": adder.state_dict(),
            "learner": learner.state_dict() if learner is not None else {}, "policy": policy.state_dict(),
            "env": env_saved, "timestep": None if env_saved is None else _timestep_state(ts),
            "episode_stats": stats.state_dict(), "actor": actor.state_dict(),
            "variable_client": client.state_dict() if client is not None else None})
        saved[0] = result.env_steps
        return env_saved is None

    def due() -> float:
        """The env step of the next log row, evaluation or checkpoint."""
        evaluates = counters["next_eval"] if eval_env is not None else math.inf
        return min(counters["next_log"], evaluates, counters["next_checkpoint"])

    def restart_envs() -> Any:
        ts = env.reset(seed=None if seed is None else seed + result.env_steps)
        adder.add_first(ts)
        actor.reset()
        return ts

    # Without a learner nothing samples the table during the run: steps are staged and written in blocks
    # (the adder flushes before anything else it does, e.g. the checkpoints' truncate).
    write = getattr(adder, "stage", adder.add) if learner is None else adder.add
    fast = _OneEnvSteps.make(env, actor, adder, stats) if learner is None and _ONE_ENV_STEPS else None
    flush = getattr(adder, "flush", lambda: None)
    bar = tqdm(total=int(steps), initial=min(result.env_steps, int(steps)), unit="step", disable=not progress,
               dynamic_ncols=True)
    try:
        with _Stop() as stop:
            if client is not None:  # a fresh run pulls at once; a resumed one keeps its pull schedule
                client.resume(None if restored is None else restored.get("variable_client"), result.env_steps,
                              policy_restored=restored is not None and bool(restored["policy"]))
            ts = restart_envs() if resumed_ts is None else resumed_ts
            next_event = due()
            while result.env_steps < steps:
                if stop.reason or (max_seconds is not None and time.monotonic() - start > max_seconds):
                    result.stopped = stop.reason or "max_seconds"
                    break
                if learner is not None and table.can_sample(batch_size):
                    _learn(learner, table, batch_size, result, pending)
                    continue
                if learner is not None and not table.can_insert(lanes * adder.max_items_per_step):
                    raise RuntimeError(f"table {table.name!r}: the rate limiter admits neither a sample of "
                                       f"{batch_size} nor an env step's items ({table.rate_limiter!r}, "
                                       f"size {table.size})")
                if bounded and not _wait_for_room(bounded, lanes * per_step, stop, start, max_seconds):
                    result.stopped = stop.reason or "max_seconds"
                    break
                if fast is not None:  # steps that continue an episode, until the next event or one that does not
                    taken, ts, acted = fast.collect(ts, min(next_event, steps) - result.env_steps, stop, start,
                                                    max_seconds)
                    result.env_steps += taken
                    if progress and taken:
                        bar.update(taken)
                else:
                    actions, extras = actor.select_action(ts.observation, first=ts.first)
                    acted, ts = (actions, extras), env.step(actions)
                if acted is not None:
                    actions, extras = acted
                    write(actions, ts, extras)
                    result.env_steps += lanes
                    if progress:
                        bar.update(lanes)
                    for ret, length in stats.update(ts):
                        result.episodes.append((result.env_steps, ret, length))
                        emit("train", {"return": ret, "length": length})
                    if client is not None:
                        client.update(result.env_steps)
                if result.env_steps < next_event:
                    continue
                if result.env_steps >= counters["next_log"]:
                    counters["next_log"] += log_every
                    if pending:
                        emit("learner", {k: float(np.mean(v)) for k, v in pending.items()})
                        pending.clear()
                    recent = [r for _, r, _ in result.episodes[-20:]]
                    if recent:
                        bar.set_postfix(train_return=f"{np.mean(recent):.1f}", learner_steps=result.learner_steps)
                if result.env_steps >= counters["next_eval"] and eval_env is not None:
                    counters["next_eval"] += eval_every
                    run_eval()
                if result.env_steps >= counters["next_checkpoint"]:
                    counters["next_checkpoint"] += checkpoint_every
                    if checkpoint(ts) and result.env_steps < steps:
                        ts = restart_envs()
                next_event = due()
            if checkpoint_every > 0 and saved[0] != result.env_steps:
                checkpoint(ts)  # the end, or a stop: a later run with more steps resumes from here
            flush()  # (after the checkpoint, which holds the staged steps as a run that goes on holds them)
            if pending:  # the learner metrics since the last row
                emit("learner", {k: float(np.mean(v)) for k, v in pending.items()})
            if eval_env is not None and not result.stopped and (
                    not result.evaluations or result.evaluations[-1][0] != result.env_steps):
                run_eval()
    finally:
        with contextlib.suppress(Exception):  # a run that failed keeps the steps it staged (after a normal end: none)
            flush()
        bar.close()
        logger.close()
    return result


def _env_state(env: Any) -> dict[str, Any] | str:
    """``env.state_dict()``, or why the env's state cannot be saved."""
    from rlflow.env_state import EnvStateError

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


def _restore(state: dict[str, Any], adder: Any, learner: Learner | None, policy: Policy, actor: Actor,
             stats: EpisodeStats, result: RunResult, counters: dict[str, float]) -> Any:
    """Put a run checkpoint's state back (the env, store and table are loaded already); the timestep to act on
    next, or None when the checkpoint ended the episodes in progress (the envs restart)."""
    adder.load_state_dict(state["adder"])
    if learner is not None:
        learner.load_state_dict(state["learner"])
    policy.load_state_dict(state["policy"])
    result.env_steps, result.learner_steps = int(state["env_steps"]), int(state["learner_steps"])
    result.episodes = [tuple(e) for e in state["episodes"]]
    result.evaluations = [tuple(e) for e in state["evaluations"]]
    result.learner_metrics = dict(state["learner_metrics"])
    counters.update({k: (math.inf if v is None else v) for k, v in state["counters"].items()})
    stats.load_state_dict(state["episode_stats"])
    actor.load_state_dict(state["actor"])
    if state["env"] is None:
        return None
    from rlflow.types import TimeStep

    return TimeStep(**state["timestep"], info={})


def _wait_for_room(tables: list[Any], items: int, stop: _Stop, start: float, max_seconds: float | None) -> bool:
    """Wait until each of ``tables`` (nothing samples them in this run) admits ``items`` more items (one env
    step's), in slices of :data:`_WAIT_SLICE` seconds that end on a stop request or ``max_seconds``; whether
    they do. They admit them unless another writer filled them (the run's own items were counted before it
    started): then only a sampler in another thread can make room."""
    if all(t.can_insert(items) for t in tables):
        return True
    warnings.warn(f"rlflow.run: table(s) {[t.name for t in tables]} admit fewer than an env step's {items} items "
                  "without a sample (another writer filled them); waiting for a sampler in another thread, "
                  "until one makes room or the run is stopped", RuntimeWarning, stacklevel=3)
    while not all(t.can_insert(items) for t in tables):
        if stop.reason or (max_seconds is not None and time.monotonic() - start > max_seconds):
            return False
        time.sleep(_WAIT_SLICE)
    return True


def _learn(learner: Learner, table: Any, batch_size: int, result: RunResult, pending: dict[str, list[float]]) -> None:
    sample = table.sample(batch_size)
    out = learner.step(sample)
    if isinstance(out, LearnerUpdate):
        update = out
    elif isinstance(out, Mapping):
        update = LearnerUpdate(metrics=out)
    else:
        raise TypeError(f"{type(learner).__name__}.step returned {type(out).__name__}: expected a "
                        "LearnerUpdate(metrics, priorities=None) or a dict of float metrics (return {} when there "
                        "are none)")
    if update.priorities is not None:
        table.update_priorities(sample.keys, update.priorities)
    result.learner_steps += 1
    metrics: dict[str, float] = {}
    for k, v in update.metrics.items():
        try:
            metrics[k] = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{type(learner).__name__}.step returned the metric {k!r} = {v!r}: expected a number "
                            "(e.g. loss.item())") from None
    result.learner_metrics = metrics
    for k, v in result.learner_metrics.items():
        pending.setdefault(k, []).append(v)
