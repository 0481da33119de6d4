"""Adders against the slow reference (tests/adder_reference.py), hand-computed cases, and bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from adder_reference import ACT, OBS, SPEC, Stream, alive, episode_items, nstep_items, sequence_items
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlflow import adders, specs
from rlflow.replay import Fifo, Prioritized, RowTable, StepStore, Table, Uniform
from rlflow.replay.items import LANE, LENGTH, START, VALID
from rlflow.specs import SpecError
from rlflow.types import ONE_LANE_NO, ONE_LANE_YES, TimeStep, step_spec

G = 0.9


def make_table(store, rows, cross_episodes=False):
    """A RowTable (``rows``) or a uniform Table with room for every item the tests write."""
    if rows:
        return RowTable(store, seed=0, cross_episodes=cross_episodes)
    return Table(store, sampler=Uniform(seed=0), remover=Fifo(), max_size=10 * store.capacity * store.num_lanes,
                 cross_episodes=cross_episodes)


def run_stream(adder_factory, *, lanes, capacity, steps, p_end, same_step, seed, cross_episodes=False,
               directory=None, rows=False):
    """Feed a reference stream of ``steps`` random steps through the adder ``adder_factory(store, table)`` makes,
    into a Table, or a RowTable if ``rows``."""
    store = StepStore(SPEC, capacity=capacity, lanes=lanes, **({} if directory is None else
                                                               {"backend": "disk", "directory": directory}))
    table = make_table(store, rows, cross_episodes)
    adder = adder_factory(store, table)
    stream = Stream(lanes, np.random.default_rng(seed), same_step)
    adder.add_first(stream.reset())
    for _ in range(steps):
        actions, ts, extras = stream.step(stream.random_events(p_end))
        adder.add(actions, ts, extras)
    return store, table, stream


def check_rows(store, stream):
    """Every stored row equals the reference row at the same absolute index."""
    for e, lane in enumerate(stream.lanes):
        lo = max(0, len(lane.rows) - store.capacity)
        assert int(store.count[e]) == len(lane.rows)
        idx = np.arange(lo, len(lane.rows))
        got = store.gather(np.full(idx.size, e), idx)
        for j, i in enumerate(idx):
            ref = lane.rows[i]
            assert tuple(got["observation"][j]) == ref.obs
            assert bool(got["first"][j]) == ref.first and bool(got["last"][j]) == ref.last
            if ref.complete:
                assert got["action"][j] == ref.action and got["reward"][j] == np.float32(ref.reward)
                assert "extras/v" not in got or got["extras/v"][j] == np.float32(ref.v)
                assert bool(got["terminated"][j]) == ref.terminated and bool(got["truncated"][j]) == ref.truncated


def live_meta(table):
    items = table.items()
    meta = np.zeros((items["key"].size, 6), np.int64)
    meta[:, LANE], meta[:, START], meta[:, LENGTH], meta[:, VALID] = (
        items["lane"], items["start"], items["length"], items["valid"])
    return items, meta


streams = st.fixed_dictionaries({
    "lanes": st.integers(1, 3), "steps": st.integers(0, 40), "p_end": st.sampled_from([0.05, 0.2, 0.5]),
    "same_step": st.booleans(), "seed": st.integers(0, 2**16), "slack": st.integers(1, 12)})


@settings(max_examples=60, deadline=None)
@given(streams, st.integers(1, 5), st.booleans())
def test_nstep_matches_reference(cfg, n, rows):
    capacity = n + 1 + cfg.pop("slack")
    store, table, stream = run_stream(lambda s, t: adders.NStepTransition(s, [t], n=n, discount=G),
                                      capacity=capacity, rows=rows, **cfg)
    check_rows(store, stream)
    check_nstep_items(store, table, stream, n, capacity)


def check_nstep_items(store, table, stream, n: int, capacity: int) -> None:
    """The table holds exactly the reference's n-step items whose rows are still stored, each as the reference
    has it (length, return, discount, observations, action, extras)."""
    items, meta = live_meta(table)
    got = {(int(lane), int(s)): i for i, (lane, s) in enumerate(zip(items["lane"], items["start"], strict=True))}
    want = {}
    for e, lane in enumerate(stream.lanes):
        for s, item in nstep_items(lane, n, G).items():
            if alive(lane, s, capacity):
                want[(e, s)] = item
    assert set(got) == set(want)
    batch, _ = table.view.gather(store, meta, {"return": items["field/return"], "discount": items["field/discount"]})
    for (e, s), i in got.items():
        length, ret, disc = want[(e, s)]
        rows = stream.lanes[e].rows
        assert items["length"][i] == length
        np.testing.assert_allclose(batch.reward[i], ret, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(batch.discount[i], disc, rtol=1e-6)
        assert tuple(batch.observation[i]) == rows[s].obs
        assert tuple(batch.next_observation[i]) == rows[s + length - 1].obs
        assert batch.action[i] == rows[s].action
        assert batch.extras is None or batch.extras["v"][i] == np.float32(rows[s].v)


@settings(max_examples=80, deadline=None)
@given(streams, st.integers(1, 5), st.integers(1, 6), st.sampled_from(["write", "zero_pad", "truncate", "continue"]),
       st.booleans())
def test_sequence_matches_reference(cfg, length, period, behavior, rows):
    capacity = length + 1 + cfg.pop("slack")
    store, table, stream = run_stream(
        lambda s, t: adders.Sequence(s, [t], length=length, period=period, end_behavior=behavior),
        capacity=capacity, cross_episodes=behavior == "continue", rows=rows, **cfg)
    check_rows(store, stream)
    items, meta = live_meta(table)
    got = {(int(lane), int(s)): int(n) for lane, s, n in zip(items["lane"], items["start"], items["length"],
                                                             strict=True)}
    want = {(e, s): n for e, lane in enumerate(stream.lanes)
            for s, n in sequence_items(lane, length, period, behavior).items() if alive(lane, s, capacity)}
    assert got == want
    data, mask = table.view.gather(store, meta, {})
    assert data["observation"].shape == (len(got), length, 2)
    for i, (e, s) in enumerate(zip(items["lane"], items["start"], strict=True)):
        rows = stream.lanes[e].rows
        n_rows = items["length"][i]
        np.testing.assert_array_equal(mask[i], np.arange(length) < n_rows)
        for j in range(n_rows):
            assert tuple(data["observation"][i, j]) == rows[s + j].obs
        assert not data["observation"][i, n_rows:].any()  # padding is zero


def reference_columns(rows) -> dict[str, np.ndarray]:
    """The columns (named as ``specs.flatten_spec(SPEC)`` names them) that the reference ``rows`` should give."""
    return {"observation": np.array([r.obs for r in rows], np.float32).reshape(len(rows), 2),
            "action": np.array([r.action for r in rows], np.int64),
            "reward": np.array([r.reward for r in rows], np.float32),
            "terminated": np.array([r.terminated for r in rows], bool),
            "truncated": np.array([r.truncated for r in rows], bool),
            "first": np.array([r.first for r in rows], bool),
            "last": np.array([r.last for r in rows], bool),
            "extras/v": np.array([r.v for r in rows], np.float32)}


def assert_rows(columns: dict, rows, what: str = "") -> None:
    """``columns`` (flat, each ``[len(rows), ...]``) are exactly the reference ``rows``: every column, every row."""
    want = reference_columns(rows)
    assert set(columns) == set(want), what
    for k, v in want.items():
        got = np.asarray(columns[k])
        assert got.shape == v.shape and got.dtype == v.dtype, (what, k, got.shape, got.dtype, v.shape)
        np.testing.assert_array_equal(got, v, err_msg=f"{what} {k}")


def run_episode_stream(*, lanes, capacity, steps, p_end, same_step, seed, max_length, ragged, check, rows=False):
    """``run_stream`` for the Episode adder: episodes end by their ``max_length`` rows; ``check`` after each step."""
    store = StepStore(SPEC, capacity=capacity, lanes=lanes)
    table = make_table(store, rows)
    adder = adders.Episode(store, [table], max_length=max_length, ragged=ragged)
    stream = Stream(lanes, np.random.default_rng(seed), same_step)
    adder.add_first(stream.reset())
    for _ in range(steps):
        events = stream.random_events(p_end)
        for e, lane in enumerate(stream.lanes):  # a step that would give max_length rows must end the episode
            if lane.open >= 0 and lane.open - lane.start + 2 >= max_length and events[e] == "mid":
                events[e] = ("term", "trunc")[lane.open % 2]
        adder.add(*stream.step(events))
        check(store, table, stream)


def check_episodes(store, table, stream, max_length: int, ragged: bool) -> None:
    """The table holds exactly the reference's live episodes, and gathers each one's rows, every column."""
    check_rows(store, stream)
    items, meta = live_meta(table)
    got = {(int(lane), int(s)): int(n) for lane, s, n in zip(items["lane"], items["start"], items["length"],
                                                             strict=True)}
    want = {(e, s): n for e, lane in enumerate(stream.lanes) for s, n in episode_items(lane).items()
            if alive(lane, s, store.capacity)}  # an episode whose first row was overwritten is gone, whole
    assert got == want
    data, mask = table.view.gather(store, meta, {})
    if ragged:
        assert mask is None and isinstance(data, list) and len(data) == len(got)
    else:
        data = specs.flatten_data(SPEC, data)
        assert mask.shape == (len(got), max_length) and data["observation"].shape == (len(got), max_length, 2)
    for i, (e, s, n) in enumerate(zip(items["lane"], items["start"], items["length"], strict=True)):
        rows = stream.lanes[e].rows[s:s + n]
        assert rows[0].first and rows[-1].last and not any(r.last for r in rows[:-1])
        if ragged:
            assert_rows(specs.flatten_data(SPEC, data[i]), rows, f"episode ({e}, {s})")
        else:
            np.testing.assert_array_equal(mask[i], np.arange(max_length) < n)
            assert_rows({k: v[i, :n] for k, v in data.items()}, rows, f"episode ({e}, {s})")
            for k, v in data.items():
                assert not v[i, n:].any(), f"padding of {k} is not zero"


WRAPS = {"lanes": 2, "steps": 40, "p_end": 0.2, "same_step": False, "seed": 1, "slack": 1}  # rings of max_length + 1


@settings(max_examples=50, deadline=None)
@given(streams, st.integers(2, 8), st.booleans(), st.booleans())
@example(WRAPS, 5, True, False)
@example(WRAPS, 6, False, True)
def test_episode_matches_reference(cfg, max_length, ragged, rows):
    """After every step: the live episode items and every row they gather, against the reference.

    Rings of ``max_length + slack`` rows (``slack >= 1``: Episode needs ``max_length + 1``) wrap, so episodes
    straddle the ring's end and whole episodes are evicted when their first row is overwritten.
    """
    cfg = dict(cfg)
    capacity = max_length + cfg.pop("slack")
    run_episode_stream(capacity=capacity, max_length=max_length, ragged=ragged, rows=rows, **cfg,
                       check=lambda store, table, stream: check_episodes(store, table, stream, max_length, ragged))


# Two lanes of episodes of known lengths (actions) and ends; max_length = 8 rows fits the longest (7 actions).
EPISODE_PLANS = ([(3, "term"), (5, "trunc"), (1, "term"), (7, "trunc"), (2, "term"), (6, "trunc")],
                 [(6, "trunc"), (2, "term"), (1, "trunc"), (7, "term"), (3, "trunc"), (5, "term")])


@pytest.mark.parametrize("same_step", [True, False])
def test_ragged_episodes_are_exactly_the_episode_rows_and_padded_ones_agree(same_step):
    """Sampled ragged episodes are each one episode's rows, [T + 1, ...]; padded ones hold the same under the mask.

    Two stores are fed the same stream, one adder ragged and one padded; the rings (9 rows per lane, the least
    Episode takes) wrap, so episodes straddle the ring's end and old ones are evicted.
    """
    max_length, capacity, batch = 8, 9, 16
    stores = [StepStore(SPEC, capacity=capacity, lanes=2) for _ in range(2)]
    tables = [Table(s, sampler=Uniform(seed=i), remover=Fifo()) for i, s in enumerate(stores)]
    adder_list = [adders.Episode(s, [t], max_length=max_length, ragged=r)
                  for s, t, r in zip(stores, tables, (True, False), strict=True)]
    stream = Stream(2, np.random.default_rng(3), same_step)
    queues = [[kind if t == length - 1 else "mid" for length, kind in plan for t in range(length)]
              for plan in EPISODE_PLANS]
    ts = stream.reset()
    for adder in adder_list:
        adder.add_first(ts)
    sampled = [set(), set()]
    while any(queues):
        events = ["mid" if lane.waiting_reset else queues[e].pop(0) for e, lane in enumerate(stream.lanes)]
        step = stream.step(events)
        for adder in adder_list:
            adder.add(*step)
        if not tables[0].size:
            continue
        for which, table in enumerate(tables):
            sample = table.sample(batch)
            if which == 0:
                assert sample.mask is None and isinstance(sample.data, list) and len(sample.data) == batch
            else:
                data = specs.flatten_data(SPEC, sample.data)
                assert sample.mask.shape == (batch, max_length)
            for b in range(batch):
                e, s, n = int(sample.lanes[b]), int(sample.starts[b]), int(sample.lengths[b])
                lane = stream.lanes[e]
                ends = {start: final for start, final, _, _ in lane.episodes}
                assert s in ends and n == ends[s] - s + 1, (e, s, n)  # a whole, finished episode
                rows = lane.rows[s:ends[s] + 1]
                if which == 0:
                    assert_rows(specs.flatten_data(SPEC, sample.data[b]), rows, f"ragged ({e}, {s})")
                else:
                    np.testing.assert_array_equal(sample.mask[b], np.arange(max_length) < n)
                    assert_rows({k: v[b, :n] for k, v in data.items()}, rows, f"padded ({e}, {s})")
                    assert not any(v[b, n:].any() for v in data.values())  # zero padding
                sampled[which].add((e, s))
        # every live item of both tables, side by side: the padded rows under the mask are the ragged episode
        (i0, m0), (i1, m1) = (live_meta(t) for t in tables)
        for k in ("lane", "start", "length"):
            np.testing.assert_array_equal(i0[k], i1[k])
        ragged, _ = tables[0].view.gather(stores[0], m0, {})
        padded, mask = tables[1].view.gather(stores[1], m1, {})
        padded = specs.flatten_data(SPEC, padded)
        for i, episode in enumerate(ragged):
            episode = specs.flatten_data(SPEC, episode)
            for k, v in episode.items():
                np.testing.assert_array_equal(padded[k][i][mask[i]], v, err_msg=k)
    # the stream was the plan: lengths and ends, lane by lane; every episode was sampled from both tables
    for e, plan in enumerate(EPISODE_PLANS):
        assert [(f - s, term) for s, f, term, _ in stream.lanes[e].episodes] == [(n, k == "term") for n, k in plan]
    everyone = {(e, s) for e, lane in enumerate(stream.lanes) for s, *_ in lane.episodes}
    assert len(everyone) == 12 and sampled[0] == sampled[1] == everyone
    # the rings wrapped: episodes straddled the ring's end, the earliest are evicted, whole; the rest are live
    final = {(e, s): f for e, lane in enumerate(stream.lanes) for s, f, _, _ in lane.episodes}
    assert sum(s % capacity + f - s + 1 > capacity for (_, s), f in final.items()) == 6
    live = {(int(e), int(s)) for e, s in zip(tables[0].items()["lane"], tables[0].items()["start"], strict=True)}
    assert live == {(e, s) for e, s in everyone if alive(stream.lanes[e], s, capacity)} and len(live) < 12




@settings(max_examples=40, deadline=None)
@given(streams, st.sampled_from(["nstep1", "nstep5", "seq31", "seq42", "seq_write", "episode"]))
def test_one_add_writes_at_most_max_items_per_step_per_lane(cfg, kind):
    """What the loop relies on to admit an env step's inserts before it takes it."""
    cfg.pop("slack")
    make = {"nstep1": lambda s, t: adders.NStepTransition(s, [t], n=1),
            "nstep5": lambda s, t: adders.NStepTransition(s, [t], n=5),
            "seq31": lambda s, t: adders.Sequence(s, [t], length=3, period=1),
            "seq42": lambda s, t: adders.Sequence(s, [t], length=4, period=2, end_behavior="truncate"),
            "seq_write": lambda s, t: adders.Sequence(s, [t], length=2, period=1, end_behavior="write"),
            "episode": lambda s, t: adders.Episode(s, [t], max_length=60)}[kind]
    store = StepStore(SPEC, capacity=64, lanes=cfg["lanes"])
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo(), max_size=64 * 64)
    adder = make(store, table)
    stream = Stream(cfg["lanes"], np.random.default_rng(cfg["seed"]), cfg["same_step"])
    adder.add_first(stream.reset())
    for _ in range(cfg["steps"]):
        before = table.items()
        actions, ts, extras = stream.step(stream.random_events(cfg["p_end"]))
        adder.add(actions, ts, extras)
        after = table.items()
        new = np.setdiff1d(after["key"], before["key"])
        lanes = after["lane"][np.isin(after["key"], new)]
        assert np.bincount(lanes, minlength=cfg["lanes"]).max(initial=0) <= adder.max_items_per_step


