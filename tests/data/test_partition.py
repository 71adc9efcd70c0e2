"""Partitioners: disjointness, sizes, class counts, speed at scale, determinism."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshift.data import partition as P
from fedshift.errors import FedshiftError


def _labels(n: int, k: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, k, size=n)


def _disjoint(*parts: P.Partition) -> bool:
    idx = np.concatenate([p.indices for p in parts])
    return len(np.unique(idx)) == len(idx)


def test_make_rng_streams_are_independent_and_reproducible():
    a = P.make_rng(3, "x").random(4)
    assert np.array_equal(a, P.make_rng(3, "x").random(4))
    assert not np.array_equal(a, P.make_rng(3, "y").random(4))
    assert not np.array_equal(a, P.make_rng(4, "x").random(4))
    assert not np.array_equal(P.make_rng(3, "x", 1).random(4), P.make_rng(3, "x", 2).random(4))


def test_apportion():
    assert P.apportion(10, [1, 1, 1]).tolist() == [4, 3, 3]
    assert P.apportion(5, [0, 3, 1]).tolist() == [0, 4, 1]
    rows = P.apportion(np.array([7, 0, 4]), np.array([[1, 2, 4], [0, 0, 0], [1, 1, 0]]))
    assert rows.tolist() == [[1, 2, 4], [0, 0, 0], [2, 2, 0]]


def test_iid_sizes_and_cover():
    p = P.iid(1003, 10, P.make_rng(0, "t"))
    assert sorted(p.sizes().tolist()) == [100] * 7 + [101] * 3
    assert np.array_equal(np.sort(p.indices), np.arange(1003))


@pytest.mark.parametrize("proportions", ["per-client", "per-class"])
def test_dirichlet_uses_every_sample_once(proportions):
    y = _labels(5000)
    p = P.dirichlet(y, 20, 0.4, P.make_rng(0, "t"), min_samples=10, proportions=proportions)
    assert np.array_equal(np.sort(p.indices), np.arange(5000))
    assert p.sizes().min() >= 10
    if proportions == "per-client":  # equal sizes (±1)
        assert p.sizes().max() - p.sizes().min() <= 1


@pytest.mark.parametrize("proportions", ["per-client", "per-class"])
def test_dirichlet_1000_clients_tiny_alpha_is_fast(proportions):
    y = _labels(60_000)
    t = time.perf_counter()
    p = P.dirichlet(y, 1000, 0.05, P.make_rng(1, "t"), min_samples=20, proportions=proportions)
    assert time.perf_counter() - t < 2.0
    assert p.num_clients == 1000 and p.sizes().min() >= 20
    assert _disjoint(p)


def test_dirichlet_small_alpha_is_skewed_large_alpha_is_not():
    y = _labels(20_000)

    def mean_top_share(alpha):
        p = P.dirichlet(y, 20, alpha, P.make_rng(0, "t"))
        shares = [np.bincount(y[p.client(i)], minlength=10).max() / p.sizes()[i] for i in range(20)]
        return float(np.mean(shares))

    assert mean_top_share(0.05) > 0.6
    assert mean_top_share(1000.0) < 0.2


def test_dirichlet_extreme_alpha_does_not_hang():
    y = _labels(3000)
    for proportions in ("per-client", "per-class"):
        p = P.dirichlet(y, 300, 1e-6, P.make_rng(0, "t"), 5, proportions)
        assert p.sizes().min() >= 5 and _disjoint(p)


def test_dirichlet_rejects_impossible_minimum():
    with pytest.raises(FedshiftError, match="at least 10"):
        P.dirichlet(_labels(100), 20, 0.5, P.make_rng(0, "t"), min_samples=10)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(50, 2000),
    clients=st.integers(1, 40),
    k=st.integers(1, 12),
    alpha=st.floats(1e-3, 100.0),
    proportions=st.sampled_from(["per-client", "per-class"]),
    seed=st.integers(0, 2**32),
)
def test_dirichlet_properties(n, clients, k, alpha, proportions, seed):
    y = _labels(n, k, seed)
    min_samples = max(1, min(5, n // clients))
    p = P.dirichlet(y, clients, alpha, P.make_rng(seed, "h"), min_samples, proportions)
    assert p.num_clients == clients
    assert np.array_equal(np.sort(p.indices), np.arange(n))  # every sample exactly once
    assert p.sizes().min() >= min_samples
    q = P.dirichlet(y, clients, alpha, P.make_rng(seed, "h"), min_samples, proportions)
    assert np.array_equal(p.indices, q.indices) and np.array_equal(p.offsets, q.offsets)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 50), min_size=1, max_size=20),
    fraction=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**32),
)
def test_split_fraction_properties(sizes, fraction, seed):
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    part = P.Partition(np.random.default_rng(seed).permutation(offsets[-1]), offsets)
    keep, taken = P.split_fraction(part, fraction, P.make_rng(seed, "s"))
    assert _disjoint(keep, taken)
    for i, s in enumerate(sizes):
        both = np.concatenate([keep.client(i), taken.client(i)])
        assert sorted(both.tolist()) == sorted(part.client(i).tolist())
        assert keep.sizes()[i] >= min(1, s)


def test_pathological_defaults():
    y = _labels(60_000)
    train, test = P.pathological(y, 40, P.make_rng(0, "t"))
    assert _disjoint(train, test)
    totals = train.sizes() + test.sizes()
    assert totals.min() >= 400 and totals.max() <= 5000
    for i in range(40):
        own = np.concatenate([train.client(i), test.client(i)])
        assert len(np.unique(y[own])) == 3
        assert set(np.unique(y[test.client(i)])) <= set(np.unique(y[own]))
        assert abs(test.sizes()[i] - 0.25 * totals[i]) <= 0.5
    # every class serves the same number of clients (40 · 3 / 10 = 12)
    per_class = np.zeros(10, int)
    for i in range(40):
        per_class[np.unique(y[train.client(i)])] += 1
    assert per_class.tolist() == [12] * 10


def test_pathological_uncapped_counts_are_uniform():
    y = _labels(200_000)
    train, test = P.pathological(y, 30, P.make_rng(0, "t"), sample_range=(400, 5000))
    totals = train.sizes() + test.sizes()
    assert totals.min() >= 400 and totals.max() <= 5000 and totals.std() > 500


def test_pathological_other_class_counts():
    y = _labels(20_000)
    train, test = P.pathological(y, 10, P.make_rng(0, "t"), classes_per_client=2)
    for i in range(10):
        own = np.concatenate([train.client(i), test.client(i)])
        assert len(np.unique(y[own])) == 2
    with pytest.raises(FedshiftError, match="classes_per_client"):
        P.pathological(y, 10, P.make_rng(0, "t"), classes_per_client=11)


def test_match_label_mix_follows_client_labels():
    y = _labels(6000)
    pool = _labels(1000, seed=1)
    part = P.dirichlet(y, 8, 0.3, P.make_rng(0, "t"))
    totals = P.apportion(1000, part.sizes())
    m = P.match_label_mix(part, y, pool, totals, P.make_rng(0, "m"))
    assert m.sizes().tolist() == totals.tolist()
    for i in range(8):
        own = np.bincount(y[part.client(i)], minlength=10) / part.sizes()[i]
        drawn = np.bincount(pool[m.client(i)], minlength=10) / m.sizes()[i]
        assert np.abs(own - drawn).max() < 0.01 + 1.0 / m.sizes()[i]
        assert len(np.unique(m.client(i))) == m.sizes()[i]  # no repeats within a client
