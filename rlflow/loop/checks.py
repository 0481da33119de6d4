"""What :func:`rlflow.run` checks before it starts: that it got the objects it drives, and that the tables'
rate limiters let the loop move (one thread: a wait for a sample or an insert that nothing else will make
would last for ever, so such a configuration is refused, with the setting that fixes it).

The learner's table: each loop turn either samples ``batch_size`` items or writes one env step, up to
``items`` items (``lanes * adder.max_items_per_step``), each worth ``spi`` samples. That needs

- a window ``max_diff - min_diff >= batch_size + items * spi`` (after a learner step, the diff may sit just
  below ``min_diff + batch_size``; one env step's items must still enter);
- room for one env step's items with ``min_size_to_sample - 1`` items stored, when nothing can sample yet:
  ``(min_size_to_sample - 1 + items) * spi <= max_diff``.

The same two keep a loop with ``bursts`` moving (its learner trains until the diff is below ``min_diff +
batch_size``, where an env step's items enter; its lanes step until the diff is above ``max_diff - items *
spi``, where a sample is admitted), which also needs a finite ``max_diff``: a limiter that never refuses an
insert would never let it train.

For ``SampleToInsertRatio(spi, m, e)`` (``min_diff = spi*m - e``, ``max_diff = spi*m + e``) both hold for
``e >= max((batch_size + items*spi) / 2, (items - 1) * spi)``; the message gives the least whole ``e`` that
passes every check (these two and the limiter's own), e.g. ``SampleToInsertRatio(1.0, 10, e)`` with 4 lanes,
3-step windows (12 items a step) and batches of 4: ``e >= max(16 / 2, 11) = 11``.

Tables nothing samples during the run (every table when ``learner`` is None; the adder's other tables
otherwise) must admit every item the run may write without a sample: up to ``steps *
adder.max_items_per_step`` of them.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from rlflow.environment import Environment
from rlflow.replay.rate_limiters import Queue, SampleToInsertRatio, Stack

__all__ = ["check_bursts", "check_env", "check_limiter", "check_parts", "check_unsampled", "least_error_buffer",
           "unsampled_tables"]

_NEEDS = {
    "policy": ("act", "initial_state", "set_params", "state_dict", "load_state_dict"),
    "learner": ("step", "get_params", "state_dict", "load_state_dict"),
    "adder": ("add_first", "add", "store", "tables", "num_lanes", "max_items_per_step", "state_dict"),
    "table": ("can_sample", "can_insert", "sample", "store", "rate_limiter", "name"),
}
_WHAT = {
    "policy": "an rlflow.Policy (act(observation, state, *, evaluation) -> (actions, extras, state))",
    "learner": "an rlflow.Learner (step(sample) -> metrics), or None to only collect",
    "adder": "an rlflow adder (e.g. adders.NStepTransition(store, [table], n=...))",
    "table": "an rlflow.replay.Table",
}


def check_env(env: Any, name: str, caller: str = "rlflow.run") -> None:
    """Raise TypeError, naming the wrapper to use, unless ``env`` is an :class:`~rlflow.environment.Environment`
    (one of rlflow's batched envs, or a class of one's own with its members)."""
    if isinstance(env, Environment):
        return
    from rlflow.envs.kinds import wrapper_for  # (imports gymnasium: only on this error's way)

    wrapper = wrapper_for(env)
    if wrapper:
        got, hint = type(env).__name__, f"wrap it: {wrapper}"
    else:  # an object of one's own: the members of the protocol it lacks
        missing = [m for m in vars(Environment) if not m.startswith("_") and not hasattr(env, m)]
        got = f"{type(env).__name__} (no {', '.join(missing)})"
        hint = ("use envs.GymEnvironment(gymnasium_env), envs.make(env_id, num_envs=...) or "
                "envs.ParallelEnvironment([pettingzoo_env, ...]), or give your own class the members of "
                "rlflow.Environment")
    raise TypeError(f"{name}: {caller} expected an rlflow env (it steps every lane at once and knows its action "
                    f"spec), got {got}; {hint}")


def check_parts(env: Any, policy: Any, learner: Any, adder: Any, table: Any, eval_env: Any) -> None:
    """Raise TypeError naming the argument, what it must be and how to get one, for a wrong object."""
    check_env(env, "env")
    if eval_env is not None:
        check_env(eval_env, "eval_env")
    for name, obj in (("policy", policy), ("learner", learner), ("adder", adder), ("table", table)):
        if name == "learner" and obj is None:
            continue
        missing = [a for a in _NEEDS[name] if not hasattr(obj, a)]
        if missing:
            raise TypeError(f"{name}: rlflow.run expected {_WHAT[name]}, got {type(obj).__name__} (no "
                            f"{', '.join(missing)})")


def _window_problem(spi: float, m: int, min_diff: float, max_diff: float, batch_size: int, items: int) -> str:
    """Why the loop would deadlock under these limiter numbers ("" if it would not)."""
    need = batch_size + items * spi
    if max_diff - min_diff < need:
        return (f"the rate limiter's window max_diff - min_diff = {max_diff - min_diff:g} cannot hold one sample of "
                f"{batch_size} plus one env step's {items} items at {spi:g} samples each ({need:g})")
    if (m - 1 + items) * spi > max_diff:
        return (f"with {m - 1} of the min_size_to_sample={m} items stored, one env step's {items} items would "
                f"need a diff of {(m - 1 + items) * spi:g}, above max_diff={max_diff:g}: nothing could sample "
                f"or insert")
    return ""


def least_error_buffer(spi: float, m: int, batch_size: int, items: int) -> int:
    """The least whole ``error_buffer`` for which ``SampleToInsertRatio(spi, m, error_buffer)`` passes its own
    checks and the loop's (with batches of ``batch_size`` and ``items`` items an env step)."""

    def passes(e: int) -> bool:
        try:
            limiter = SampleToInsertRatio(spi, m, e)
        except ValueError:
            return False
        return not _window_problem(spi, m, limiter.min_diff, limiter.max_diff, batch_size, items)

    # The exact bound, max((batch + items*spi) / 2, (items - 1)*spi, max(1, spi)); float rounding of the
    # diffs may move it by a step, so the search starts below it.
    bound = max((batch_size + items * spi) / 2, (items - 1) * spi, max(1.0, spi))
    e = max(0, math.floor(bound) - 2)
    while not passes(e):
        e += 1
    return e