def test_a_disk_store_receives_the_same_rows_and_items(tmp_path):
    """The compiled writes reach memmapped columns as they reach memory ones (a stream that wraps the ring)."""
    cfg = {"lanes": 3, "capacity": 12, "steps": 60, "p_end": 0.2, "same_step": False, "seed": 7}
    make = lambda s, t: adders.NStepTransition(s, [t], n=3, discount=G)  # noqa: E731
    memory, t1, _ = run_stream(make, **cfg)
    disk, t2, stream = run_stream(make, **cfg, directory=tmp_path / "store")
    check_rows(disk, stream)
    for k, v in memory.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(disk.state_dict()[k]), err_msg=k)
    i1, i2 = t1.items(), t2.items()
    for k in i1:
        np.testing.assert_array_equal(i1[k], i2[k], err_msg=k)


# --------------------------------------------------------------------------- hand-computed cases
def one_lane(n=3, discount=G, capacity=32):
    spec = step_spec(specs.Field((), np.float32), specs.Field((), np.int64))
    store = StepStore(spec, capacity=capacity)
    table = Table(store, sampler=Fifo(), remover=Fifo())
    return store, table, adders.NStepTransition(store, [table], n=n, discount=discount)


def ts(obs, reward=0.0, *, first=False, term=False, trunc=False, final=None):
    b = lambda x: np.array([x])  # noqa: E731
    return TimeStep(np.array([obs], np.float32), np.array([reward], np.float32), b(term), b(trunc), b(first),
                    b(term or trunc), None if final is None else np.array([final], np.float32))


