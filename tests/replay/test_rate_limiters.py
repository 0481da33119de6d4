import json
import logging
import math
import random
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.replay.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack

FMAX = sys.float_info.max

LIMITERS = {
    "min_size_3": lambda: MinSize(3),
    "ratio_2_10_4": lambda: SampleToInsertRatio(2.0, 10, 4.0),  # window [16, 24]
    "ratio_half_4_range": lambda: SampleToInsertRatio(0.5, 4, (-1.0, 3.0)),
    "queue_2": lambda: Queue(2),
    "stack_1": lambda: Stack(1),
    "custom_1.5_2_0_5": lambda: RateLimiter(1.5, 2, 0.0, 5.0),
    "custom_1_1_-1_1": lambda: RateLimiter(1.0, 1, -1.0, 1.0),
    "custom_0.1_1_-1_0.3": lambda: RateLimiter(0.1, 1, -1.0, 0.3),
}


def at(limiter: RateLimiter, inserts: int, samples: int, deletes: int) -> RateLimiter:
    limiter.insert(inserts)
    limiter.sample(samples)
    limiter.delete(deletes)
    return limiter


# (limiter, (inserts, samples, deletes), n, can_insert(n), can_sample(n)); hand-computed, the
# comment gives size = I - D and the numbers compared: (I+n)*spi - S vs max_diff, I*spi - S - n vs min_diff.
CASES = [
    ("min_size_3", (0, 0, 0), 1, True, False),  # free insert; size 0 < 3
    ("min_size_3", (0, 0, 0), 5, True, False),  # 5 > 3 but 5 <= FMAX
    ("min_size_3", (2, 0, 0), 1, True, False),  # 3 <= 3 free; size 2
    ("min_size_3", (3, 0, 0), 1, True, True),
    ("min_size_3", (3, 0, 0), 100, True, True),  # -97 >= -FMAX
    ("min_size_3", (5, 7, 3), 1, True, False),  # size 2: 5+1-3 = 3 free; no sample
    ("ratio_2_10_4", (0, 0, 0), 1, True, False),
    ("ratio_2_10_4", (0, 0, 0), 10, True, False),  # free
    ("ratio_2_10_4", (0, 0, 0), 12, True, False),  # 24 <= 24
    ("ratio_2_10_4", (0, 0, 0), 13, False, False),  # 26
    ("ratio_2_10_4", (9, 0, 0), 1, True, False),  # free, size 9 < 10
    ("ratio_2_10_4", (9, 0, 0), 3, True, False),  # 24
    ("ratio_2_10_4", (9, 0, 0), 4, False, False),  # 26
    ("ratio_2_10_4", (10, 0, 0), 1, True, True),  # 22; 19
    ("ratio_2_10_4", (10, 0, 0), 2, True, True),  # 24; 18
    ("ratio_2_10_4", (10, 0, 0), 3, False, True),  # 26; 17
    ("ratio_2_10_4", (10, 0, 0), 4, False, True),  # 28; 16 >= 16
    ("ratio_2_10_4", (10, 0, 0), 5, False, False),  # 30; 15
    ("ratio_2_10_4", (12, 0, 0), 1, False, True),  # 26; 23
    ("ratio_2_10_4", (12, 0, 0), 8, False, True),  # 16
    ("ratio_2_10_4", (12, 0, 0), 9, False, False),  # 15
    ("ratio_2_10_4", (12, 2, 0), 1, True, True),  # 26-2 = 24; 21
    ("ratio_2_10_4", (12, 2, 0), 2, False, True),  # 26; 20
    ("ratio_2_10_4", (12, 2, 0), 6, False, True),  # 16
    ("ratio_2_10_4", (12, 2, 0), 7, False, False),  # 15
    ("ratio_2_10_4", (12, 8, 0), 1, True, False),  # 18; 15 < 16
    ("ratio_2_10_4", (12, 8, 0), 4, True, False),  # 24
    ("ratio_2_10_4", (12, 8, 0), 5, False, False),  # 26
    ("ratio_2_10_4", (12, 0, 3), 1, True, False),  # 13-3 = 10 free; size 9 despite diff 24
    ("ratio_2_10_4", (12, 0, 3), 2, False, False),  # 11 > 10 and 28 > 24
    ("ratio_half_4_range", (0, 0, 0), 4, True, False),  # free
    ("ratio_half_4_range", (0, 0, 0), 6, True, False),  # 3.0 <= 3
    ("ratio_half_4_range", (0, 0, 0), 7, False, False),  # 3.5
    ("ratio_half_4_range", (4, 0, 0), 1, True, True),  # 2.5; 1
    ("ratio_half_4_range", (4, 0, 0), 2, True, True),  # 3.0; 0
    ("ratio_half_4_range", (4, 0, 0), 3, False, True),  # 3.5; -1 >= -1
    ("ratio_half_4_range", (4, 0, 0), 4, False, False),  # 4.0; -2
    ("ratio_half_4_range", (6, 4, 0), 1, True, False),  # -0.5; -2
    ("ratio_half_4_range", (6, 4, 0), 8, True, False),  # 7-4 = 3
    ("ratio_half_4_range", (6, 4, 0), 9, False, False),  # 3.5
    ("ratio_half_4_range", (6, 4, 3), 1, True, False),  # size 3: free
    ("ratio_half_4_range", (6, 4, 3), 9, False, False),  # 12 > 4 and 7.5-4 = 3.5
    ("queue_2", (0, 0, 0), 1, True, False),
    ("queue_2", (0, 0, 0), 2, True, False),  # 2 <= 2
    ("queue_2", (0, 0, 0), 3, False, False),  # 3
    ("queue_2", (2, 0, 0), 1, False, True),  # 3; 1
    ("queue_2", (2, 0, 0), 2, False, True),  # 4; 0 >= 0
    ("queue_2", (2, 0, 0), 3, False, False),  # -1
    ("queue_2", (2, 1, 1), 1, True, True),  # 3-1 = 2; 0
    ("queue_2", (2, 1, 1), 2, False, False),  # 3; -1
    ("queue_2", (2, 2, 2), 1, True, False),  # empty: free
    ("queue_2", (2, 2, 2), 2, True, False),  # 4-2 = 2
    ("queue_2", (2, 2, 2), 3, False, False),  # 3
    ("stack_1", (0, 0, 0), 1, True, False),
    ("stack_1", (0, 0, 0), 2, False, False),  # 2 > 1
    ("stack_1", (1, 0, 0), 1, False, True),  # 2; 0
    ("stack_1", (1, 0, 0), 2, False, False),  # 3; -1
    ("stack_1", (1, 1, 1), 1, True, False),  # empty: free
    ("custom_1.5_2_0_5", (0, 0, 0), 2, True, False),  # free
    ("custom_1.5_2_0_5", (0, 0, 0), 3, True, False),  # 4.5
    ("custom_1.5_2_0_5", (0, 0, 0), 4, False, False),  # 6
    ("custom_1.5_2_0_5", (3, 0, 0), 1, False, True),  # 6; 3.5
    ("custom_1.5_2_0_5", (3, 0, 0), 4, False, True),  # 0.5
    ("custom_1.5_2_0_5", (3, 0, 0), 5, False, False),  # -0.5
    ("custom_1.5_2_0_5", (3, 2, 0), 1, True, True),  # 6-2 = 4; 1.5
    ("custom_1.5_2_0_5", (3, 2, 0), 2, False, True),  # 5.5; 0.5
    ("custom_1.5_2_0_5", (3, 2, 0), 3, False, False),  # 7; -0.5
    ("custom_1.5_2_0_5", (2, 1, 1), 1, True, False),  # size 1: free
    ("custom_1.5_2_0_5", (2, 1, 1), 2, True, False),  # 3 > 2, 6-1 = 5
    ("custom_1.5_2_0_5", (2, 1, 1), 3, False, False),  # 6.5
    ("custom_1_1_-1_1", (0, 0, 0), 1, True, False),
    ("custom_1_1_-1_1", (1, 0, 0), 1, False, True),  # 2; 0
    ("custom_1_1_-1_1", (1, 0, 0), 2, False, True),  # -1
    ("custom_1_1_-1_1", (1, 0, 0), 3, False, False),  # -2
    ("custom_1_1_-1_1", (1, 2, 0), 1, True, False),  # 0; -2
    ("custom_1_1_-1_1", (1, 2, 0), 2, True, False),  # 1
    ("custom_1_1_-1_1", (1, 2, 0), 3, False, False),  # 2
    # float64 as computed: 3 * 0.1 = 0.30000000000000004 > 0.3; 2 * 0.1 - 0 - 1 = -0.8 >= -1
    ("custom_0.1_1_-1_0.3", (2, 0, 0), 1, False, True),
    ("custom_0.1_1_-1_0.3", (1, 0, 0), 2, False, False),  # 3 * 0.1 again; 0.1 - 2 = -1.9
    ("custom_0.1_1_-1_0.3", (1, 0, 0), 1, True, True),  # 2 * 0.1 = 0.2 <= 0.3; -0.9
]


