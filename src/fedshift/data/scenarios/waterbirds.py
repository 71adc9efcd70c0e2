"""``waterbirds``: birds on land / water backgrounds (Sagawa et al. 2020), the background
a shortcut for the landbird / waterbird label (thesis §4.5.2; PerInvFL §5.1, Table 6).

Built from the released ``waterbird_complete95_forest2water2`` folder, or from raw
CUB-200-2011 + Places365 images, which :mod:`fedshift.data.waterbirds_build` first turns into
a folder of the same layout (Sagawa et al.'s procedure). Its images are
composites with a fixed background, so an environment with parameter p is made by
**choosing** images: for each label, a fraction p of the environment's images have the
"agreeing" background (water for waterbirds, land for landbirds) and 1 − p the other one.
Training environments take as many images of a client's training pool as the pool allows
for that p; every test environment of a client draws the same number of images per label
(the smaller of its agreeing and disagreeing test pools), seeded by the value of p.

``variant = "thesis"`` (default): 8 clients, each with one training environment drawn from
p_tr ∈ {0.95, 0.85}; test environments p_te = 0.0, 0.1, …, 1.0, validation p = 0.1; each
client holds 15 waterbird species (5 shared by all clients, 10 own) and 51 landbird
species (17 shared, 34 own), and its train and test images come from the same species
(``test_fraction`` of each species' images go to test). The release has 46 waterbird and
154 landbird species, fewer than 8 × 10 own species, so "own" species are dealt
round-robin from a seeded permutation of the non-shared ones: each is owned by as few
clients as possible (our reading). ``variant = "perinvfl"``: 4 clients with p_tr = 0.95,
0.90, 0.85, 0.80 (client k the k-th), test p_te = 0.1 … 0.5; client k's birds come from
the k-th CUB index range [0, 1715], [1716, 2908], [2909, 3844], [3845, 5993] of CUB's
5,994 training images — the release mixes CUB's train and test images, so we use the same
fractions of the species-ordered list of all released images — with 400 training and 100
test images per client.

``oracle = true`` makes the training background independent of the label (p = 0.5 for
every training environment); the thesis removes the background instead, which the
released composites do not allow. Images are resized to ``image_size`` (default 64 px).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData, Split
from ..imagefolder import load_waterbirds_images, waterbirds_metadata
from ..registry import register_scenario
from ._images import env_name

PERINVFL_RANGES = ((0, 1715), (1716, 2908), (2909, 3844), (3845, 5993))
PERINVFL_TOTAL = 5994
VARIANTS = {
    "thesis": {"clients": 8, "p_train": [0.95, 0.85], "p_test": [i / 10 for i in range(11)]},
    "perinvfl": {
        "clients": 4,
        "p_train": [0.95, 0.90, 0.85, 0.80],
        "p_test": [0.1, 0.2, 0.3, 0.4, 0.5],
    },
}


@dataclass
class WaterbirdsOptions:
    variant: str = opt("thesis", "thesis (8 clients, species split) or perinvfl", tuple(VARIANTS))
    clients: int = opt(
        0,
        "clients (0 = partitions); a multiple of partitions splits each "
        "partition's data over clients / partitions clients",
    )
    partitions: int = opt(
        0,
        "base partitions, one training environment each (0 = thesis 8, "
        "perinvfl 4); thesis §4.5.7: 80 clients = 8 partitions × 10",
    )
    p_train: list[float] = opt([], "training environments (empty = thesis [0.95, 0.85])")
    p_test: list[float] = opt([], "test environments (empty = thesis 0.0…1.0, perinvfl 0.1…0.5)")
    p_val: float = opt(0.1, "validation environment (model selection, never test)")
    waterbird_species: list[int] = opt([5, 10], "[shared, own] waterbird species per client")
    landbird_species: list[int] = opt([17, 34], "[shared, own] landbird species per client")
    test_fraction: float = opt(0.2, "thesis: fraction of each species' images used for test")
    per_client: list[int] = opt([400, 100], "perinvfl: [train, test] images per client")
    image_size: int = opt(64, "images are resized to image_size × image_size (RGB)")
    oracle: bool = opt(False, "background independent of the label in training (p = 0.5)")
    participation: float = opt(1.0, "default fraction of clients sampled per round")

    def __post_init__(self) -> None:
        v = VARIANTS[self.variant]
        self.partitions = self.partitions or v["clients"]
        self.clients = self.clients or self.partitions
        self.p_train = list(self.p_train) or list(v["p_train"])
        self.p_test = list(self.p_test) or list(v["p_test"])
        require(self.clients >= 1, f"scenario.clients={self.clients} must be at least 1")
        for key in ("p_train", "p_test"):
            ps = getattr(self, key)
            require(all(0.0 <= p <= 1.0 for p in ps), f"scenario.{key}={ps} must lie in [0, 1]")
        require(
            len({env_name(p) for p in self.p_test}) == len(self.p_test),
            "scenario.p_test must not repeat a value",
        )
        require(0.0 <= self.p_val <= 1.0, "scenario.p_val must lie in [0, 1]")
        for key in ("waterbird_species", "landbird_species", "per_client"):
            val = getattr(self, key)
            require(
                len(val) == 2 and min(val) >= 0 and sum(val) > 0,
                f"scenario.{key}={val} must be two non-negative counts, not both 0",
            )
        require(0.0 < self.test_fraction < 1.0, "scenario.test_fraction must lie in (0, 1)")
        require(8 <= self.image_size <= 512, "scenario.image_size must lie in 8..512")
        require(0.0 < self.participation <= 1.0, "scenario.participation must lie in (0, 1]")
        if self.variant == "perinvfl":
            require(
                len(self.p_train) == self.partitions,
                f"scenario.p_train must list one value per partition ({self.partitions})",
            )
        require(
            self.partitions >= 1 and self.clients % self.partitions == 0,
            f"scenario.clients={self.clients} must be a multiple of partitions={self.partitions}",
        )


def _choose(idx: np.ndarray, y: np.ndarray, place: np.ndarray, p: float, n: dict | None, rng):
    """Images of ``idx`` forming an environment with P(background agrees) = p per label;
    ``n[label]`` images per label, or (``n`` None) as many as the pool allows."""
    out = []
    for label in (0, 1):
        agree = rng.permutation(idx[(y[idx] == label) & (place[idx] == label)])
        other = rng.permutation(idx[(y[idx] == label) & (place[idx] != label)])
        if n is None:
            cap_a = len(agree) / p if p > 0 else np.inf
            cap_o = len(other) / (1 - p) if p < 1 else np.inf
            k = int(min(cap_a, cap_o, len(agree) + len(other)))
        else:
            k = n[label]
        n_a = min(int(round(p * k)), len(agree))
        n_o = min(k - n_a, len(other))
        out += [agree[:n_a], other[:n_o]]
    return np.sort(np.concatenate(out)).astype(np.int64)


def _species_pools(meta, o, seed) -> list[np.ndarray]:
    """Image indices each client may use (thesis species split or PerInvFL ranges)."""
    if o.variant == "perinvfl":
        order = np.argsort(meta.species, kind="stable")  # species-ordered, as CUB's list
        n = len(order)
        pools = []
        for k in range(o.partitions):
            lo, hi = PERINVFL_RANGES[k % len(PERINVFL_RANGES)]
            a = int(round(lo / PERINVFL_TOTAL * n))
            b = int(round((hi + 1) / PERINVFL_TOTAL * n))
            pools.append(order[a:b])
        return pools
    pools = []
    chosen = []
    for label, (shared, own) in ((1, o.waterbird_species), (0, o.landbird_species)):
        species = np.unique(meta.species[meta.y == label])
        perm = P.make_rng(seed, "waterbirds/species", label).permutation(species)
        require(
            shared + min(own, 1) <= len(perm),
            f"{shared} shared species leave none to own among {len(perm)}",
        )
        common, rest = perm[:shared], perm[shared:]
        per_client = [
            np.concatenate([common, rest[(k * own + np.arange(own)) % len(rest)]])
            if own
            else common
            for k in range(o.partitions)
        ]
        chosen.append(per_client)
    for k in range(o.partitions):
        sp = np.concatenate([chosen[0][k], chosen[1][k]])
        pools.append(np.flatnonzero(np.isin(meta.species, sp)))
    return pools


@register_scenario(
    "waterbirds",
    WaterbirdsOptions,
    "WaterBirds: background agrees with the bird type w.p. p; thesis or PerInvFL variant",
)
def build_waterbirds(o: WaterbirdsOptions, seed: int, data_dir: Path | None) -> FederatedData:
    meta = waterbirds_metadata(data_dir)
    y, place = meta.y, meta.place
    pools = _species_pools(meta, o, seed)
    if o.variant == "perinvfl":
        client_env = np.arange(o.partitions) % len(o.p_train)
    else:
        order = P.make_rng(seed, "waterbirds/envs").permutation(o.partitions)
        client_env = np.empty(o.partitions, dtype=np.int64)
        client_env[order] = np.arange(o.partitions) % len(o.p_train)

    train_idx, val_idx, tests = [], [], []
    for k, pool in enumerate(pools):
        rng = P.make_rng(seed, "waterbirds/split", k)
        if o.variant == "perinvfl":
            pool = rng.permutation(pool)
            n_te = o.per_client[1]
            tr_pool, te_pool = pool[n_te:], pool[:n_te]
        else:  # per species, test_fraction of its images go to test
            te_mask = np.zeros(len(pool), dtype=bool)
            for s in np.unique(meta.species[pool]):
                where = rng.permutation(np.flatnonzero(meta.species[pool] == s))
                te_mask[where[: int(round(o.test_fraction * len(where)))]] = True
            tr_pool, te_pool = pool[~te_mask], pool[te_mask]
        p_tr = 0.5 if o.oracle else o.p_train[client_env[k]]
        tr = _choose(tr_pool, y, place, p_tr, None, P.make_rng(seed, "waterbirds/train", k))
        if o.variant == "perinvfl":
            tr = rng.permutation(tr)[: o.per_client[0]]
        # validation: a tenth of the training images, re-drawn at p_val from what is left
        test_n = {
            lab: int(
                min(
                    ((y[te_pool] == lab) & (place[te_pool] == lab)).sum(),
                    ((y[te_pool] == lab) & (place[te_pool] != lab)).sum(),
                )
            )
            for lab in (0, 1)
        }
        if o.variant == "perinvfl":  # 100 test images per client, split over the labels
            total = max(sum(test_n.values()), 1)
            test_n = {
                lab: min(test_n[lab], round(o.per_client[1] * test_n[lab] / total))
                for lab in (0, 1)
            }
        train_idx.append(tr)
        val_idx.append(tr_pool[~np.isin(tr_pool, tr)])
        tests.append((te_pool, test_n))

    # decode every image used once
    env_sets = {}
    for p in o.p_test:
        env_sets[env_name(p)] = [
            _choose(te, y, place, p, n, P.make_rng(seed, "waterbirds/test", k, round(p * 1e6)))
            for k, (te, n) in enumerate(tests)
        ]
    val_n = [{lab: max(1, int((y[v] == lab).sum()) // 10) for lab in (0, 1)} for v in val_idx]
    val_sets = [
        _choose(v, y, place, o.p_val, n, P.make_rng(seed, "waterbirds/val", k)) if len(v) else v
        for k, (v, n) in enumerate(zip(val_idx, val_n, strict=True))
    ]
    if o.clients > o.partitions:  # thesis §4.5.7: deal each partition over `ways` clients
        ways = o.clients // o.partitions

        def deal(sets, purpose):
            out = []
            for k, ix in enumerate(sets):
                perm = P.make_rng(seed, f"waterbirds/deal/{purpose}", k).permutation(ix)
                out += [np.sort(part) for part in np.array_split(perm, ways)]
            return out

        train_idx = deal(train_idx, "train")
        val_sets = deal(val_sets, "val")
        env_sets = {name: deal(sets, name) for name, sets in env_sets.items()}
        client_env = np.repeat(client_env, ways)
    used = np.unique(
        np.concatenate(train_idx + val_sets + [i for s in env_sets.values() for i in s])
    )
    pixels = load_waterbirds_images(meta, used, o.image_size).float().div_(255.0)
    where = {int(i): j for j, i in enumerate(used)}

    def split(parts, env=None):
        return Split.from_clients(
            [(pixels[[where[int(i)] for i in ix]], torch.from_numpy(y[ix])) for ix in parts], env
        )

    envs = [torch.full((len(t),), int(client_env[k])) for k, t in enumerate(train_idx)]
    p_names = [env_name(p) for p in o.p_train]
    return FederatedData(
        name="waterbirds",
        num_classes=2,
        input_shape=(3, o.image_size, o.image_size),
        train=split(train_idx, envs),
        test={name: split(sets) for name, sets in env_sets.items()},
        val={env_name(o.p_val): split(val_sets)},
        train_env_names=p_names,
        default_model="dfl-cnn",
        participation=o.participation,
        info={
            "dataset": "waterbirds (released composites, resampled per environment)",
            "variant": o.variant,
            "oracle": o.oracle,
            "client_train_env": [p_names[e] for e in client_env],
        },
    )