def play(adder, rewards, end):
    """Observations 0, 1, ...; rewards as given; the last step ends the episode by ``end``."""
    adder.add_first(ts(0.0, first=True))
    for t, r in enumerate(rewards):
        if t < len(rewards) - 1:
            adder.add(np.array([t]), ts(t + 1.0, r))
        else:
            adder.add(np.array([t]), ts(99.0, r, first=True, term=end == "term", trunc=end == "trunc",
                                        final=t + 1.0))


def table_rows(table):
    it = table.items()
    return [(int(s), int(n), round(float(r), 6), round(float(d), 6))
            for s, n, r, d in zip(it["start"], it["length"], it["field/return"], it["field/discount"], strict=True)]


# A three-step example worked by hand, in rlflow's convention (discount = the full factor g^k of the
# window's k rewards, 0 on a terminal end): rewards 1, 2, 3, 4 (g = 0.9, n = 3).
@pytest.mark.parametrize("end,expected", [
    ("term", [(0, 4, 5.23, 0.729), (1, 4, 7.94, 0.0), (2, 3, 6.6, 0.0), (3, 2, 4.0, 0.0)]),
    ("trunc", [(0, 4, 5.23, 0.729), (1, 4, 7.94, 0.729), (2, 3, 6.6, 0.81), (3, 2, 4.0, 0.9)]),
])
def test_three_step_example(end, expected):
    _, table, adder = one_lane()
    play(adder, [1.0, 2.0, 3.0, 4.0], end)
    assert table_rows(table) == expected


# Acme's n-step transition cases (acme/adders/reverb/test_cases.py), in rlflow's convention. Acme's
# discount leaves out one factor of the agent's gamma and multiplies the env's per-step discounts by
# ``additional_discount``; rlflow has no per-step env discount, so its g is their product (0.5 * 0.4 =
# 0.2 in ThreeStepDiscounted), and its discount is the whole factor g^k. Acme also writes the short
# windows s0->s1 and s0->s2 at an episode's start; rlflow writes one item per action, so only the
# windows that start at each action remain.
@pytest.mark.parametrize("name,n,g,rewards,expected", [
    # Acme: (1 -> 4, 1.24, 0.0), (2 -> 4, 1.20, 0.0), (3 -> 4, 1.00, 0.0).
    ("ThreeStepDiscounted", 3, 0.2, [1.0, 1.0, 1.0], [(0, 4, 1.24, 0.0), (1, 3, 1.2, 0.0), (2, 2, 1.0, 0.0)]),
    # Acme: (1 -> 4, 2 + 0.5 * 3 + 0.25 * 5, 0.25), then 3 + 0.5 * 5 + 0.25 * 7, 5 + 0.5 * 7 and 7, each 0.0.
    ("ThreeStepVaryingReward", 3, 0.5, [2.0, 3.0, 5.0, 7.0],
     [(0, 4, 4.75, 0.125), (1, 4, 7.25, 0.0), (2, 3, 8.5, 0.0), (3, 2, 7.0, 0.0)]),
    # Acme: (1 -> 2, 1.0, 0.0).
    ("SingleTransitionEpisode", 4, 1.0, [1.0], [(0, 2, 1.0, 0.0)]),
    # Acme: (1 -> 3, 2.0, 0.0), (2 -> 3, 1.0, 0.0), after the short window 1 -> 2.
    ("EpisodeShorterThanN", 4, 1.0, [1.0, 1.0], [(0, 3, 2.0, 0.0), (1, 2, 1.0, 0.0)]),
])
def test_acme_nstep_cases(name, n, g, rewards, expected):
    _, table, adder = one_lane(n=n, discount=g)
    play(adder, rewards, "term")
    assert table_rows(table) == expected, name


def test_truncated_tail_is_not_discounted_by_a_fixed_power():
    """A truncated two-step tail with n = 3 bootstraps with g^2, not g^3 (the fixed-power mistake)."""
    _, table, adder = one_lane(n=3)
    play(adder, [1.0, 1.0], "trunc")
    assert table_rows(table) == [(0, 3, 1.9, 0.81), (1, 2, 1.0, 0.9)]


def test_every_start_is_sampled_including_the_last_n_minus_one():
    """Each action yields one item: the last n - 1 starts of an episode are not dropped."""
    _, table, adder = one_lane(n=3)
    play(adder, [1.0] * 5, "term")
    assert [r[0] for r in table_rows(table)] == [0, 1, 2, 3, 4]


def test_no_extra_short_windows_at_episode_start():
    _, table, adder = one_lane(n=3)
    adder.add_first(ts(0.0, first=True))
    adder.add(np.array([0]), ts(1.0, 1.0))
    adder.add(np.array([0]), ts(2.0, 1.0))
    assert table.size == 0  # no s0->s1, s0->s2 windows; the first item waits for s3
    adder.add(np.array([0]), ts(3.0, 1.0))
    assert table_rows(table) == [(0, 4, 2.71, 0.729)]


def test_final_observation_is_the_true_one_not_the_reset():
    store, table, adder = one_lane(n=1)
    play(adder, [1.0, 1.0], "trunc")
    items, meta = live_meta(table)
    batch, _ = table.view.gather(store, meta, {"return": items["field/return"], "discount": items["field/discount"]})
    assert batch.observation.tolist() == [0.0, 1.0]
    assert batch.next_observation.tolist() == [1.0, 2.0]  # the true final observation; 99 (the reset) never


def test_truncation_on_the_last_step_bootstraps():
    """Truncation on the very last step keeps a non-zero discount (the flexibuff-style mistake zeroes it)."""
    _, table, adder = one_lane(n=1)
    play(adder, [2.0], "trunc")
    assert table_rows(table) == [(0, 2, 2.0, 0.9)]


def test_next_step_reset_pseudo_step_is_not_a_transition():
    _, table, adder = one_lane(n=1)
    adder.add_first(ts(0.0, first=True))
    adder.add(np.array([0]), ts(1.0, 1.0, term=True, final=1.0))  # next-step: no restart yet
    adder.add(np.array([5]), ts(7.0, 0.0, first=True))  # the reset call: its action is ignored
    adder.add(np.array([1]), ts(8.0, 3.0))
    assert table_rows(table) == [(0, 2, 1.0, 0.0), (2, 2, 3.0, 0.9)]


def test_sequence_end_behaviours_acme_example():
    """L = 3, P = 2, an episode of six rows: the last sequence per behaviour (Acme's table)."""
    expected = {"write": (3, 3), "zero_pad": (4, 2), "truncate": (4, 2)}
    for behavior, last in expected.items():
        spec = step_spec(specs.Field((), np.float32), specs.Field((), np.int64))
        store = StepStore(spec, capacity=32)
        table = Table(store, sampler=Fifo(), remover=Fifo())
        adder = adders.Sequence(store, [table], length=3, period=2, end_behavior=behavior)
        play(adder, [1.0] * 5, "term")  # five actions: six rows
        it = table.items()
        assert list(zip(it["start"].tolist(), it["length"].tolist(), strict=True)) == [(0, 3), (2, 3), last]
    sample = table.sample(3)
    assert sample.data["observation"].shape == (3, 3) and sample.mask.shape == (3, 3)


@pytest.mark.parametrize("behavior,expected", [("write", []), ("zero_pad", [(0, 2)]), ("truncate", [(0, 2)])])
def test_an_episode_shorter_than_a_sequence(behavior, expected):
    """L = 3 and an episode of one action (two rows): "write" writes only full-length sequences (Acme drops
    the episode), the others one sequence of its two rows."""
    spec = step_spec(specs.Field((), np.float32), specs.Field((), np.int64))
    store = StepStore(spec, capacity=32)
    table = Table(store, sampler=Fifo(), remover=Fifo())
    adder = adders.Sequence(store, [table], length=3, period=2, end_behavior=behavior)
    play(adder, [1.0], "term")
    it = table.items()
    assert list(zip(it["start"].tolist(), it["length"].tolist(), strict=True)) == expected


# --------------------------------------------------------------------------- bad input
def snapshot(store, table):
    return {k: np.array(v, copy=True) for k, v in store.state_dict().items()}, table.items()