@pytest.mark.parametrize(("name", "state", "n", "can_insert", "can_sample"), CASES)
def test_hand_computed(name: str, state: tuple[int, int, int], n: int, can_insert: bool,
                       can_sample: bool) -> None:
    limiter = at(LIMITERS[name](), *state)
    assert limiter.can_insert(n) is can_insert
    assert limiter.can_sample(n) is can_sample


def test_presets_config() -> None:
    assert [MinSize(3).samples_per_insert, MinSize(3).min_size_to_sample] == [1.0, 3]
    assert (MinSize(3).min_diff, MinSize(3).max_diff) == (-FMAX, FMAX)
    r = SampleToInsertRatio(2.0, 10, 4.0)
    assert (r.samples_per_insert, r.min_size_to_sample, r.min_diff, r.max_diff) == (2.0, 10, 16.0, 24.0)
    r = SampleToInsertRatio(0.5, 4, (-1.0, 3.0))  # a pair is used as is, without the offset 2.0
    assert (r.min_diff, r.max_diff) == (-1.0, 3.0)
    for cls in (Queue, Stack):
        q = cls(7)
        assert (q.samples_per_insert, q.min_size_to_sample, q.min_diff, q.max_diff) == (1.0, 1, 0.0, 7.0)
        assert cls.required_max_times_sampled == 1
    for lim in (RateLimiter(1.0, 1, 0.0, 1.0), MinSize(1), SampleToInsertRatio(1.0, 1, 1.0)):
        assert lim.required_max_times_sampled is None


