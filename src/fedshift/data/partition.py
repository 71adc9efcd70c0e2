"""Seeded, vectorised partitioners: which sample indices each client gets.

A :class:`Partition` is stored like :class:`~fedshift.data.federated.Split` (indices
flat, client ``i`` owning ``indices[offsets[i]:offsets[i+1]]``), so a scenario turns it
into tensors with one gather. Every partitioner takes an explicit numpy ``Generator``
(see :func:`make_rng`) and draws a fixed number of random numbers: no rejection loops, so
it cannot hang at 1,000+ clients or tiny Dirichlet concentrations, and the same seed
always gives the same partition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FedshiftError
from ..seeding import purpose_code, stream


def make_rng(seed: int, purpose: str, *extra: int) -> np.random.Generator:
    """A generator private to ``(seed, purpose, *extra)``: independent streams per purpose,
    so adding a random draw in one place never shifts the numbers drawn in another."""
    return stream(int(seed) % 2**64, purpose_code(purpose), *(int(e) % 2**64 for e in extra))


def _offsets(sizes: np.ndarray) -> np.ndarray:
    out = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


@dataclass(frozen=True)
class Partition:
    """Client ``i`` owns ``indices[offsets[i]:offsets[i+1]]`` (int64 sample indices)."""

    indices: np.ndarray
    offsets: np.ndarray

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def client(self, i: int) -> np.ndarray:
        return self.indices[self.offsets[i] : self.offsets[i + 1]]

    def owners(self) -> np.ndarray:
        """The client of each entry of ``indices``."""
        return np.repeat(np.arange(self.num_clients), self.sizes())

    def remap(self, pool: np.ndarray) -> Partition:
        """Indices into ``pool`` → indices into what ``pool`` indexes."""
        return Partition(np.asarray(pool)[self.indices], self.offsets)

    @staticmethod
    def from_owner(
        owner: np.ndarray, num_clients: int, rng: np.random.Generator | None = None
    ) -> Partition:
        """Sample ``j`` goes to client ``owner[j]`` (``-1``: unused); with ``rng`` each
        client's samples come in random order, else in index order."""
        owner = np.asarray(owner, dtype=np.int64)
        idx = np.flatnonzero(owner >= 0)
        o = owner[idx]
        order = (
            np.lexsort((rng.random(len(o)), o)) if rng is not None else np.argsort(o, kind="stable")
        )
        sizes = np.bincount(o, minlength=num_clients)
        return Partition(idx[order].astype(np.int64), _offsets(sizes))


def apportion(total, weights) -> np.ndarray:
    """Integers proportional to ``weights`` summing to ``total`` (largest remainders,
    ties to the lower index), row-wise for 2-D ``weights``; never above ``weights`` when
    ``total <= weights.sum()``. Rows of zero weight get zero."""
    w = np.asarray(weights, dtype=np.float64)
    s = w.sum(-1)
    total = np.where(s > 0, np.asarray(total, dtype=np.int64), 0)
    q = total[..., None] * w / np.where(s > 0, s, 1.0)[..., None]
    base = np.floor(q).astype(np.int64)
    rem = np.maximum(total - base.sum(-1), 0)
    order = np.argsort(-(q - base), axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(w.shape[-1]), order.shape), -1)
    return base + (rank < rem[..., None])


def take(
    part: Partition, counts: np.ndarray, rng: np.random.Generator
) -> tuple[Partition, Partition]:
    """Split each client: ``counts[i]`` of its samples, chosen at random, form the second
    partition; the rest form the first."""
    sizes = part.sizes()
    counts = np.asarray(counts, dtype=np.int64)
    if np.any(counts < 0) or np.any(counts > sizes):
        raise ValueError("take: counts must lie between 0 and each client's size")
    owner = part.owners()
    order = np.lexsort((rng.random(len(owner)), owner))  # same groups, random order inside
    rank = np.arange(len(owner)) - part.offsets[owner]
    chosen = rank < counts[owner]
    shuffled = part.indices[order]
    return (
        Partition(shuffled[~chosen], _offsets(sizes - counts)),
        Partition(shuffled[chosen], _offsets(counts)),
    )