def assert_unchanged(before, store, table):
    state, items = before
    for k, v in store.state_dict().items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
    for k, v in table.items().items():
        np.testing.assert_array_equal(v, items[k], err_msg=k)


@pytest.mark.parametrize("bad,match", [
    (dict(actions=np.array([1.5])), "action"),  # a float action for an int64 column
    (dict(actions=np.array([9])), "<= 5"),  # out of the action space
    (dict(actions=np.array([1, 2])), "shape"),
    (dict(obs=np.array([[1.0, 2.0, 3.0]], np.float32)), "observation"),
    (dict(obs=np.array([[np.nan, 0.0]], np.float32)), "finite"),
    (dict(extras=None), "extras"),
    (dict(reward=np.array([np.inf], np.float32)), "finite"),
])
def test_bad_add_changes_nothing(bad, match):
    store = StepStore(SPEC, capacity=8)
    table = Table(store)
    adder = adders.NStepTransition(store, [table], n=2, discount=G)
    stream = Stream(1, np.random.default_rng(0), True)
    adder.add_first(stream.reset())
    for _ in range(9):  # wrap the ring once
        a, t, x = stream.step(["mid"])
        adder.add(a, t, x)
    before = snapshot(store, table)
    a, t, x = stream.step(["term"])
    if "actions" in bad:
        a = bad["actions"]
    if "obs" in bad:
        t.final_observation = bad["obs"]
    if "reward" in bad:
        t.reward = bad["reward"]
    if "extras" in bad:
        x = bad["extras"]
    with pytest.raises(SpecError, match=match):
        adder.add(a, t, x)
    assert_unchanged(before, store, table)


def test_add_before_add_first_and_inconsistent_flags():
    store = StepStore(SPEC, capacity=8)
    table = Table(store)
    adder = adders.NStepTransition(store, [table], n=1)
    stream = Stream(1, np.random.default_rng(0), True)
    reset = stream.reset()
    a, t, x = stream.step(["mid"])
    with pytest.raises(ValueError, match="add_first"):
        adder.add(a, t, x)
    assert int(store.count[0]) == 0
    adder.add_first(reset)
    with pytest.raises(ValueError, match="in progress"):
        adder.add_first(reset)
    t.first = np.array([True])  # a reset without the episode ending
    with pytest.raises(ValueError, match="reset"):
        adder.add(a, t, x)
    t.first, t.last = np.array([False]), np.array([True])  # last without terminated/truncated
    with pytest.raises(SpecError, match="last == terminated"):
        adder.add(a, t, x)
    assert int(store.count[0]) == 1 and table.size == 0


def test_episode_longer_than_max_length_raises_and_writes_nothing():
    store = StepStore(SPEC, capacity=16)
    table = Table(store)
    adder = adders.Episode(store, [table], max_length=4)
    stream = Stream(1, np.random.default_rng(0), True)
    adder.add_first(stream.reset())
    for _ in range(3):
        adder.add(*stream.step(["mid"]))
    before = snapshot(store, table)
    with pytest.raises(ValueError, match="max_length=4"):
        adder.add(*stream.step(["term"]))
    assert_unchanged(before, store, table)


def test_reset_abandons_the_episode():
    store = StepStore(SPEC, capacity=16)
    table = Table(store)
    adder = adders.Episode(store, [table], max_length=8)
    stream = Stream(1, np.random.default_rng(0), True)
    adder.add_first(stream.reset())
    adder.add(*stream.step(["mid"]))
    adder.reset()
    assert table.size == 0
    last = store.gather([0], [1])
    assert bool(last["last"][0]) and last["action"][0] == 0
    adder.add_first(Stream(1, np.random.default_rng(1), True).reset())
    assert int(store.count[0]) == 3


def test_one_table_one_item_kind():
    store = StepStore(SPEC, capacity=16)
    table = Table(store)
    adders.NStepTransition(store, [table], n=3)
    adders.NStepTransition(store, [table], n=3)  # the same items again: fine
    with pytest.raises(ValueError, match="holds transition items of n=3; this adder's have n=1"):
        adders.NStepTransition(store, [table], n=1)  # items of another n would mix in one table
    with pytest.raises(ValueError, match=r"discount=0\.99; this adder's have discount=0\.5"):
        adders.NStepTransition(store, [table], n=3, discount=0.5)
    with pytest.raises(ValueError, match="table of its own"):
        adders.Sequence(store, [table], length=4)
    with pytest.raises(ValueError, match="cross_episodes"):
        adders.Sequence(store, [Table(store)], length=4, end_behavior="continue")
    with pytest.raises(ValueError, match="capacity"):
        adders.Episode(store, [Table(store)], max_length=16)
    with pytest.raises(SpecError, match="step_spec"):
        s = StepStore({"obs": specs.Field((), np.float32)}, capacity=4)
        adders.NStepTransition(s, [Table(s)])


def test_truncate_closes_episodes_at_the_open_row():
    """truncate(): the open row becomes the final row; each adder writes what a truncated episode gives."""
    spec = step_spec(specs.Field((), np.float32), specs.Field((), np.int64))
    cases = {
        "nstep": (lambda s, t: adders.NStepTransition(s, [t], n=2, discount=G),
                  [(0, 3, 1.9, 0.81), (1, 3, 1.9, 0.81), (2, 2, 1.0, 0.9)]),
        "sequence": (lambda s, t: adders.Sequence(s, [t], length=3, period=3), [(0, 3), (3, 1)]),
        "episode": (lambda s, t: adders.Episode(s, [t], max_length=8), [(0, 4)]),
    }
    for name, (make, expected) in cases.items():
        store = StepStore(spec, capacity=16)
        table = Table(store, sampler=Fifo(), remover=Fifo())
        adder = make(store, table)
        adder.add_first(ts(0.0, first=True))
        for t in range(3):
            adder.add(np.array([t]), ts(t + 1.0, 1.0))
        adder.truncate()
        got = table_rows(table) if name == "nstep" else [
            (int(s), int(n)) for s, n in zip(table.items()["start"], table.items()["length"], strict=True)]
        assert got == expected, name
        rows = store.gather([0, 0], [2, 3])
        assert rows["truncated"].tolist() == [True, False] and rows["last"].tolist() == [False, True]
        adder.add_first(ts(7.0, first=True))  # the lane is free again


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 6), min_size=1, max_size=8),
       st.sampled_from(["mid", "term", "trunc"]), st.integers(0, 6))
def test_add_steps_equals_one_add_per_step(n, chunks, end, slack):
    """add_steps over chunks of a lane's steps writes the same rows and items as add() per step."""
    total = sum(chunks)
    capacity = max(chunks) + n + 3 + slack
    rng = np.random.default_rng(total)
    acts = rng.integers(0, 6, total)
    rews = rng.standard_normal(total).astype(np.float32)
    vs = rng.standard_normal(total).astype(np.float32)
    obs = np.stack([np.array([0.0, i], np.float32) for i in range(total + 1)])
    results = []
    for chunked in (False, True):
        store = StepStore(SPEC, capacity=capacity)
        table = Table(store, sampler=Fifo(), remover=Fifo())
        adder = adders.NStepTransition(store, [table], n=n, discount=G)
        z = np.zeros(1, bool)
        adder.add_first(TimeStep(obs[:1], np.zeros(1, np.float32), z, z, ~z, z))
        if chunked:
            i = 0
            for c in chunks:
                stop = i + c == total and end != "mid"
                adder.add_steps(0, acts[i:i + c], rews[i:i + c], obs[i + 1:i + c + 1], extras={"v": vs[i:i + c]},
                                terminated=stop and end == "term", truncated=stop and end == "trunc")
                i += c
        else:
            for i in range(total):
                stop = i == total - 1 and end != "mid"
                te, tr = np.array([stop and end == "term"]), np.array([stop and end == "trunc"])
                adder.add(acts[i:i + 1], TimeStep(obs[i + 1:i + 2], rews[i:i + 1], te, tr, z, te | tr,
                                                  obs[i + 1:i + 2] if stop else None), {"v": vs[i:i + 1]})
        state = {k: v.copy() for k, v in store.state_dict().items()}
        items = table.items()
        results.append((state, {k: v for k, v in items.items() if k != "key"}, adder._open.copy()))
    (s1, i1, o1), (s2, i2, o2) = results
    open_row = o1[0]
    for k in s1:
        a, b = s1[k], s2[k]
        if open_row >= 0 and k in ("column/action", "column/reward", "column/extras/v"):
            pos = open_row % capacity  # the open row's action and reward are not written yet
            a, b = np.delete(a, pos, axis=1), np.delete(b, pos, axis=1)
        np.testing.assert_array_equal(a, b, err_msg=k)
    for k in i1:
        np.testing.assert_allclose(i1[k], i2[k], rtol=1e-6, err_msg=k)
    np.testing.assert_array_equal(o1, o2)