def check_limiter(table: Any, batch_size: int, items: int, bursts: bool = False) -> None:
    """Raise ValueError, naming the setting that fixes it, when the loop could deadlock on ``table`` (the
    learner's), with batches of ``batch_size`` and up to ``items`` items an env step, or (``bursts``: it
    acts until the table refuses an env step) would never train."""
    limiter = table.rate_limiter
    if limiter.min_diff <= -sys.float_info.max:  # Reverb's "no lower bound" (MinSize)
        raise ValueError(f"table {table.name!r}: its rate limiter {limiter!r} never refuses a sample, so the loop "
                         "would only train; use SampleToInsertRatio(samples_per_insert, min_size, error_buffer) "
                         "to set how many samples each inserted item buys")
    if bursts and limiter.max_diff >= sys.float_info.max:
        raise ValueError(f"table {table.name!r}: its rate limiter {limiter!r} never refuses an insert, so a loop "
                         "with bursts would only act; give it a finite max_diff (e.g. SampleToInsertRatio("
                         "samples_per_insert, min_size, (min_diff, max_diff))) or run with bursts=False")
    spi, m = limiter.samples_per_insert, limiter.min_size_to_sample
    problem = _window_problem(spi, m, limiter.min_diff, limiter.max_diff, batch_size, items)
    if not problem:
        return
    if isinstance(limiter, Queue | Stack):
        size = batch_size + items  # spi 1, m 1, min_diff 0, max_diff size: both checks hold from here on
        fix = (f"give the {type(limiter).__name__} a size of at least {size} (batch_size {batch_size} + one env "
               f"step's {items} items), or take smaller batches")
    elif math.isinf(limiter.min_diff) or math.isinf(limiter.max_diff):
        fix = (f"widen the window to max_diff - min_diff >= {batch_size + items * spi:g} and max_diff >= "
               f"{(m - 1 + items) * spi:g}")
    else:
        e = least_error_buffer(spi, m, batch_size, items)
        fix = (f"give SampleToInsertRatio(samples_per_insert={spi:g}, min_size_to_sample={m}) an error_buffer of "
               f"at least {e} (the least that passes every check), or take smaller batches")
    raise ValueError(f"table {table.name!r}: {problem} ({limiter!r}); the loop would deadlock. {fix}")


def check_bursts(table: Any, items: int, most_items: int) -> None:
    """Raise ValueError when the learner of a run with bursts would never get the turn: it trains once ``table``
    refuses an env step's ``items``, and before the run's last env step (its up to ``most_items`` more items
    but that step's, then asking for that step's ``items``), with no sample, the diff is at most ``max_diff``."""
    limiter = table.rate_limiter
    top = (limiter.inserts + most_items) * limiter.samples_per_insert - limiter.samples
    if top <= limiter.max_diff:
        raise ValueError(f"table {table.name!r}: with bursts the learner trains once the table refuses an env step's "
                         f"items, at a diff above max_diff={limiter.max_diff:g}, and this run's up to "
                         f"{most_items} more items ask for at most {top:g}: it would never train "
                         f"({limiter!r}); lower max_diff, run more steps, or run with bursts=False")


def unsampled_tables(adder: Any, table: Any, learner: Any) -> list[Any]:
    """The tables the adder writes that nothing samples during the run."""
    return [t for t in adder.tables if learner is None or t is not table]


def _admitted(table: Any, most: int) -> int:
    """How many of ``most`` more items ``table`` admits now without a sample (``can_insert`` is monotone)."""
    if most < 1 or table.can_insert(most):
        return max(most, 0)
    lo, hi = 0, most  # can_insert(lo) holds (or lo == 0), can_insert(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if table.can_insert(mid) else (lo, mid)
    return lo


def check_unsampled(tables: list[Any], steps: int, per_step: int, learner_table: Any) -> None:
    """Raise ValueError when one of ``tables`` (nothing samples them during the run) may refuse one of the
    run's up to ``steps * per_step`` items (``steps`` env steps of up to ``per_step`` items each): its
    inserts would wait for samples that never come."""
    items = steps * per_step
    for t in tables:
        got = _admitted(t, items)
        if got >= items:
            continue
        who = ("learner=None: nothing samples it" if learner_table is None else
               f"the learner samples table {learner_table.name!r}, nothing samples this one")
        raise ValueError(
            f"table {t.name!r}: {who} during the run, so its rate limiter must admit, without a sample, every "
            f"item the run may write: up to {items} ({steps} env steps x {per_step}), but "
            f"{t.rate_limiter!r} admits {got} more; the run would wait for samples for ever. Give that table "
            f"MinSize(min_size) (it only collects), sample it with a learner, or run at most "
            f"{got // max(per_step, 1)} steps")