def test_docstring_timeline() -> None:
    lim = SampleToInsertRatio(2.0, 10, 4.0)
    for i in range(10):  # stage 1: inserts free, samples refused
        assert lim.can_insert(1) and not lim.can_sample(1), i
        lim.insert()
    assert (lim.can_sample(4), lim.can_sample(5)) == (True, False)  # diff 20
    assert (lim.can_insert(2), lim.can_insert(3)) == (True, False)
    lim.insert(2)  # diff 24
    assert not lim.can_insert(1) and lim.can_sample(8) and not lim.can_sample(9)
    lim.sample(2)  # diff 22
    assert lim.can_insert(1) and not lim.can_insert(2)
    assert lim.can_sample(6) and not lim.can_sample(7)
    lim.sample(6)  # diff 16
    assert not lim.can_sample(1) and lim.can_insert(4) and not lim.can_insert(5)
    for _ in range(50):  # steady state: one insert pays for two samples, diff stays in [16, 24]
        lim.insert()
        assert lim.can_sample(2) and not lim.can_sample(3)
        lim.sample(2)
        assert 16 <= lim.inserts * 2.0 - lim.samples <= 24
    assert lim.inserts * 2.0 - lim.samples == 16.0
    fresh = at(SampleToInsertRatio(2.0, 10, 4.0), 12, 0, 3)  # a delete drops the table below min size
    assert fresh.can_insert(1) and not fresh.can_insert(2) and not fresh.can_sample(1)


