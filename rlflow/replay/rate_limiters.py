"""Rate limiters: when a table may admit inserts and samples, following Reverb's semantics.

A limiter holds its configuration ``spi`` (samples_per_insert), ``m`` (min_size_to_sample), ``min_diff``
and ``max_diff`` and three cumulative counters: inserts ``I``, samples ``S`` and deletes ``D`` (items that
left the table: evicted, removed, or retired after ``max_times_sampled`` samples). With ``n >= 1``::

    can_sample(n) = (I - D >= m)  and  (I*spi - S - n >= min_diff)
    can_insert(n) = (I + n - D <= m)  or  ((I + n)*spi - S <= max_diff)

``diff = I*spi - S`` is computed in float64 exactly in that order. While the table holds fewer than
``m`` items, inserts are always admitted (the ``or`` branch is not consulted) and samples never are; a
delete can move the table back into that phase. The presets set (``offset = spi*m``)::

    MinSize(m)                      spi=1, m,  min_diff=-float_max, max_diff=+float_max
    SampleToInsertRatio(spi, m, e)  min_diff=offset-e, max_diff=offset+e  (e a number)
    SampleToInsertRatio(spi, m, (lo, hi))  min_diff=lo, max_diff=hi  (no offset)
    Queue(k), Stack(k)              spi=1, m=1, min_diff=0, max_diff=k  (need max_times_sampled=1)

SampleToInsertRatio requires ``max_diff - min_diff >= 2*max(1, spi)`` and ``min_diff <= offset`` and
logs a warning if ``max_diff < offset`` (then a sampler must run concurrently with the inserter).

Worked example, ``SampleToInsertRatio(2.0, 10, 4.0)``: offset 20, min_diff 16, max_diff 24.

==========  =====  =================================  ========================================
I, S, D     diff   can_insert(n)                      can_sample(n)
==========  =====  =================================  ========================================
0, 0, 0     0      n <= 10 free (I+n-D <= 10);        never (size 0 < 10)
                   n=12: 24 <= 24 yes; n=13: 26 no
9, 0, 0     18     n=1 free; n=2: 22 <= 24 yes;       never (size 9 < 10)
                   n=3: 24 yes; n=4: 26 no
10, 0, 0    20     n=2: 24 <= 24 yes; n=3: 26 no      n=4: 16 >= 16 yes; n=5: 15 no
12, 0, 0    24     n=1: 26 > 24 no                    n=8: 16 yes; n=9: 15 no
12, 2, 0    22     n=1: 26-2=24 yes; n=2: 26 no       n=6 yes; n=7 no
12, 8, 0    16     n=4: 32-8=24 yes; n=5: 26 no       n=1: 15 < 16 no
12, 0, 3    24     n=1 free (13-3 <= 10); n=2: 28 no  never (size 9 < 10)
==========  =====  =================================  ========================================

In steady state every insert must be paid for by two samples: the diff stays within [16, 24].
The limiter holds no lock: the table calls it under its own lock.
"""

import logging
import math
import numbers
import operator
import sys
from fractions import Fraction
from typing import Any, ClassVar

__all__ = ["MinSize", "Queue", "RateLimiter", "SampleToInsertRatio", "Stack"]

_log = logging.getLogger(__name__)
_CONFIG = ("samples_per_insert", "min_size_to_sample", "min_diff", "max_diff")
_COUNTERS = ("inserts", "samples", "deletes")


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__") or operator.index(value) < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return operator.index(value)


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"{name}: expected a real number (not NaN), got {value!r}")
    return float(value)


def _bound(value: float) -> str:
    """A diff bound as messages print it: ``no bound`` for +-float_max and +-inf (Reverb's unbounded sides)."""
    return "no bound" if abs(value) >= sys.float_info.max else repr(value)


def _shown(key: str, value: Any) -> str:
    """A configuration value of ``key`` as messages print it (diff bounds through :func:`_bound`)."""
    is_bound = key in ("min_diff", "max_diff") and isinstance(value, numbers.Real) and not isinstance(value, bool)
    return _bound(float(value)) if is_bound else repr(value)