def _run_chunks(direct: bool, n: int, chunks: list[tuple[int, str]], prioritized: bool, max_size: int | None,
                capacity: int, seed: int) -> tuple[StepStore, Table, adders.NStepTransition]:
    """Chunks of one lane's steps, each through one add_steps call (``direct``) or one add call a step."""
    spec = step_spec(OBS, ACT)
    store = StepStore(spec, capacity=capacity)
    sampler = Prioritized(0.6, 0.4, seed=seed) if prioritized else Uniform(seed=seed)
    table = Table(store, sampler=sampler, remover=Fifo(seed=seed), max_size=max_size)
    adder = adders.NStepTransition(store, [table], n=n, discount=G)
    rng = np.random.default_rng(seed)
    z = np.zeros(1, bool)
    obs = rng.standard_normal((1, 2)).astype(np.float32)
    adder.add_first(TimeStep(obs, np.zeros(1, np.float32), z, z, ~z, z))
    for c, end in chunks:
        acts = rng.integers(0, 6, c)
        rews = rng.standard_normal(c).astype(np.float32)
        nxt = rng.standard_normal((c, 2)).astype(np.float32)
        if direct:
            adder.add_steps(0, acts, rews, nxt, terminated=end == "term", truncated=end == "trunc")
        else:  # the same steps, one add call each
            ends = np.zeros(c, bool)
            ends[-1] = end != "mid"
            _add_one_by_one(adder, 0, acts, rews, nxt, ends & (end == "term"), ends & (end == "trunc"), None)
        if end != "mid":
            first = rng.standard_normal((1, 2)).astype(np.float32)
            adder.add_first(TimeStep(first, np.zeros(1, np.float32), z, z, ~z, z))
    return store, table, adder


def _add_one_by_one(adder: adders.NStepTransition, lane: int, acts: np.ndarray, rews: np.ndarray, nxt: np.ndarray,
                    term: np.ndarray, trunc: np.ndarray, firsts: np.ndarray | None) -> None:
    """``add_steps``'s steps of one lane as one ``add`` call each on a one-lane store (restarts as same-step
    resets: ``first`` with the next episode's observation, the final one in ``final_observation``)."""
    k = 0
    for i in range(acts.shape[0]):
        last = bool(term[i] or trunc[i])
        restart = last and firsts is not None and k < len(firsts)
        obs = firsts[k:k + 1] if restart else nxt[i:i + 1]
        k += int(restart)
        flag = np.array
        adder.add(acts[i:i + 1], TimeStep(obs, rews[i:i + 1], flag([bool(term[i])]), flag([bool(trunc[i])]),
                                          flag([restart]), flag([last]), nxt[i:i + 1] if last else None))


def _assert_same_state(got: dict, want: dict, prefix: str = "") -> None:
    """Two state dicts (nested dicts of arrays and values) are equal, key for key."""
    assert got.keys() == want.keys(), prefix
    for k in want:
        if isinstance(want[k], dict):
            _assert_same_state(got[k], want[k], f"{prefix}{k}/")
        elif isinstance(want[k], np.ndarray):
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{prefix}{k}")
        else:
            assert got[k] == want[k], f"{prefix}{k}"


def _assert_same_tables(t1: Table, t2: Table) -> None:
    """The two tables' whole states are equal (items, keys, priorities, times sampled, selector arrays and
    RNGs, rate limiter), and so is their next sample."""
    _assert_same_state(t1.state_dict(), t2.state_dict())
    assert t1._items.times_total == t2._items.times_total and t1.size == t2.size
    if t2.size:
        np.testing.assert_array_equal(t1.sample(4, timeout=5.0).keys, t2.sample(4, timeout=5.0).keys)


def _assert_same_runs(got: tuple, want: tuple) -> None:
    """Two runs' ``(store, table, adder)`` end equal: the store's and the adder's states, and the tables' items
    in insertion order (windows, fields, priorities, times sampled; their keys name slots, which depend on how
    many items one insert took)."""
    (s1, t1, a1), (s2, t2, a2) = got, want
    _assert_same_state(s1.state_dict(), s2.state_dict())
    _assert_same_state(a1.state_dict(), a2.state_dict())
    i1, i2 = t1.items(), t2.items()
    assert i1.keys() == i2.keys()
    for k in i1:
        if k != "key":
            np.testing.assert_array_equal(i1[k], i2[k], err_msg=k)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.lists(st.tuples(st.integers(1, 7), st.sampled_from(["mid", "mid", "term", "trunc"])),
                                   min_size=1, max_size=10),
       st.booleans(), st.sampled_from([None, 3, 8]), st.integers(0, 5), st.integers(0, 99))
def test_add_steps_leaves_the_state_of_one_add_a_step(n, chunks, prioritized, max_size, slack, seed):
    """add_steps of each chunk of a lane's steps leaves the store, the table (a Uniform or Prioritized sampler and
    a Fifo remover: items, priorities, times sampled, selector and rate limiter states) and the adder exactly as
    one add call a step does: over ring wrap-arounds, episode ends, and tables too small for the new items (the
    table's own insert then evicts)."""
    capacity = max(c for c, _ in chunks) + n + 3 + slack
    _assert_same_runs(*(_run_chunks(direct, n, chunks, prioritized, max_size, capacity, seed)
                        for direct in (True, False)))




@pytest.mark.parametrize("prioritized", [False, True])
def test_add_steps_over_growing_outputs_and_a_restored_table_leaves_the_state_of_one_add_a_step(prioritized):
    """add_steps calls of more items than any before (the n-step rule's output buffers grow), then a table whose
    state is loaded from a checkpoint (in place) and written on: the store, table and adder end exactly as with
    one add call a step."""
    chunks = [(5, "mid"), (90, "mid"), (300, "term"), (40, "mid"), (400, "trunc"), (30, "mid")]
    runs = []
    for direct in (True, False):
        _, table, _ = _run_chunks(direct, 3, chunks[:3], prioritized, None, 900, 4)
        saved = table.state_dict()
        store2, table2, adder2 = _run_chunks(direct, 3, chunks, prioritized, None, 900, 4)
        table2.load_state_dict(saved)  # a table restored to an earlier state, then written on
        rng = np.random.default_rng(5)
        adder2.add_steps(0, rng.integers(0, 6, 200), rng.standard_normal(200).astype(np.float32),
                         rng.standard_normal((200, 2)).astype(np.float32))
        runs.append((store2, table2, adder2))
    _assert_same_runs(*runs)


@settings(max_examples=60, deadline=None)
@given(streams, st.integers(1, 3), st.booleans(), st.sampled_from([None, 2, 5]), st.booleans())
def test_staged_blocks_leave_the_state_of_one_add_a_step(cfg, n, prioritized, max_size, shared):
    """One lane's steps staged (written in blocks, and at a flush every third step) leave the store, the
    adder and the table's items (windows, fields, priorities, in insertion order) exactly as one add a
    step does: over episode ends, same-step restarts, ring wrap-arounds, and tables too small for the
    items (a block's Fifo evictions are those of one add a step)."""
    cfg["lanes"] = 1
    capacity = n + 2 + 2 * cfg.pop("slack")
    runs = []
    for direct in (True, False):
        store = StepStore(step_spec(OBS, ACT), capacity=capacity, lanes=cfg["lanes"])
        sampler = Prioritized(0.6, 0.4, seed=1) if prioritized else Uniform(seed=1)
        table = Table(store, sampler=sampler, remover=Fifo(seed=1), max_size=max_size)
        adder = adders.NStepTransition(store, [table], n=n, discount=G)
        write = adder.stage if direct else adder.add  # staged blocks, or a block of one step a call
        stream = Stream(cfg["lanes"], np.random.default_rng(cfg["seed"]), cfg["same_step"])
        adder.add_first(stream.reset())
        for step in range(cfg["steps"]):
            actions, ts, _ = stream.step(stream.random_events(cfg["p_end"]))
            write(actions, _shared_flags(ts) if shared else ts)
            if step % 3 == 2:
                adder.flush()
        adder.flush()
        runs.append((store, table, adder))
    _assert_same_runs(*runs)