def split_fraction(
    part: Partition, fraction: float, rng: np.random.Generator, keep_min: int = 1
) -> tuple[Partition, Partition]:
    """Move ``round(fraction · size)`` random samples of each client to a second partition,
    leaving at least ``keep_min`` in the first (when the client has that many)."""
    sizes = part.sizes()
    counts = np.floor(fraction * sizes + 0.5).astype(np.int64)
    counts = np.minimum(counts, np.maximum(sizes - keep_min, 0))
    return take(part, counts, rng)


def _check_clients(n: int, num_clients: int, min_samples: int) -> None:
    if num_clients < 1:
        raise FedshiftError(f"clients={num_clients} must be at least 1")
    if n < num_clients * min_samples:
        raise FedshiftError(
            f"{n} samples cannot give {num_clients} clients at least {min_samples} each; "
            "use fewer clients, more samples or a smaller minimum"
        )


def iid(n: int, num_clients: int, rng: np.random.Generator, min_samples: int = 1) -> Partition:
    """Samples ``0..n-1`` shuffled and dealt into near-equal parts (sizes differ by ≤ 1)."""
    _check_clients(n, num_clients, min_samples)
    sizes = np.full(num_clients, n // num_clients, dtype=np.int64)
    sizes[: n % num_clients] += 1
    return Partition(rng.permutation(n).astype(np.int64), _offsets(sizes))


def _dirichlet_rows(rng: np.random.Generator, alpha: float, rows: int, k: int) -> np.ndarray:
    p = rng.dirichlet(np.full(k, float(alpha)), size=rows)
    bad = ~np.isfinite(p).all(1) | (p.sum(1) <= 0)  # underflow at extreme alpha
    if bad.any():
        p[bad] = np.eye(k)[rng.integers(k, size=int(bad.sum()))]
    return p / p.sum(1, keepdims=True)


def _ensure_min(owner: np.ndarray, num_clients: int, min_samples: int, rng) -> None:
    """Top up clients below ``min_samples`` with samples taken at random from the clients
    above it, each donor giving in proportion to its surplus (largest-remainder rounding);
    one pass, no retries. Needs ``len(owner) >= num_clients * min_samples``."""
    sizes = np.bincount(owner, minlength=num_clients)
    need = np.maximum(min_samples - sizes, 0)
    if need.sum() == 0:
        return
    surplus = np.maximum(sizes - min_samples, 0)
    give = apportion(int(need.sum()), surplus)
    order = np.lexsort((rng.random(len(owner)), owner))
    grouped = owner[order]
    rank = np.arange(len(owner)) - _offsets(sizes)[grouped]
    released = rng.permutation(order[rank < give[grouped]])
    owner[released] = np.repeat(np.arange(num_clients), need)


def _draw_with_supply(
    rng: np.random.Generator, probs: np.ndarray, sizes: np.ndarray, supply: np.ndarray
) -> np.ndarray:
    """Counts ``[N, K]``: client ``i`` draws ``sizes[i]`` labels from ``probs[i]``, never
    taking more of a class than ``supply`` holds (needs ``sizes.sum() <= supply.sum()``).

    Each pass draws every unfinished client's missing samples from its own proportions
    restricted to the classes that still have samples (uniformly over them if it puts no
    weight there); where a class is over-asked, the excess is removed from its requesters
    at random (multivariate hypergeometric). A pass either finishes every client or
    exhausts a class, so at most K + 1 passes run.
    """
    counts = np.zeros(probs.shape, dtype=np.int64)
    need = np.asarray(sizes, dtype=np.int64).copy()
    left = np.asarray(supply, dtype=np.int64).copy()
    for _ in range(probs.shape[1] + 1):
        active = np.flatnonzero(need > 0)
        if len(active) == 0:
            break
        w = probs[active] * (left > 0)
        empty = w.sum(1) <= 0
        w[empty] = left > 0
        draw = rng.multinomial(need[active], w / w.sum(1, keepdims=True))
        excess = draw.sum(0) - left
        for c in np.flatnonzero(excess > 0):
            draw[:, c] -= rng.multivariate_hypergeometric(draw[:, c], int(excess[c]))
        counts[active] += draw
        need[active] -= draw.sum(1)
        left -= draw.sum(0)
    if need.any():  # unreachable when sizes.sum() <= supply.sum()
        raise RuntimeError("class supply ran out before every client was served")
    return counts


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_samples: int = 1,
    proportions: str = "per-client",
) -> Partition:
    """Label-skewed partition of ``labels`` driven by Dirichlet(``alpha``) draws.

    ``per-client`` (Hsu et al. 2019): client ``i`` draws label proportions
    ``p_i ~ Dir(alpha·1)`` and ``n_i = ⌊M/N⌋`` or ``⌈M/N⌉`` samples ~ Multinomial(n_i, p_i).
    Where a class is asked for more than it holds, the excess is removed from its
    requesters at random and they redraw from their own proportions over the classes that
    still have samples (see :func:`_draw_with_supply`). Every sample is used exactly once.

    ``per-class`` (as in NIID-Bench, PFLlib): each class is split over the clients with
    ``q_c ~ Dir(alpha·1_N)``; client sizes vary and, at small ``alpha``, many clients get
    nothing, so clients below ``min_samples`` are topped up from the others (see
    :func:`_ensure_min`) instead of redrawing until the minimum holds.
    """
    y = np.asarray(labels)
    m = len(y)
    if not alpha > 0:
        raise FedshiftError(f"alpha={alpha} must be positive")
    _check_clients(m, num_clients, min_samples)
    _, yc = np.unique(y, return_inverse=True)
    k = int(yc.max()) + 1
    supply = np.bincount(yc, minlength=k)
    by_class = np.lexsort((rng.random(m), yc))  # grouped by class, shuffled inside
    class_start = _offsets(supply)
    if proportions == "per-client":
        sizes = np.full(num_clients, m // num_clients, dtype=np.int64)
        sizes[rng.permutation(num_clients)[: m % num_clients]] += 1
        want = _draw_with_supply(rng, _dirichlet_rows(rng, alpha, num_clients, k), sizes, supply)
    elif proportions == "per-class":
        want = rng.multinomial(supply, _dirichlet_rows(rng, alpha, k, num_clients)).T
    else:
        raise FedshiftError(
            f"proportions={proportions!r} is not allowed; choose per-client or per-class"
        )
    owner_sorted = np.full(m, -1, dtype=np.int64)
    for c in range(k):
        got = want[:, c]
        start = class_start[c]
        owner_sorted[start : start + got.sum()] = np.repeat(np.arange(num_clients), got)
    owner = np.empty(m, dtype=np.int64)
    owner[by_class] = owner_sorted
    _ensure_min(owner, num_clients, min_samples, rng)
    return Partition.from_owner(owner, num_clients, rng)


def pathological(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    classes_per_client: int = 3,
    sample_range: tuple[int, int] = (400, 5000),
    test_fraction: float = 0.25,
) -> tuple[Partition, Partition]:
    """Pathological class split (CGPFL §3.8.1): ``(train, test)`` partitions.

    Each client gets ``classes_per_client`` distinct classes (chosen at random among the
    least-used classes so far, so every class serves about the same number of clients) and
    ``n_i ~ U[lo, hi]`` samples split evenly over its classes. Where a class cannot supply
    every request, requests above the per-class share of ``lo`` are scaled down in
    proportion, keeping every client within ``[lo, hi]``; only when even those shares
    exceed the class is everything scaled down (clients then fall below ``lo``). Each
    client's samples are then split ``1 - test_fraction`` / ``test_fraction`` at random.
    """
    y = np.asarray(labels)
    lo, hi = (int(v) for v in sample_range)
    if not 1 <= lo <= hi:
        raise FedshiftError(f"samples per client [{lo}, {hi}] must satisfy 1 <= low <= high")
    _, yc = np.unique(y, return_inverse=True)
    k_all = int(yc.max()) + 1
    k = int(classes_per_client)
    if not 1 <= k <= k_all:
        raise FedshiftError(f"classes_per_client={k} must lie between 1 and {k_all}")
    if num_clients < 1:
        raise FedshiftError(f"clients={num_clients} must be at least 1")
    supply = np.bincount(yc, minlength=k_all)

    usage = np.zeros(k_all)
    noise = rng.random((num_clients, k_all))  # tie-breaks among equally used classes
    chosen = np.empty((num_clients, k), dtype=np.int64)
    for i in range(num_clients):
        pick = np.argsort(usage + noise[i], kind="stable")[:k]
        chosen[i] = pick
        usage[pick] += 1

    n = rng.integers(lo, hi + 1, size=num_clients)
    j = np.arange(k)
    rows = np.arange(num_clients)[:, None]
    want = np.zeros((num_clients, k_all), dtype=np.int64)
    floor = np.zeros((num_clients, k_all), dtype=np.int64)
    want[rows, chosen] = n[:, None] // k + (j < n[:, None] % k)
    floor[rows, chosen] = lo // k + (j < lo % k)
    for c in np.flatnonzero(want.sum(0) > supply):
        if floor[:, c].sum() <= supply[c]:
            want[:, c] = floor[:, c] + apportion(
                supply[c] - floor[:, c].sum(), want[:, c] - floor[:, c]
            )
        else:
            want[:, c] = apportion(supply[c], want[:, c])

    by_class = np.lexsort((rng.random(len(yc)), yc))
    class_start = _offsets(supply)
    owner_sorted = np.full(len(yc), -1, dtype=np.int64)
    for c in range(k_all):
        got = want[:, c]
        start = class_start[c]
        owner_sorted[start : start + got.sum()] = np.repeat(np.arange(num_clients), got)
    owner = np.empty(len(yc), dtype=np.int64)
    owner[by_class] = owner_sorted
    whole = Partition.from_owner(owner, num_clients, rng)
    counts = np.floor(test_fraction * whole.sizes() + 0.5).astype(np.int64)
    return take(whole, counts, rng)


def match_label_mix(
    part: Partition,
    labels: np.ndarray,
    pool_labels: np.ndarray,
    totals: np.ndarray,
    rng: np.random.Generator,
) -> Partition:
    """Draw ``totals[i]`` samples of ``pool_labels`` for each client with the label mix of
    its samples in ``part`` (over ``labels``), largest-remainder rounded.

    Clients take consecutive runs of each class's shuffled pool, so their draws are
    disjoint unless a class is asked for more than the pool holds, in which case the pool
    is reused cyclically (never twice within one client: a client's request is capped at
    the class size).
    """
    labels = np.asarray(labels)
    pool_labels = np.asarray(pool_labels)
    n_clients = part.num_clients
    k = int(max(labels.max(initial=0), pool_labels.max(initial=0))) + 1
    counts = np.bincount(part.owners() * k + labels[part.indices], minlength=n_clients * k).reshape(
        n_clients, k
    )
    supply = np.bincount(pool_labels, minlength=k)
    want = np.minimum(apportion(np.asarray(totals), counts), supply)
    by_class = np.lexsort((rng.random(len(pool_labels)), pool_labels))
    class_start = _offsets(supply)
    owners, picked = [], []
    for c in range(k):
        got = want[:, c]
        t = int(got.sum())
        if t:
            owners.append(np.repeat(np.arange(n_clients), got))
            picked.append(by_class[class_start[c] + np.arange(t) % supply[c]])
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    idx = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
    order = np.lexsort((rng.random(len(owner)), owner))
    return Partition(idx[order].astype(np.int64), _offsets(want.sum(1)))