BAD_ARGS = [
    (lambda: RateLimiter(0.0, 1, 0.0, 1.0), "samples_per_insert"),
    (lambda: RateLimiter(-1.0, 1, 0.0, 1.0), "samples_per_insert"),
    (lambda: RateLimiter(math.nan, 1, 0.0, 1.0), "samples_per_insert"),
    (lambda: RateLimiter(math.inf, 1, 0.0, 1.0), "samples_per_insert"),
    (lambda: RateLimiter(True, 1, 0.0, 1.0), "samples_per_insert"),
    (lambda: RateLimiter("1", 1, 0.0, 1.0), "samples_per_insert"),
    (lambda: RateLimiter(1.0, 0, 0.0, 1.0), "min_size_to_sample"),
    (lambda: RateLimiter(1.0, -3, 0.0, 1.0), "min_size_to_sample"),
    (lambda: RateLimiter(1.0, 1.5, 0.0, 1.0), "min_size_to_sample"),
    (lambda: RateLimiter(1.0, True, 0.0, 1.0), "min_size_to_sample"),
    (lambda: RateLimiter(1.0, 1, math.nan, 1.0), "min_diff"),
    (lambda: RateLimiter(1.0, 1, math.inf, math.inf), "min_diff"),
    (lambda: RateLimiter(1.0, 1, 0.0, math.nan), "max_diff"),
    (lambda: RateLimiter(1.0, 1, -math.inf, -math.inf), "max_diff"),
    (lambda: RateLimiter(1.0, 1, 2.0, 1.0), "max_diff"),
    (lambda: MinSize(0), "min_size"),
    (lambda: MinSize(2.5), "min_size"),
    (lambda: SampleToInsertRatio(0.0, 1, 5.0), "samples_per_insert"),
    (lambda: SampleToInsertRatio(math.nan, 1, 5.0), "samples_per_insert"),
    (lambda: SampleToInsertRatio(1.0, 0, 5.0), "min_size_to_sample"),
    (lambda: SampleToInsertRatio(1.0, 1, 0.9), "error_buffer"),  # window 1.8 < 2 * max(1, 1)
    (lambda: SampleToInsertRatio(0.5, 1, 0.9), "error_buffer"),  # window 1.8 < 2 * max(1, 0.5)
    (lambda: SampleToInsertRatio(2.0, 1, 1.9), "error_buffer"),  # window 3.8 < 2 * 2
    (lambda: SampleToInsertRatio(2.0, 10, -4.0), "error_buffer"),
    (lambda: SampleToInsertRatio(2.0, 10, math.nan), "error_buffer"),
    (lambda: SampleToInsertRatio(2.0, 10, (0.0, 3.0)), "error_buffer"),  # window 3 < 4
    (lambda: SampleToInsertRatio(2.0, 10, (21.0, 30.0)), "error_buffer"),  # min_diff 21 > offset 20
    (lambda: SampleToInsertRatio(2.0, 10, (math.inf, math.inf)), "error_buffer"),
    (lambda: SampleToInsertRatio(2.0, 10, (1.0, 2.0, 3.0)), "error_buffer"),
    (lambda: SampleToInsertRatio(2.0, 10, "4"), "error_buffer"),
    (lambda: Queue(0), "size"),
    (lambda: Queue(2.0), "size"),
    (lambda: Stack(-1), "size"),
]


@pytest.mark.parametrize(("make", "arg"), BAD_ARGS)
def test_bad_constructor_arguments(make, arg: str) -> None:
    with pytest.raises(ValueError, match=rf"^{arg}: expected"):
        make()


def test_accepted_boundaries_and_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert SampleToInsertRatio(1.0, 1, 1.0).max_diff == 2.0  # window 2 == 2 * max(1, 1)
    assert SampleToInsertRatio(2.0, 1, 2.0).min_diff == 0.0  # window 4 == 2 * 2
    assert SampleToInsertRatio(2.0, 10, (20.0, 24.0)).min_diff == 20.0  # min_diff == offset
    assert SampleToInsertRatio(np.float64(2.0), np.int64(10), np.float32(4.0)).max_diff == 24.0
    assert RateLimiter(1.0, 1, -math.inf, math.inf).can_sample(10**9) is False
    with caplog.at_level(logging.WARNING):
        SampleToInsertRatio(2.0, 10, (0.0, 19.0))  # max_diff 19 < offset 20: allowed, with a warning
    assert "max_diff=19.0" in caplog.text


def test_counter_arguments() -> None:
    lim = RateLimiter(1.0, 1, 0.0, 1.0)
    for bad in (0, -1, 1.0, True):
        with pytest.raises(ValueError, match=r"^n: expected"):
            lim.can_insert(bad)
        with pytest.raises(ValueError, match=r"^n: expected"):
            lim.can_sample(bad)
    with pytest.raises(ValueError, match=r"^n: expected"):
        lim.insert(-1)
    lim.insert(0)
    lim.delete(0)
    lim.insert(np.int64(2))
    assert lim.can_insert(np.int64(1)) is False
    with pytest.raises(ValueError, match=r"^n: expected at most 2"):
        lim.delete(3)
    lim.delete(2)
    assert (lim.inserts, lim.samples, lim.deletes) == (2, 0, 2)
    with pytest.raises(AttributeError):
        lim.inserts = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        lim.samples_per_insert = 2.0  # type: ignore[misc]