def _run_episode_calls(mode: str, n: int, calls: list, prioritized: bool, max_size: int | None, capacity: int,
                       seed: int, lanes: int = 1) -> tuple[StepStore, Table, adders.NStepTransition]:
    """A lane's steps in calls of several episodes each (``calls``: per call, segments of (steps, how the
    last one ends, whether the next episode starts in the same call)), written by ``add_steps`` with
    per-step flags and first observations (``mode`` "one"), one add call a step ("adds", one lane) or segment
    by segment ("segments": ``add_steps`` of each episode, then ``add_first``). With several lanes, call ``i``
    writes lane ``i % lanes``."""
    store = StepStore(step_spec(OBS, ACT), capacity=capacity, lanes=lanes)
    sampler = Prioritized(0.6, 0.4, seed=seed) if prioritized else Uniform(seed=seed)
    table = Table(store, sampler=sampler, remover=Fifo(seed=seed), max_size=max_size)
    adder = adders.NStepTransition(store, [table], n=n, discount=G)
    rng = np.random.default_rng(seed)
    z, zs = np.zeros(1, bool), np.zeros(lanes, bool)
    adder.add_first(TimeStep(rng.standard_normal((lanes, 2)).astype(np.float32), np.zeros(lanes, np.float32), zs, zs,
                             ~zs, zs))

    def start(lane, obs):  # a new episode on one lane (a one-lane store: add_first of every lane)
        adder.add_first(TimeStep(obs[None], np.zeros(1, np.float32), z, z, ~z, z), lanes=None if lanes == 1 else [lane])

    for i, segments in enumerate(calls):
        lane = i % lanes
        t = sum(c for c, _, _ in segments)
        acts, rews = rng.integers(0, 6, t), rng.standard_normal(t).astype(np.float32)
        nxt = rng.standard_normal((t, 2)).astype(np.float32)
        term, trunc = np.zeros(t, bool), np.zeros(t, bool)
        ends, a = [], 0
        for c, end, _ in segments:
            a += c
            ends.append(a)
            term[a - 1], trunc[a - 1] = end == "term", end == "trunc"
        restarts = [i for i, (_, end, again) in enumerate(segments) if end != "mid" and again]
        firsts = rng.standard_normal((len(restarts), 2)).astype(np.float32)
        if mode == "segments":
            a = 0
            for j, ((_, end, _), b) in enumerate(zip(segments, ends, strict=True)):
                adder.add_steps(lane, acts[a:b], rews[a:b], nxt[a:b], terminated=end == "term",
                                truncated=end == "trunc")
                if j in restarts:
                    start(lane, firsts[restarts.index(j)])
                a = b
        elif mode == "adds" and lanes == 1:
            _add_one_by_one(adder, lane, acts, rews, nxt, term, trunc, firsts)
        else:
            adder.add_steps(lane, acts, rews, nxt, terminated=term, truncated=trunc, first_observations=firsts)
        if adder._open[lane] < 0:  # the call ended the episode without starting the next
            start(lane, rng.standard_normal(2).astype(np.float32))
    return store, table, adder


@st.composite
def episode_calls(draw):
    """Calls of one lane's steps: every segment but a call's last ends and starts the next episode."""
    calls = []
    for _ in range(draw(st.integers(1, 6))):
        count = draw(st.integers(1, 4))
        segments = []
        for i in range(count):
            steps = draw(st.integers(1, 6))
            if i < count - 1:
                segments.append((steps, draw(st.sampled_from(["term", "trunc"])), True))
            else:
                segments.append((steps, draw(st.sampled_from(["mid", "term", "trunc"])), draw(st.booleans())))
        calls.append(segments)
    return calls


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), episode_calls(), st.booleans(), st.sampled_from([None, 3, 8]), st.integers(0, 5),
       st.integers(0, 99), st.sampled_from([1, 1, 3]))
def test_add_steps_over_episode_ends_leaves_the_state_of_one_call_per_episode(n, calls, prioritized, max_size, slack,
                                                                             seed, lanes):
    """add_steps with per-step end flags and first observations, and one add call a step, each leave the store,
    the table (items, priorities, times sampled, selector arrays and RNGs, rate limiter counts) and the adder
    exactly as add_steps of each episode followed by add_first of the next: over ring wrap-arounds, tables
    too small for the new items, and calls on the lanes of a several-lane store in turn."""
    capacity = max(sum(c for c, _, _ in segments) for segments in calls) + n + 3 + slack
    for mode in ("one", "adds"):  # a fresh reference each time
        _assert_same_runs(_run_episode_calls(mode, n, calls, prioritized, max_size, capacity, seed, lanes),
                          _run_episode_calls("segments", n, calls, prioritized, max_size, capacity, seed, lanes))


@pytest.mark.parametrize("direct", [True, False])
def test_add_steps_over_episode_ends_rejects_bad_input_changing_nothing(direct):
    """Bad flags, a wrong number of first observations, or a bad value in any episode of the call (a later
    one's observation, a first observation) raise a clear error and write nothing, on both paths."""
    store, table, adder = _run_chunks(direct, 2, [(5, "mid")], False, None, 20, 0)
    before = ({k: v.copy() for k, v in store.state_dict().items()}, table.state_dict(), adder.state_dict())
    acts, rews, obs = np.zeros(4, np.int64), np.zeros(4, np.float32), np.zeros((4, 2), np.float32)
    term = np.array([False, True, False, False])
    nan = obs.copy()
    nan[3, 1] = np.nan
    one = np.zeros((1, 2), np.float32)
    cases = [
        (dict(terminated=term), SpecError, "expected 1 first_observations"),
        (dict(terminated=term, first_observations=np.zeros((2, 2), np.float32)), SpecError, "expected 1 first_obs"),
        (dict(terminated=np.array([0, 1, 0, 0])), SpecError, "terminated: expected a bool or a bool array"),
        (dict(terminated=term[:3]), SpecError, r"shape \(4,\)"),
        (dict(terminated=term, first_observations=one, obs=nan), SpecError, "observation"),
        (dict(terminated=term, first_observations=one + np.inf), SpecError, "first_observations"),
        (dict(terminated=np.ones(4, bool), first_observations=np.zeros((4, 2), np.float32)), SpecError,
         "expected 3 or 4"),
    ]
    for kwargs, exc, match in cases[:-1]:
        nxt = kwargs.pop("obs", obs)
        with pytest.raises(exc, match=match):
            adder.add_steps(0, acts, rews, nxt, **kwargs)
        for k, v in store.state_dict().items():
            np.testing.assert_array_equal(v, before[0][k], err_msg=k)
        _assert_same_state(table.state_dict(), before[1])
        for k, v in adder.state_dict().items():
            np.testing.assert_array_equal(v, before[2][k], err_msg=k)
    adder.add_steps(0, acts, rews, obs, terminated=np.ones(4, bool), first_observations=np.zeros((4, 2), np.float32))
    assert store.count[0] == before[0]["count"][0] + 8 and adder._open[0] == store.count[0] - 1  # 4 ends, 4 restarts


@pytest.mark.parametrize("path", ["add", "add_steps"])
def test_a_step_both_terminated_and_truncated_is_terminated(path):
    """A step flagged both ways is stored and itemised as terminated (no bootstrap), whichever way it comes in:
    the same store rows and table items as the step flagged terminated only."""
    def run(truncated_too: bool):
        store = StepStore(step_spec(OBS, ACT), capacity=16)
        table = Table(store, sampler=Fifo(), max_size=16)
        adder = adders.NStepTransition(store, [table], n=3, discount=G)
        z = np.zeros(1, bool)
        adder.add_first(TimeStep(np.zeros((1, 2), np.float32), np.zeros(1, np.float32), z, z, ~z, z))
        acts, rews = np.array([1, 2, 3]), np.array([1.0, 2.0, 4.0], np.float32)
        nxt = np.arange(6, dtype=np.float32).reshape(3, 2)
        term = np.array([False, False, True])
        if path == "add_steps":
            adder.add_steps(0, acts, rews, nxt, terminated=term, truncated=term & truncated_too)
        else:
            _add_one_by_one(adder, 0, acts, rews, nxt, term, term & truncated_too, None)
        return store.state_dict(), table.sample(3)
    (rows, got), (want_rows, want) = run(True), run(False)
    for k, v in want_rows.items():
        np.testing.assert_array_equal(rows[k], v, err_msg=k)
    assert rows["column/terminated"].any() and not rows["column/truncated"].any()
    assert got.data.discount.tolist() == want.data.discount.tolist() == [0.0, 0.0, 0.0]
    assert got.data.reward.tolist() == want.data.reward.tolist()


def test_one_lane_add_rejects_bad_values_changing_nothing():
    """One lane's add: NaN observations, infinite rewards and actions out of bounds raise SpecError and change
    nothing, also on a step that ends the episode and starts the next; the lane then goes on."""
    store, table, adder = _run_chunks(True, 2, [(5, "mid")], False, None, 12, 0)
    before = ({k: v.copy() for k, v in store.state_dict().items()}, table.state_dict()["arrays"]["meta"].copy(),
              adder.state_dict()["open"].copy())
    z, y = np.zeros(1, bool), np.ones(1, bool)
    good = (np.zeros(1, np.int64), np.zeros(1, np.float32), np.zeros((1, 2), np.float32))
    nan = np.array([[0, np.nan]], np.float32)
    for a, r, o, end in ((good[0], good[1], nan, False), (good[0], np.array([np.inf], np.float32), good[2], False),
                         (np.array([6]), good[1], good[2], False),
                         (good[0], good[1], nan, True),  # ends, and the next episode's first observation is bad
                         (good[0], np.array([np.nan], np.float32), good[2], True)):
        with pytest.raises(SpecError):
            adder.add(a, TimeStep(o, r, y, z, y, y, good[2]) if end else TimeStep(o, r, z, z, z, z))
        for k, v in store.state_dict().items():
            np.testing.assert_array_equal(v, before[0][k], err_msg=k)
        np.testing.assert_array_equal(table.state_dict()["arrays"]["meta"], before[1])
        np.testing.assert_array_equal(adder.state_dict()["open"], before[2])
    adder.add(good[0], TimeStep(good[2], good[1], z, z, z, z))
    assert store.count[0] == before[0]["count"][0] + 1 and table.size == 5  # n = 2: 6 steps complete 5 windows


