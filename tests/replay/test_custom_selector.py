"""A selector written against the public Selector interface (examples/recency_selector.py) works as a table's
sampler and remover, under a rate limiter, with max_times_sampled, and through a checkpoint."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from rlflow import specs
from rlflow.replay import CheckpointError, Fifo, SampleToInsertRatio, Selector, StepStore, Table, load, save

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("recency_selector", ROOT / "examples" / "recency_selector.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
Recency = example.Recency


def table_of(n_items, sampler, remover=None, capacity=100, **kwargs):
    """A table holding ``n_items`` one-step items whose obs is their insert number."""
    store = StepStore({"obs": specs.Field((), np.float32)}, capacity=capacity)
    table = Table(store, sampler=sampler, remover=remover if remover is not None else Fifo(), **kwargs)
    if n_items:
        insert(table, 0, n_items)
    return store, table


def insert(table, first, n):
    rows = table.store.extend(0, {"obs": np.arange(first, first + n, dtype=np.float32)},
                              first=np.arange(n) == 0)
    table.insert(np.zeros(n, np.int64), rows, 1)


def recency_probabilities(seqs, rate):
    """The stated P(i) = exp(-rate * (newest - seq_i)) / sum_j ..., written out."""
    seqs = np.asarray(seqs, np.float64)
    w = np.exp(-rate * (seqs.max() - seqs))
    return w / w.sum()


def test_draws_follow_the_stated_probabilities():
    _, table = table_of(20, Recency(rate=0.3, seed=0))
    expected = recency_probabilities(np.arange(20), 0.3)
    counts = np.zeros(20)
    for _ in range(100):
        sample = table.sample(200)
        seq = sample.data["obs"][:, 0].astype(int)
        np.testing.assert_allclose(sample.probabilities, expected[seq], rtol=1e-12)
        np.add.at(counts, seq, 1)
    assert stats.chisquare(counts, expected * counts.sum()).pvalue > 1e-3
    assert counts[-1] > 10 * counts[10]  # the newest item far more often than one 9 inserts older


def test_as_remover_it_evicts_the_old_items_mostly():
    _, table = table_of(0, Fifo(), remover=Recency(rate=-0.5, seed=3), capacity=400, max_size=50)
    for first in range(0, 200, 10):
        insert(table, first, 10)
    assert table.size == table.remover.size == 50
    held = np.sort(table.remover.seqs[table.remover.seqs >= 0])  # the insert numbers of the items held
    assert held.size == 50
    oldest = table.sample(1).data["obs"][0, 0]  # Fifo's draw: the oldest item held
    assert oldest == held[0]
    assert np.median(held) > 170 and held.max() == 199  # mostly the newest; the newest always kept


def test_under_a_rate_limiter():
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=20)
    _, table = table_of(9, Recency(rate=0.1, seed=0), rate_limiter=limiter)
    assert not table.can_sample(1)
    insert(table, 9, 1)
    assert table.can_sample(8)
    taken = 0
    while table.can_sample(4):
        table.sample(4)
        taken += 4
    assert 0 < taken <= 2 * 10 + 20  # the ratio's window: about 2 samples an insert, give or take 20


def test_with_max_times_sampled_the_retiring_draws_are_weighed_over_the_items_left():
    _, table = table_of(6, Recency(rate=0.5, seed=1), max_times_sampled=1)
    sample = table.sample(6)  # every item, each once: draw j is over the 6 - j items left
    seqs = sample.data["obs"][:, 0].astype(int)
    assert sorted(seqs.tolist()) == list(range(6))
    left = list(range(6))
    for s, p in zip(seqs, sample.probabilities, strict=True):
        w = np.exp(0.5 * np.array(left, np.float64))
        assert p == pytest.approx(np.exp(0.5 * s) / w.sum(), rel=1e-12)
        left.remove(s)
    assert table.size == 0


class NoSequential(Recency):
    sequential_weights = Selector.sequential_weights  # the base's: a random selector must implement it


def test_a_random_selector_without_sequential_weights_is_refused_with_max_times_sampled():
    store = StepStore({"obs": specs.Field((), np.float32)}, capacity=8)
    with pytest.raises(ValueError, match=r"max_times_sampled=1: .*implement NoSequential\.sequential_weights"):
        Table(store, sampler=NoSequential(rate=0.1), max_times_sampled=1)
    Table(store, sampler=NoSequential(rate=0.1))  # without max_times_sampled it is not asked


def build(rate=0.2):
    store = StepStore({"obs": specs.Field((), np.float32)}, capacity=400)
    table = Table(store, sampler=Recency(rate=rate, seed=5), remover=Recency(rate=-0.05, seed=6), max_size=100)
    return store, table


def test_a_checkpoint_restores_what_it_samples_and_evicts_next(tmp_path):
    store, table = build()
    for first in range(0, 150, 10):
        insert(table, first, 10)
        table.sample(8)
    save(tmp_path / "replay.ckpt", store, [table])
    insert(table, 150, 10)  # evicts 10 more
    expected = table.sample(32)

    store2, table2 = build()
    load(tmp_path / "replay.ckpt", store2, [table2])
    assert table2.size == 100 and table2.sampler.size == 100 and table2.remover.size == 100
    insert(table2, 150, 10)
    got = table2.sample(32)
    np.testing.assert_array_equal(got.keys, expected.keys)
    np.testing.assert_array_equal(got.probabilities, expected.probabilities)
    np.testing.assert_array_equal(table2.remover.seqs, table.remover.seqs)


def test_a_checkpoint_of_another_rate_is_refused_naming_it(tmp_path):
    store, table = build(rate=0.2)
    insert(table, 0, 10)
    save(tmp_path / "replay.ckpt", store, [table])
    store2, table2 = build(rate=0.3)
    with pytest.raises(CheckpointError, match="rate"):
        load(tmp_path / "replay.ckpt", store2, [table2])
    assert table2.size == 0 and table2.sampler.size == 0


def test_the_example_runs():
    example.main()