# --------------------------------------------------------------------------- deadlock rules
DEADLOCKS = [
    # rule 1: the table never holds min_size_to_sample items
    (lambda: MinSize(5), 4, None, "min_size_to_sample=5 exceeds max_size=4"),
    (lambda: SampleToInsertRatio(1.0, 11, 5.0), 10, 3, "min_size_to_sample=11 exceeds max_size=10"),
    # rule 2: Queue/Stack need max_times_sampled=1 and size <= max_size
    (lambda: Queue(3), 3, None, "needs max_times_sampled=1"),
    (lambda: Stack(3), 3, 2, "needs max_times_sampled=1"),
    (lambda: Queue(4), 3, 1, "never sampled"),
    (lambda: Stack(4), 3, 1, "never sampled"),
    # rule 3: more samples per insert than an item can give
    (lambda: SampleToInsertRatio(2.0, 10, 4.0), 100, 1, "exceeds max_times_sampled=1"),
    (lambda: SampleToInsertRatio(2.5, 1, 5.0), 100, 2, "exceeds max_times_sampled=2"),
    # rule 4: the forced run of a narrow window reaches a diff refusing both operations
    (lambda: RateLimiter(1.5, 1, 0.0, 1.9), 10, None, r"e\.g\. 0\.5,"),  # 1.5 -> 0.5 in (0.4, 1)
    (lambda: RateLimiter(1.0, 1, 0.5, 1.2), 10, None, r"e\.g\. 1\.0,"),  # stuck right after 1 insert
    (lambda: RateLimiter(1.0, 1, 5.0, 5.5), 10, None, r"e\.g\. 5\.0,"),  # inserts 1..5, then stuck
    (lambda: RateLimiter(1.0, 1, 0.0, 0.5), 10, None, r"e\.g\. 0\.0,"),  # sample 1 -> 0, stuck
    (lambda: RateLimiter(1.0, 1, 0.0, 0.5), 10, 2, r"e\.g\. 0\.0,"),  # the same with 2 samples per item
    (lambda: RateLimiter(0.5, 3, 0.0, 0.9), 10, None, r"e\.g\. 0\.5,"),  # 3 free inserts: 1.5 -> 0.5
    (lambda: RateLimiter(2.5, 1, 0.0, 2.9), 10, None, r"e\.g\. 0\.5,"),  # 2.5 -> 1.5 -> 0.5
]