def test_one_lane_stage_checks_each_step_at_once():
    """One lane's stage: a bad step, or an episode end whose restart observation is bad, raises at once and
    leaves the staged steps staged (nothing of it is kept); the lane then goes on, and a flush writes
    exactly the good steps."""
    store, table, adder = _run_chunks(True, 1, [(3, "mid")], False, None, 40, 0)
    z, o = np.zeros(1, bool), np.ones(1, bool)
    act, rew, obs = np.zeros(1, np.int64), np.zeros(1, np.float32), np.zeros((1, 2), np.float32)
    nan = np.array([[0, np.nan]], np.float32)
    for _ in range(2):
        adder.stage(act, TimeStep(obs, rew, z, z, z, z))
    assert adder.staged_steps == 2 and store.count[0] == 4 and table.size == 3
    with pytest.raises(SpecError):
        adder.stage(act, TimeStep(nan, rew, z, z, z, z))
    with pytest.raises(SpecError):  # terminates, and the same-step restart's observation is bad
        adder.stage(act, TimeStep(nan, rew, o, z, o, o, obs))
    for term, trunc in ((o, z), (z, o)):  # an end flag without last
        with pytest.raises(SpecError, match="expected last =="):
            adder.stage(act, TimeStep(obs, rew, term, trunc, z, z))
    assert adder.staged_steps == 2 and store.count[0] == 4 and table.size == 3
    adder.stage(act, TimeStep(obs + 1, rew, o, z, o, o, obs))  # terminates and restarts: the block goes on
    adder.stage(act, TimeStep(obs, rew, z, z, z, z))
    with pytest.raises(SpecError):
        adder.stage(act, TimeStep(nan, rew, z, z, z, z))
    assert adder.staged_steps == 4 and store.count[0] == 4
    adder.flush()
    assert adder.staged_steps == 0 and store.count[0] == 9 and table.size == 7 and adder._open[0] == 8
    np.testing.assert_array_equal(store.columns["observation"][0, 7], obs[0] + 1)  # the restart's observation
    np.testing.assert_array_equal(store.columns["first"][0, 6:9], [False, True, False])
    adder.stage(act, TimeStep(obs, rew, z, z, z, z))
    adder.flush()
    assert store.count[0] == 10 and table.size == 8


def test_add_steps_rejects_bad_values_changing_nothing():
    """Bad values in an add_steps call (a NaN observation, an infinite reward, an action out of bounds) raise
    SpecError and change nothing."""
    store, table, adder = _run_chunks(True, 2, [(5, "mid"), (4, "mid")], False, None, 10, 0)
    before = ({k: v.copy() for k, v in store.state_dict().items()}, table.state_dict(), adder.state_dict())
    good = (np.zeros(3, np.int64), np.zeros(3, np.float32), np.zeros((3, 2), np.float32))
    bad = {"obs": (good[0], good[1], np.array([[0, 0], [0, np.nan], [0, 0]], np.float32)),
           "reward": (good[0], np.array([0, np.inf, 0], np.float32), good[2]),
           "action": (np.array([0, 6, 0]), good[1], good[2])}
    for name, (a, r, o) in bad.items():
        with pytest.raises(SpecError):
            adder.add_steps(0, a, r, o)
        np.testing.assert_array_equal(store.state_dict()["column/observation"], before[0]["column/observation"],
                                      err_msg=name)
        after = table.state_dict()
        np.testing.assert_array_equal(after["arrays"]["meta"], before[1]["arrays"]["meta"], err_msg=name)
        assert after["rate_limiter"] == before[1]["rate_limiter"]
        np.testing.assert_array_equal(adder.state_dict()["open"], before[2]["open"])
    for k, v in store.state_dict().items():
        np.testing.assert_array_equal(v, before[0][k], err_msg=k)
    adder.add_steps(0, *good)  # and the lane goes on
    assert store.count[0] == before[0]["count"][0] + 3


def _shared_flags(ts: TimeStep) -> TimeStep:
    """``ts`` with one lane's flags replaced by the shared read-only arrays rlflow's one-env wrapper hands
    out (which the adders recognise by identity); several lanes' flags as they are."""
    if ts.first.shape != (1,):
        return ts
    def pick(flag):
        return ONE_LANE_YES if flag[0] else ONE_LANE_NO
    return dataclasses.replace(ts, first=pick(ts.first), last=pick(ts.last), terminated=pick(ts.terminated),
                               truncated=pick(ts.truncated))


@settings(max_examples=80, deadline=None)
@given(streams, st.integers(1, 4), st.integers(1, 9), st.lists(st.integers(0, 40), max_size=4), st.booleans(),
       st.booleans(), st.booleans())
def test_staged_steps_write_what_the_reference_holds(cfg, n, stage_steps, flush_at, with_extras, shared, rows):
    """NStepTransition.stage: after a flush the store holds the reference's rows and the table its n-step items
    (windows, returns, discounts, observations, actions, extras), whatever the block size, the flush points,
    the ring's wrap-arounds and the lanes' ends; with extras and without, with fresh flag arrays or the shared
    ones, into a Table or a RowTable. No more than ``stage_steps`` steps are ever held."""
    capacity = n + 2 + 2 * cfg.pop("slack")
    spec = SPEC if with_extras else step_spec(OBS, ACT)
    store = StepStore(spec, capacity=capacity, lanes=cfg["lanes"])
    table = RowTable(store, seed=0) if rows else Table(store, sampler=Uniform(seed=0), remover=Fifo(),
                                                         max_size=3 * capacity * cfg["lanes"])
    adder = adders.NStepTransition(store, [table], n=n, discount=G, stage_steps=stage_steps)
    stream = Stream(cfg["lanes"], np.random.default_rng(cfg["seed"]), cfg["same_step"])
    adder.add_first(stream.reset())
    for step in range(cfg["steps"]):
        actions, ts, extras = stream.step(stream.random_events(cfg["p_end"]))
        adder.stage(actions, _shared_flags(ts) if shared else ts, extras if with_extras else None)
        assert adder.staged_steps <= adder.stage_steps
        if step in flush_at:
            adder.flush()
    adder.flush()
    assert adder.staged_steps == 0
    check_rows(store, stream)
    check_nstep_items(store, table, stream, n, capacity)


@settings(max_examples=60, deadline=None)
@given(streams, st.integers(1, 4), st.lists(st.integers(1, 9), min_size=1, max_size=6), st.booleans())
def test_add_steps_writes_what_the_reference_holds(cfg, n, chunks, rows):
    """add_steps of each lane's steps in chunks (per-step end flags, each restarted episode's first observation,
    extras): the store holds the reference's rows and the table its n-step items, over ring wrap-arounds and
    episodes that end anywhere in a chunk, its last step included (the next episode then starts there)."""
    capacity = n + 2 + 2 * cfg.pop("slack")
    lanes = cfg["lanes"]
    store = StepStore(SPEC, capacity=capacity, lanes=lanes)
    table = make_table(store, rows, False)
    adder = adders.NStepTransition(store, [table], n=n, discount=G)
    stream = Stream(lanes, np.random.default_rng(cfg["seed"]), True)  # episodes restart in the step that ends them
    adder.add_first(stream.reset())
    steps = [stream.step(stream.random_events(cfg["p_end"])) for _ in range(cfg["steps"])]
    for e in range(lanes):  # each lane's steps, chunk after chunk (the lanes' rows are independent)
        a, k = 0, 0
        while a < len(steps):
            part = steps[a:a + chunks[k % len(chunks)]]
            a, k = a + len(part), k + 1
            ends = np.array([bool(ts.last[e]) for _, ts, _ in part])
            nxt = np.stack([ts.final_observation[e] if ts.last[e] else ts.observation[e] for _, ts, _ in part])
            firsts = [ts.observation[e] for _, ts, _ in part if ts.first[e]]
            adder.add_steps(e, np.array([act[e] for act, _, _ in part]), np.array([ts.reward[e] for _, ts, _ in part]),
                            nxt, terminated=np.array([bool(ts.terminated[e]) for _, ts, _ in part]),
                            truncated=ends & ~np.array([bool(ts.terminated[e]) for _, ts, _ in part]),
                            extras={"v": np.array([x["v"][e] for _, _, x in part])},
                            first_observations=np.stack(firsts) if firsts else None)
    check_rows(store, stream)
    check_nstep_items(store, table, stream, n, capacity)