def _spi(value: Any) -> float:
    spi = _real("samples_per_insert", value)
    if not (math.isfinite(spi) and spi > 0):
        raise ValueError(f"samples_per_insert: expected a finite number > 0, got {value!r}")
    return spi


class RateLimiter:
    """Admits inserts and samples by the formulas in the module docstring.

    Raises ValueError unless ``samples_per_insert`` is finite and > 0, ``min_size_to_sample`` is an
    integer >= 1, ``min_diff <= max_diff`` (neither NaN), ``min_diff < +inf`` and ``max_diff > -inf``.
    """

    #: max_times_sampled the table must use with this limiter (None: any).
    required_max_times_sampled: ClassVar[int | None] = None

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float,
                 max_diff: float) -> None:
        self._spi = _spi(samples_per_insert)
        self._m = _int("min_size_to_sample", min_size_to_sample, 1)
        self._min_diff = _real("min_diff", min_diff)
        self._max_diff = _real("max_diff", max_diff)
        if self._min_diff == math.inf:
            raise ValueError("min_diff: expected a number < +inf (no sample could ever pass), got inf")
        if self._max_diff == -math.inf or self._max_diff < self._min_diff:
            raise ValueError(f"max_diff: expected a number > -inf and >= min_diff={_bound(self._min_diff)}, "
                             f"got {max_diff!r}")
        self._inserts = self._samples = self._deletes = 0

    @property
    def samples_per_insert(self) -> float:
        """Target samples per inserted item."""
        return self._spi

    @property
    def min_size_to_sample(self) -> int:
        """Items the table must hold before a sample is admitted."""
        return self._m

    @property
    def min_diff(self) -> float:
        """Lowest diff a sample may leave behind."""
        return self._min_diff

    @property
    def max_diff(self) -> float:
        """Highest diff an insert may leave behind."""
        return self._max_diff

    @property
    def inserts(self) -> int:
        """Cumulative inserts."""
        return self._inserts

    @property
    def samples(self) -> int:
        """Cumulative samples."""
        return self._samples

    @property
    def deletes(self) -> int:
        """Cumulative deletes (evicted, removed or retired items)."""
        return self._deletes

    def can_insert(self, n: int = 1) -> bool:
        """Whether ``n >= 1`` more inserts are admitted now."""
        if type(n) is not int or n < 1:
            n = _int("n", n, 1)
        if self._inserts + n - self._deletes <= self._m:
            return True
        return (n + self._inserts) * self._spi - self._samples <= self._max_diff

    def can_sample(self, n: int = 1) -> bool:
        """Whether ``n >= 1`` more samples are admitted now."""
        if type(n) is not int or n < 1:
            n = _int("n", n, 1)
        if self._inserts - self._deletes < self._m:
            return False
        return self._inserts * self._spi - self._samples - n >= self._min_diff

    def insert(self, n: int = 1) -> None:
        """Record ``n >= 0`` inserts (admission is the caller's business)."""
        self._inserts += n if type(n) is int and n >= 0 else _int("n", n, 0)

    def sample(self, n: int = 1) -> None:
        """Record ``n >= 0`` samples."""
        self._samples += n if type(n) is int and n >= 0 else _int("n", n, 0)

    def delete(self, n: int = 1) -> None:
        """Record ``n >= 0`` deletes; there can be no more deletes than inserts."""
        if type(n) is not int or n < 0:
            n = _int("n", n, 0)
        if self._deletes + n > self._inserts:
            raise ValueError(f"n: expected at most {self._inserts - self._deletes} (items present), got {n}")
        self._deletes += n

    def check_deadlock_free(self, max_size: int, max_times_sampled: int | None) -> None:
        """Raise ValueError if a table (``max_size``, ``max_times_sampled``) with this limiter stalls.

        The table evicts (remover's choice) when full, so only the limiter blocks inserts; an item is
        deleted after ``max_times_sampled`` samples (None: never). With ``size = I - D`` the table is
        *stuck* when ``can_insert(1)`` and ``can_sample(1)`` are both False: that needs ``size >= m``
        and a diff in the gap ``G = (max_diff - spi, min_diff + 1)``. Rules, in order:

        1. ``min_size_to_sample > max_size``: the table never holds ``m`` items; samples never run.
        2. Queue/Stack (``required_max_times_sampled`` set): ``max_times_sampled`` must equal it, and
           ``max_diff <= max_size``, else the table evicts items that were never sampled.
        3. ``samples_per_insert > max_times_sampled``: samples can never keep up (each item gives at
           most ``max_times_sampled``), the diff grows without bound, and inserts only pass through the
           ``size < m`` escape: the table hovers at ``m`` items in lock-step instead of limiting.
        4. Window: if ``max_diff - min_diff >= spi + 1``, G is empty and no state is stuck. Otherwise
           at most one operation is admitted in any state with ``size >= m``, so with no deletes by
           sampling the run is forced: ``m`` free inserts (diff ``m*spi``), inserts while the diff is
           ``<= max_diff - spi``, samples while it is ``>= min_diff + 1``. Diffs lie on the lattice
           ``Z/q`` (``spi = p/q`` in lowest terms, exact rational of the float) and, after the first
           sample, each pass below ``min_diff + 1`` lands on the next point of the rotation by
           ``spi`` mod 1, which visits every lattice point of ``[min_diff, min_diff + 1)``. So it stalls
           iff the initial insert run ends in G or the largest lattice point below ``min_diff + 1``
           exceeds ``max_diff - spi``. Exact with ``max_times_sampled=None``; with a limit it is
           sound (a limiter passing it never stalls) but may reject one that deletes would rescue,
           since an emptied table always admits an insert. Queue(1) passes: G = (0, 1) holds no integer.
        """
        max_size = _int("max_size", max_size, 1)
        mts = None if max_times_sampled is None else _int("max_times_sampled", max_times_sampled, 1)
        if self._m > max_size:
            raise ValueError(f"{self!r} would deadlock: min_size_to_sample={self._m} exceeds max_size="
                             f"{max_size}, so the table never holds enough items to sample")
        required = self.required_max_times_sampled
        if required is not None and mts != required:
            raise ValueError(f"{self!r} needs max_times_sampled={required}, got {mts}")
        if required is not None and self._max_diff > max_size:
            raise ValueError(f"{self!r} admits {self._max_diff:g} unsampled items but max_size={max_size}: "
                             f"the table would evict items that were never sampled; use size <= max_size")
        if mts is not None and self._spi > mts:
            raise ValueError(f"{self!r} cannot be satisfied: samples_per_insert={self._spi} exceeds "
                             f"max_times_sampled={mts}, so inserts stay blocked whenever the table holds "
                             f"min_size_to_sample items and the limiter degenerates to lock-step")
        stuck = self._stuck_diff()
        if stuck is not None:
            raise ValueError(f"{self!r} would deadlock: its diff runs into (max_diff - samples_per_insert, "
                             f"min_diff + 1), e.g. {float(stuck)!r}, where neither insert(1) nor sample(1) "
                             f"is admitted; widen max_diff - min_diff to samples_per_insert + 1")

    def _stuck_diff(self) -> Fraction | None:
        """A diff at which the forced run of rule 4 refuses both operations, or None."""
        if math.isinf(self._min_diff) or math.isinf(self._max_diff):
            return None
        spi, lo, hi = Fraction(self._spi), Fraction(self._min_diff), Fraction(self._max_diff)
        top = hi - spi  # inserts admitted iff diff <= top; samples iff diff >= lo + 1
        if top >= lo + 1:
            return None
        diff = self._m * spi
        if diff <= top:
            diff += (math.floor((top - diff) / spi) + 1) * spi
        if diff < lo + 1:
            return diff
        last = Fraction(math.ceil((lo + 1) * spi.denominator) - 1, spi.denominator)
        return last if last > top else None

    def state_dict(self) -> dict[str, int | float]:
        """Configuration and counters as plain numbers."""
        return {"samples_per_insert": self._spi, "min_size_to_sample": self._m, "min_diff": self._min_diff,
                "max_diff": self._max_diff, "inserts": self._inserts, "samples": self._samples,
                "deletes": self._deletes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters of :meth:`state_dict`; the configuration in ``state`` must match."""
        missing = [k for k in _CONFIG + _COUNTERS if k not in state]
        if missing:
            raise ValueError(f"state: expected keys {list(_CONFIG + _COUNTERS)}, missing {missing}")
        mine = self.state_dict()
        for key in _CONFIG:
            if state[key] != mine[key]:
                raise ValueError(f"state[{key!r}]: expected {_shown(key, mine[key])} (this limiter), got "
                                 f"{_shown(key, state[key])}")
        inserts, samples, deletes = (_int(f"state[{k!r}]", state[k], 0) for k in _COUNTERS)
        if deletes > inserts:
            raise ValueError(f"state['deletes']: expected at most inserts={inserts}, got {deletes}")
        self._inserts, self._samples, self._deletes = inserts, samples, deletes

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(samples_per_insert={self._spi!r}, min_size_to_sample={self._m}, "
                f"min_diff={_bound(self._min_diff)}, max_diff={_bound(self._max_diff)}, inserts={self._inserts}, "
                f"samples={self._samples}, deletes={self._deletes})")


class MinSize(RateLimiter):
    """Samples wait until the table holds ``min_size`` items; nothing else is limited."""

    def __init__(self, min_size: int) -> None:
        super().__init__(1.0, _int("min_size", min_size, 1), -sys.float_info.max, sys.float_info.max)


class SampleToInsertRatio(RateLimiter):
    """Keeps ``samples / inserts`` near ``samples_per_insert`` once ``min_size_to_sample`` is reached.

    ``error_buffer`` is a number ``e`` (diff window ``spi*m -/+ e``) or a ``(min_diff, max_diff)`` pair.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: float | tuple[float, float]) -> None:
        spi = _spi(samples_per_insert)
        m = _int("min_size_to_sample", min_size_to_sample, 1)
        offset = spi * m
        if isinstance(error_buffer, numbers.Real) and not isinstance(error_buffer, bool):
            e = _real("error_buffer", error_buffer)
            min_diff, max_diff = offset - e, offset + e
        elif isinstance(error_buffer, tuple | list) and len(error_buffer) == 2:
            min_diff, max_diff = (_real("error_buffer", v) for v in error_buffer)
        else:
            raise ValueError(f"error_buffer: expected a number or a (min_diff, max_diff) pair, "
                             f"got {error_buffer!r}")
        if not max_diff - min_diff >= 2 * max(1.0, spi):
            raise ValueError(f"error_buffer: expected a window max_diff - min_diff >= 2 * max(1, "
                             f"samples_per_insert) = {2 * max(1.0, spi)!r} (a narrower one can block inserts "
                             f"or samples for good), got {error_buffer!r}: [{_bound(min_diff)}, {_bound(max_diff)}]")
        if min_diff > offset:
            raise ValueError(f"error_buffer: expected min_diff <= samples_per_insert * min_size_to_sample = "
                             f"{offset!r} (else samples deadlock once min_size_to_sample items are in), "
                             f"got min_diff={min_diff!r}")
        if max_diff < offset:
            _log.warning("SampleToInsertRatio: max_diff=%r < samples_per_insert * min_size_to_sample=%r; "
                         "inserts block after min_size_to_sample items until a concurrent sampler runs",
                         max_diff, offset)
        super().__init__(spi, m, min_diff, max_diff)


class Queue(RateLimiter):
    """FIFO queue of ``size`` items: use with Fifo sampler and remover and ``max_times_sampled=1``."""

    required_max_times_sampled: ClassVar[int | None] = 1

    def __init__(self, size: int) -> None:
        super().__init__(1.0, 1, 0.0, float(_int("size", size, 1)))


class Stack(RateLimiter):
    """LIFO stack of ``size`` items: use with Lifo sampler and remover and ``max_times_sampled=1``."""

    required_max_times_sampled: ClassVar[int | None] = 1

    def __init__(self, size: int) -> None:
        super().__init__(1.0, 1, 0.0, float(_int("size", size, 1)))