@pytest.mark.parametrize(("make", "max_size", "mts", "message"), DEADLOCKS)
def test_deadlock_rules(make, max_size: int, mts: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make().check_deadlock_free(max_size, mts)


FREE = [
    (lambda: MinSize(5), 5, None),
    (lambda: MinSize(1), 1, 1),
    (lambda: SampleToInsertRatio(2.0, 10, 4.0), 100, 2),  # spi == max_times_sampled
    (lambda: SampleToInsertRatio(2.0, 10, 4.0), 10, None),
    (lambda: SampleToInsertRatio(1.0, 1, 1.0), 1, None),  # window 2 == spi + 1: no gap
    (lambda: Queue(1), 1, 1),  # gap (0, 1) holds no integer diff
    (lambda: Queue(3), 5, 1),
    (lambda: Stack(5), 5, 1),
    (lambda: RateLimiter(1.5, 1, 0.0, 2.0), 10, None),  # gap (0.5, 1) holds no multiple of 0.5
    (lambda: RateLimiter(1.5, 1, 0.0, 2.4), 10, None),  # gap (0.9, 1) likewise
    (lambda: RateLimiter(2.0, 1, 0.0, 3.0), 10, None),  # window == spi + 1
    (lambda: RateLimiter(0.25, 2, -1.0, 0.5), 10, None),  # window 1.5 >= 1.25
    (lambda: RateLimiter(0.5, 3, 0.0, 1.0), 10, None),  # gap (0.5, 1) holds no multiple of 0.5
    (lambda: RateLimiter(2.5, 1, 0.0, 3.0), 10, None),  # 2.5 -> 1.5 -> 0.5 -> 3.0 -> ... misses (0.5, 1)
]


@pytest.mark.parametrize(("make", "max_size", "mts"), FREE)
def test_deadlock_free(make, max_size: int, mts: int | None) -> None:
    make().check_deadlock_free(max_size, mts)


def test_deadlock_check_arguments() -> None:
    with pytest.raises(ValueError, match=r"^max_size: expected"):
        MinSize(1).check_deadlock_free(0, None)
    with pytest.raises(ValueError, match=r"^max_times_sampled: expected"):
        MinSize(1).check_deadlock_free(10, 0)


def simulate(limiter: RateLimiter, max_size: int, mts: int | None, steps: int, rng: random.Random) -> bool:
    """Drive a model table at random; True if some state admits neither insert(1) nor sample(1)."""
    counts: list[int] = []  # times sampled, per item
    for _ in range(steps):
        can_insert, can_sample = limiter.can_insert(1), limiter.can_sample(1)
        if not can_insert and not can_sample:
            return True
        if can_insert and (not can_sample or rng.random() < 0.5):
            if len(counts) == max_size:  # evicted after admission, as the table does
                counts.pop(rng.randrange(len(counts)))
                limiter.delete()
            counts.append(0)
            limiter.insert()
        else:
            i = rng.randrange(len(counts))
            counts[i] += 1
            limiter.sample()
            if counts[i] == mts:
                counts.pop(i)
                limiter.delete()
    return False


quarters = st.integers(1, 12).map(lambda k: k / 4)


@settings(max_examples=300, deadline=None)
@given(spi=quarters, lo=st.integers(-16, 16), width=st.integers(0, 16), m=st.integers(1, 4),
       extra=st.integers(0, 4), seed=st.integers(0, 2**32))
def test_window_rule_is_exact_without_sample_limit(spi: float, lo: int, width: int, m: int, extra: int,
                                                   seed: int) -> None:
    make = lambda: RateLimiter(spi, m, lo / 4, (lo + width) / 4)  # noqa: E731
    try:
        make().check_deadlock_free(m + extra, None)
        predicted = False
    except ValueError:
        predicted = True
    assert simulate(make(), m + extra, None, 600, random.Random(seed)) is predicted


@settings(max_examples=300, deadline=None)
@given(spi=quarters, lo=st.integers(-16, 16), width=st.integers(0, 16), m=st.integers(1, 4),
       extra=st.integers(0, 4), mts=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_passing_limiters_never_stall(spi: float, lo: int, width: int, m: int, extra: int, mts: int,
                                      seed: int) -> None:
    make = lambda: RateLimiter(spi, m, lo / 4, (lo + width) / 4)  # noqa: E731
    try:
        make().check_deadlock_free(m + extra, mts)
    except ValueError:
        return
    assert not simulate(make(), m + extra, mts, 600, random.Random(seed))


# --------------------------------------------------------------------------- state
def test_state_dict_round_trip() -> None:
    for make in (lambda: MinSize(3), lambda: SampleToInsertRatio(2.0, 10, 4.0), lambda: Queue(4),
                 lambda: RateLimiter(0.1, 2, -1.0, 0.3)):
        lim = at(make(), 12, 5, 3)
        state = lim.state_dict()
        assert set(state) == {"samples_per_insert", "min_size_to_sample", "min_diff", "max_diff",
                              "inserts", "samples", "deletes"}
        assert all(type(v) in (int, float) for v in state.values())
        restored = make()
        restored.load_state_dict(json.loads(json.dumps(state)))
        assert restored.state_dict() == state
        assert (restored.inserts, restored.samples, restored.deletes) == (12, 5, 3)
        for n in range(1, 30):
            assert restored.can_insert(n) is lim.can_insert(n)
            assert restored.can_sample(n) is lim.can_sample(n)


def test_load_state_dict_errors() -> None:
    state = at(SampleToInsertRatio(2.0, 10, 4.0), 12, 5, 3).state_dict()
    with pytest.raises(ValueError, match=r"state\['min_diff'\]: expected 15.0"):
        SampleToInsertRatio(2.0, 10, 5.0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state\['min_size_to_sample'\]"):
        SampleToInsertRatio(2.0, 9, (16.0, 24.0)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"missing \['deletes'\]"):
        SampleToInsertRatio(2.0, 10, 4.0).load_state_dict({k: v for k, v in state.items() if k != "deletes"})
    with pytest.raises(ValueError, match=r"state\['deletes'\]: expected at most inserts=12"):
        SampleToInsertRatio(2.0, 10, 4.0).load_state_dict({**state, "deletes": 13})
    with pytest.raises(ValueError, match=r"state\['samples'\]: expected an integer >= 0"):
        SampleToInsertRatio(2.0, 10, 4.0).load_state_dict({**state, "samples": -1})
    lim = SampleToInsertRatio(2.0, 10, 4.0)
    with pytest.raises(ValueError):
        lim.load_state_dict({**state, "inserts": 2.5})
    assert (lim.inserts, lim.samples, lim.deletes) == (0, 0, 0)  # untouched by a failed load


def test_repr() -> None:
    text = repr(at(Queue(3), 2, 1, 1))
    assert text == ("Queue(samples_per_insert=1.0, min_size_to_sample=1, min_diff=0.0, max_diff=3.0, "
                    "inserts=2, samples=1, deletes=1)")


def test_unbounded_sides_print_as_no_bound() -> None:
    """MinSize's diff bounds (+-float_max) and infinite ones print as "no bound" in the repr, in a table's
    timeout error and in every message that names a bound, never as +-1.8e308."""
    from rlflow.replay import RateLimitTimeout, RowTable, StepStore
    from rlflow.specs import Field

    assert repr(at(MinSize(2), 1, 0, 0)) == ("MinSize(samples_per_insert=1.0, min_size_to_sample=2, min_diff=no bound, "
                                             "max_diff=no bound, inserts=1, samples=0, deletes=0)")
    assert "min_diff=no bound, max_diff=4.0" in repr(RateLimiter(1.0, 1, -math.inf, 4.0))
    table = RowTable(StepStore({"x": Field((), np.float32)}, capacity=4), rate_limiter=MinSize(1))
    with pytest.raises(RateLimitTimeout) as timeout:
        table.sample(1, timeout=0)
    errors = [str(timeout.value)]
    for call in (lambda: MinSize(1).load_state_dict({**MinSize(1).state_dict(), "max_diff": 1.0}),
                 lambda: RateLimiter(1.0, 1, -FMAX, -math.inf),
                 lambda: SampleToInsertRatio(1.0, 1, (-math.inf, -math.inf))):
        with pytest.raises(ValueError) as error:
            call()
        errors.append(str(error.value))
    for text in errors:
        assert "e+308" not in text and "no bound" in text, text


# --------------------------------------------------------------------------- reference
def reference(spi: float, m: int, min_diff: float, max_diff: float, inserts: int, samples: int, deletes: int,
              n: int) -> tuple[bool, bool]:
    """Straight from Reverb's semantics: size gate first, then the diff in float64."""
    size = inserts - deletes
    if size + n <= m:
        insert_ok = True
    else:
        after = float(inserts + n) * spi
        insert_ok = after - float(samples) <= max_diff
    if size < m:
        sample_ok = False
    else:
        left = float(inserts) * spi - float(samples)
        sample_ok = left - float(n) >= min_diff
    return insert_ok, sample_ok


@settings(max_examples=500, deadline=None)
@given(spi=st.floats(1e-3, 50.0), m=st.integers(1, 10**4), lo=st.floats(-1e6, 1e6), width=st.floats(0.0, 1e6),
       inserts=st.integers(0, 10**7), samples=st.integers(0, 10**8), dfrac=st.floats(0.0, 1.0),
       n=st.integers(1, 10**4))
def test_matches_reference(spi: float, m: int, lo: float, width: float, inserts: int, samples: int,
                           dfrac: float, n: int) -> None:
    hi = lo + width
    deletes = int(inserts * dfrac)
    lim = RateLimiter(spi, m, lo, hi)
    lim.load_state_dict({**lim.state_dict(), "inserts": inserts, "samples": samples, "deletes": deletes})
    expected = reference(spi, m, lo, hi, inserts, samples, deletes, n)
    assert (lim.can_insert(n), lim.can_sample(n)) == expected


@settings(max_examples=200, deadline=None)
@given(spi=st.floats(0.1, 8.0), m=st.integers(1, 50), buffer=st.floats(16.0, 100.0),
       inserts=st.integers(0, 2000), samples=st.integers(0, 8000), n=st.integers(1, 40))
def test_ratio_preset_matches_reference(spi: float, m: int, buffer: float, inserts: int, samples: int,
                                        n: int) -> None:
    lim = at(SampleToInsertRatio(spi, m, buffer), inserts, samples, 0)
    offset = spi * m
    expected = reference(spi, m, offset - buffer, offset + buffer, inserts, samples, 0, n)
    assert (lim.can_insert(n), lim.can_sample(n)) == expected


def _transition_store(capacity: int, lanes: int, stack: int):
    from rlflow import specs
    from rlflow.replay import StepStore
    from rlflow.types import step_spec

    obs = specs.Field((stack, 2), np.uint8, stack=stack) if stack > 1 else specs.Field((2,), np.uint8)
    return StepStore(step_spec(obs, specs.Field((), np.int64)), capacity=capacity, lanes=lanes)


@pytest.mark.parametrize(("capacity", "lanes", "n", "stack", "most"), [
    (50, 1, 1, 1, 49), (50, 2, 3, 1, 94), (50, 1, 1, 4, 46), (50, 2, 3, 4, 88)])
def test_an_adder_refuses_a_min_size_its_store_can_never_hold(capacity, lanes, n, stack, most) -> None:
    """n-step transition items keep their n later rows and the rows their frame stacks read: a lane of C rows
    holds at most C - n - (stack - 1) items at once (the hand-counted ``most``; the run below reaches it). A
    limiter waiting for more is refused when the adder is made, naming the capacity that would do, and the
    table is left as it was: an adder with a reachable size then takes it."""
    from rlflow import adders
    from rlflow.replay import Table, Uniform
    from rlflow.types import TimeStep

    store = _transition_store(capacity, lanes, stack)
    table = Table(store, sampler=Uniform(seed=0), rate_limiter=MinSize(most + 1))
    kept = n + stack - 1
    rows = -(-(most + 1) // lanes) + kept
    with pytest.raises(ValueError, match=rf"holds {most + 1} items .* at most {most} at once: each keeps {kept} "
                                         rf"more rows .* at least {rows} rows a lane"):
        adders.NStepTransition(store, [table], n=n, discount=0.9)
    assert table.item_spec is None and table.size == 0
    table = Table(store, sampler=Uniform(seed=0), rate_limiter=MinSize(most))
    adder = adders.NStepTransition(store, [table], n=n, discount=0.9)
    no = np.zeros(lanes, bool)

    def obs(t):
        frames = [np.full((lanes, 2), max(0, t - (stack - 1 - j)), np.uint8) for j in range(stack)]
        return np.stack(frames, 1) if stack > 1 else frames[0]

    adder.add_first(TimeStep(obs(0), np.zeros(lanes, np.float32), no, no, ~no, no))
    for t in range(1, 3 * capacity):  # one long episode a lane: the most items a ring holds
        adder.stage(np.zeros(lanes, np.int64), TimeStep(obs(t), np.zeros(lanes, np.float32), no, no, no, no))
    assert table.size == most and table.rate_limiter.can_sample(1)


def test_a_table_whose_store_overwrites_items_before_its_first_sample_warns_once() -> None:
    """Episodes of 3 actions take 4 rows each: 40 rows a lane hold 30 transitions, never the 39 a limiter may
    wait for (the adder cannot know episode lengths). The first overwrite says so, once."""
    import warnings

    from rlflow import adders
    from rlflow.replay import Table, Uniform
    from rlflow.types import TimeStep

    store = _transition_store(40, 1, 1)
    table = Table(store, sampler=Uniform(seed=0), rate_limiter=MinSize(39), name="replay")
    adder = adders.NStepTransition(store, [table], n=1, discount=0.9)
    yes, no = np.ones(1, bool), np.zeros(1, bool)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adder.add_first(TimeStep(np.zeros((1, 2), np.uint8), np.zeros(1, np.float32), no, no, yes, no))
        for t in range(1, 200):
            end = t % 3 == 0
            obs = np.full((1, 2), t, np.uint8)
            ts = TimeStep(obs, np.zeros(1, np.float32), yes if end else no, no, no, yes if end else no,
                          obs if end else None)
            adder.stage(np.zeros(1, np.int64), ts)
            if end:
                adder.add_first(TimeStep(np.zeros((1, 2), np.uint8), np.zeros(1, np.float32), no, no, yes, no))
    assert table.size < 39 and not table.rate_limiter.can_sample(1)
    mine = [w for w in caught if "samples may never start" in str(w.message)]
    assert len(mine) == 1
    assert "table 'replay'" in str(mine[0].message) and "min_size_to_sample" in str(mine[0].message)