def test_staged_steps_reach_the_table_at_flush_and_bad_input_still_raises_at_once():
    store = StepStore(SPEC, capacity=64, lanes=2)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    adder = adders.NStepTransition(store, [table], n=1, stage_steps=8)
    small = StepStore(SPEC, capacity=9, lanes=2)
    assert adder.stage_steps == 8 and adders.NStepTransition(small, [Table(small)], n=1).stage_steps == 3
    # Frames: the block's buffers stay within 32 MiB (2 * 28,224 observation bytes + 12 per lane and step).
    frames = step_spec(specs.Field((84, 84, 4), np.uint8), specs.Field((), np.int64, low=0, high=5))
    for lanes, steps in ((8, 64), (64, 9), (256, 2)):
        big = StepStore(frames, capacity=200, lanes=lanes)
        assert adders.NStepTransition(big, [Table(big)]).stage_steps == steps
    stream = Stream(2, np.random.default_rng(0), True)
    adder.add_first(stream.reset())
    for _ in range(3):
        adder.stage(*stream.step(stream.random_events(0.0)))
    assert adder.staged_steps == 3 and table.size == 0 and int(store.count.sum()) == 2  # only the first rows
    actions, ts, extras = stream.step(stream.random_events(0.0))
    bad = np.full_like(actions, 99)  # outside the action space: raises, the steps staged before it kept
    with pytest.raises(SpecError, match="action"):
        adder.stage(bad, ts, extras)
    assert adder.staged_steps == 3 and table.size == 0  # the 3 staged steps stay staged, nothing of the bad one
    adder.stage(actions, ts, extras)
    for _ in range(4):
        adder.stage(*stream.step(stream.random_events(0.0)))
    assert adder.staged_steps == 0 and table.size == 2 * 8  # the 8th staged step wrote the block
    with pytest.raises(ValueError, match="stage_steps"):
        adders.NStepTransition(store, [table], stage_steps=0)


@pytest.mark.parametrize("bad", ["nan_obs", "action_high", "nan_reward", "nan_final", "int_flags", "flag_flow",
                                 "obs_shape", "action_dtype"])
def test_staging_rejects_bad_steps_writing_nothing_of_them(bad):
    """Each kind of bad input raises at the stage call that brought it, and nothing of it is kept: the steps
    staged before it stay staged (the store and table after a flush equal those of a run that flushed
    instead of the bad call)."""
    runs = []
    for call_bad in (True, False):
        store = StepStore(step_spec(OBS, ACT), capacity=64, lanes=2)
        table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
        adder = adders.NStepTransition(store, [table], n=1, stage_steps=8)
        stream = Stream(2, np.random.default_rng(0), True)
        adder.add_first(stream.reset())
        for _ in range(3):
            actions, ts, _ = stream.step(stream.random_events(0.0))
            adder.stage(actions, ts)
        assert adder.staged_steps == 3 and table.size == 0
        actions, ts, _ = stream.step(stream.random_events(1.0))  # both lanes end: with a final observation
        if not call_bad:
            adder.flush()
        else:
            if bad == "nan_obs":
                ts.observation = np.where(np.arange(2)[:, None] == 1, np.nan, ts.observation).astype(np.float32)
            elif bad == "action_high":
                actions = np.array([0, 6])
            elif bad == "nan_reward":
                ts.reward = np.array([0.0, np.inf], np.float32)
            elif bad == "nan_final":
                ts.final_observation = np.full_like(ts.final_observation, np.nan)
            elif bad == "int_flags":
                ts.last = ts.last.astype(np.int64)
            elif bad == "flag_flow":
                ts.last = np.zeros(2, bool)  # terminated or truncated, but not last
            elif bad == "obs_shape":
                ts.observation = ts.observation[:, :1]
            elif bad == "action_dtype":
                actions = actions.astype(np.float32) + 0.5
            with pytest.raises((SpecError, ValueError)):
                adder.stage(actions, ts)
            assert adder.staged_steps == 3
            adder.flush()
        runs.append((store.state_dict(), table.items(), adder.state_dict()))
    (s1, i1, a1), (s2, i2, a2) = runs
    assert i1["key"].size == 6
    for got, want in ((s1, s2), (i1, i2), (a1, a2)):
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_staging_takes_float16_observations():
    """Fields the block filler leaves to the spec's checks (float16) are converted and staged, not rejected; staged
    and written one at a time they give the same rows and items."""
    spec = step_spec(specs.Field((3,), np.float16), ACT)
    results = []
    for staged in (True, False):
        store = StepStore(spec, capacity=64, lanes=2)
        table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
        adder = adders.NStepTransition(store, [table], n=2, stage_steps=8)
        z = np.zeros(2, bool)
        adder.add_first(TimeStep(np.zeros((2, 3), np.float16), np.zeros(2, np.float32), z, z, ~z, z))
        for t in range(20):
            end = np.array([t % 7 == 6, False])
            args = (np.full(2, t % 4), TimeStep(np.full((2, 3), t + 1, np.float16), np.ones(2, np.float32), end, z, end,
                                                end, np.full((2, 3), -1, np.float16) if end.any() else None))
            adder.stage(*args) if staged else adder.add(*args)
        adder.flush()
        results.append((store.state_dict(), table.items()))
    for got, want in zip(results[0], results[1], strict=True):
        for k in want:
            if k not in ("key", "slot"):
                np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@settings(max_examples=60, deadline=None)
@given(length=st.integers(2, 6), period=st.integers(1, 6), continue_=st.booleans(),
       episodes=st.lists(st.integers(1, 9), min_size=1, max_size=6), cut_at=st.integers(0, 30))
def test_rows_until_written_counts_the_rows_to_the_next_sequence(length, period, continue_, episodes, cut_at):
    """``Sequence.rows_until_written``: whenever the lane's episode does not end before its next sequence, that
    sequence is written exactly as the stated number of rows later, whether counted from a fresh lane, mid
    episode, or after ``truncate`` cut the episode (rows stored one a step, episode ends as gymnasium's
    ``NEXT_STEP`` mode gives them: the final row, then the next episode's first)."""
    period = min(period, length)
    spec = step_spec(specs.Field((), np.float32), specs.Field((), np.int64))
    store = StepStore(spec, capacity=256)
    table = Table(store, sampler=Fifo(), remover=Fifo(), cross_episodes=continue_)
    adder = adders.Sequence(store, [table], length=length, period=period,
                            end_behavior="continue" if continue_ else "zero_pad")
    steps = []  # (kind, episode ends at this step): "first" starts an episode, "step" acts
    for i, n in enumerate(episodes):
        steps += [("first", False)] + [("step", t == n - 1) for t in range(n)]
        if i == 0 and cut_at < n:  # truncate() cuts the first episode after cut_at actions
            steps = [*steps[:1 + cut_at], ("cut", False)]
    pending = []  # (rows stored when asked, the answer, whether an episode ended since)
    for k, (kind, ends) in enumerate(steps):
        if kind == "cut":
            adder.truncate()
            pending = []  # (truncate writes the final row's sequences at once: not a row stored)
            continue
        pending.append([int(store.count[0]), int(adder.rows_until_written()[0]), False])
        before = table.size
        if kind == "first":
            adder.add_first(ts(float(k), first=True))
        else:
            adder.add(np.array([1]), ts(float(k), 1.0, term=ends, final=float(k) if ends else None))
        rows = int(store.count[0])
        if ends:  # the final row is complete at once: it may write a sequence sooner
            for p in pending:
                p[2] = True
        if table.size > before:  # a sequence was written at this row
            for asked, answer, ended in pending:
                if not ended:
                    assert rows - asked == answer, (asked, answer, rows)
            pending = []
    for asked, answer, ended in pending:  # not written yet: more rows are needed than were stored
        assert ended or int(store.count[0]) - asked < answer


@pytest.mark.parametrize("method", ["add_first", "truncate", "rows_until_written"])
@pytest.mark.parametrize("lanes", [[0, 0], [3], [-1], [[0]], [0.0], np.array([1, 1], np.uint64)])
def test_lanes_given_to_an_adder_are_checked_as_a_store_checks_them(method, lanes):
    """``lanes=`` of add_first, truncate and a Sequence adder's rows_until_written: distinct lanes of the store,
    or ValueError naming the range and what came, with nothing written."""
    store = StepStore(step_spec(OBS, ACT), capacity=16, lanes=3)
    table = Table(store, sampler=Uniform(seed=0), remover=Fifo())
    if method == "rows_until_written":
        adder = adders.Sequence(store, [table], length=3, period=1, end_behavior="write")
    else:
        adder = adders.NStepTransition(store, [table], n=1)
    z = np.zeros(3, bool)
    adder.add_first(TimeStep(np.zeros((3, 2), np.float32), np.zeros(3, np.float32), z, z, ~z, z))
    adder.add(np.zeros(3, np.int64), TimeStep(np.ones((3, 2), np.float32), np.ones(3, np.float32), z, z, z, z))
    before = {k: v.copy() for k, v in store.state_dict().items()}, table.size
    with pytest.raises(ValueError, match=r"lanes: expected distinct integers in \[0, 3\) \(each lane once\), got"):
        if method == "add_first":
            k = len(np.asarray(lanes).reshape(-1))
            one = np.ones(k, bool)
            adder.add_first(TimeStep(np.zeros((k, 2), np.float32), np.zeros(k, np.float32), ~one, ~one, one, ~one),
                            lanes=lanes)
        else:
            getattr(adder, method)(lanes)
    for k, v in store.state_dict().items():
        np.testing.assert_array_equal(v, before[0][k], err_msg=k)
    assert table.size == before[1]
