"""``cmnist`` / ``cfmnist``: Coloured MNIST and Coloured Fashion-MNIST, federated as in the
thesis (§4.5.2, §4.5.7, §5.6.1) on the construction of Arjovsky et al., "Invariant Risk
Minimization" (arXiv:1907.02893, 2019).

Per image: binary label b = [class ≥ 5] (classes 0–4 → 0, 5–9 → 1), flipped with
probability ``label_noise`` (0.25) to give y; the 28×28 image is down-sampled to 14×14
(every second row and column, as Arjovsky et al.) and put in one of two channels
(0 = red, 1 = green), the other channel zero → 2×14×14. In an environment with parameter
p the image takes its label's colour (y = 0 → green, y = 1 → red) with probability p and
the other colour otherwise, so P(colour agrees with y) = p: the colour is the shortcut.

Federation: ``partitions`` (8) base partitions, each with one training environment (p_tr
∈ {0.90, 0.80}, drawn at random, balanced by default) and 2 classes of label 0 plus 2 of
label 1 (chosen so every class serves the same number of partitions ±1); each class's
images are dealt without replacement to the partitions that hold it, training images from
the official training set, test images from the official test set. ``clients`` must be a
multiple of ``partitions``: client i belongs to partition i // (clients / partitions), and
each partition's training, validation and test images are dealt evenly over its clients
(8 → one client per partition, full participation; 80 → ten per partition, participation
0.1, thesis §4.5.7).

Environments: test ``p=0.0`` … ``p=1.0`` recolour the *same* test images (label noise is
drawn once per image); validation ``p=0.1`` uses ``val_fraction`` of each partition's
training images. ``oracle=true`` colours training images with p = 0.5 (colour independent
of the label, so it carries no information), leaving validation and test environments as
they are: the curve of a model that never saw the shortcut.

``construction = "arjovsky"`` builds instead exactly the dataset of Arjovsky et al. (§5.1 and
their code, facebookresearch/InvariantRiskMinimization, code/colored_mnist/main.py): the
first 50,000 official training images, shuffled (seeded here; the reference's global numpy
shuffle is unseeded), environment k of K = len(p_train) taking images k, k + K, …
(25,000 each for two: the reference's [::2] and [1::2]); label y = [digit < 5] flipped
with probability ``label_noise``; colour c = y flipped with probability 1 − p; the image
kept in channel c, the other zeroed; /255. All ten digits in every environment.
Environment k is dealt evenly over clients k·(clients/K) …; test environments recolour
the remaining 10,000 training images [50000:] (the reference's test set, p = 0.1), dealt
evenly over all clients; no validation environment (the reference has none); ``partitions``,
``classes_per_label``, ``env_assignment``, ``p_val`` and ``val_fraction`` do not apply.
``grayscale = true`` (either construction) sums the two channels into one 1×14×14 image:
the reference's ``--grayscale_model`` oracle, whose input carries no colour.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData, Split
from ..registry import register_scenario
from ._images import (
    balanced_assignment,
    balanced_choice,
    cap_pool,
    deal,
    downsample,
    env_name,
    from_lists,
    load_grey,
    require_probabilities,
    subdivide,
    to_unit,
    two_channel,
)

GREEN, RED = 1, 0
CONSTRUCTIONS = ("thesis", "arjovsky")
ARJOVSKY_TRAIN = 50_000  # the reference trains on images [:50000], tests on [50000:]


@dataclass
class ColouredOptions:
    clients: int = opt(8, "clients, a multiple of partitions (8: thesis; 80: each partition ÷ 10)")
    partitions: int = opt(8, "base partitions, each one training env and 2+2 classes (thesis: 8)")
    participation: float = opt(
        0.0, "fraction of clients per round; 0 = 1.0 if clients == partitions else 0.1"
    )
    p_train: list[float] = opt([0.9, 0.8], "training environments: P(colour agrees with label)")
    env_assignment: str = opt(
        "balanced",
        "how partitions draw their training environment: balanced (shuffled round-robin, "
        "every environment held) or independent (uniform draw per partition)",
        ("balanced", "independent"),
    )
    p_test: list[float] = opt(
        [round(0.1 * i, 1) for i in range(11)], "test environments (same images, recoloured)"
    )
    p_val: float = opt(0.1, "validation environment (model selection, never test)")
    val_fraction: float = opt(0.1, "share of each partition's training images held out for val")
    label_noise: float = opt(0.25, "probability the binary label is flipped (Arjovsky: 0.25)")
    classes_per_label: int = opt(2, "original classes of each binary label per partition (2)")
    samples: int = opt(0, "use at most this many training images in total (0 = all 60,000)")
    test_samples: int = opt(0, "use at most this many test images in total (0 = all 10,000)")
    oracle: bool = opt(False, "shortcut-free variant: training colour independent of the label")
    construction: str = opt(
        "thesis",
        "thesis (2+2 classes per partition, official test set) or arjovsky (Arjovsky et al. "
        "2019: all digits, one client per environment, test = training images 50000:)",
        CONSTRUCTIONS,
    )
    grayscale: bool = opt(False, "sum the colour channels into one grey channel (the oracle)")
    download: bool = opt(False, "download missing MNIST/Fashion-MNIST files (off: offline)")

    def __post_init__(self) -> None:
        require(
            self.construction in CONSTRUCTIONS,
            f"scenario.construction must be one of {CONSTRUCTIONS}",
        )
        require(self.partitions >= 1, f"scenario.partitions={self.partitions} must be >= 1")
        groups = len(self.p_train) if self.construction == "arjovsky" else self.partitions
        require(
            self.clients >= 1 and self.clients % groups == 0,
            f"scenario.clients={self.clients} must be a positive multiple of "
            f"len(scenario.p_train)={groups} (construction arjovsky)",
        )
        require(
            self.construction == "arjovsky" or self.clients % self.partitions == 0,
            f"scenario.clients={self.clients} must be a positive multiple of "
            f"scenario.partitions={self.partitions}",
        )
        require(
            0.0 <= self.participation <= 1.0,
            f"scenario.participation={self.participation} must lie in [0, 1] (0 = auto)",
        )
        for key in ("p_train", "p_test"):
            require_probabilities(key, getattr(self, key))
        require(0.0 <= self.p_val <= 1.0, f"scenario.p_val={self.p_val} must lie in [0, 1]")
        require(
            0.0 <= self.val_fraction < 1.0,
            f"scenario.val_fraction={self.val_fraction} must lie in [0, 1)",
        )
        require(
            0.0 <= self.label_noise <= 0.5,
            f"scenario.label_noise={self.label_noise} must lie in [0, 0.5]",
        )
        require(
            1 <= self.classes_per_label <= 5,
            f"scenario.classes_per_label={self.classes_per_label} must lie in 1..5",
        )
        require(self.samples >= 0, f"scenario.samples={self.samples} must be 0 (all) or more")
        require(self.test_samples >= 0, f"scenario.test_samples={self.test_samples} must be >= 0")

    def rate(self) -> float:
        if self.participation > 0:
            return self.participation
        if self.construction == "arjovsky":
            return 1.0
        return 1.0 if self.clients == self.partitions else 0.1


def binary_labels(classes: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Classes 0–4 → 0, 5–9 → 1, each flipped with probability ``noise``."""
    b = (np.asarray(classes) >= 5).astype(np.int64)
    return b ^ (rng.random(len(b)) < noise).astype(np.int64)


def colour_channels(y: np.ndarray, p, rng: np.random.Generator) -> np.ndarray:
    """Channel per image: the label's colour (0 → green, 1 → red) with probability ``p``
    (scalar or per image), else the other one."""
    y = np.asarray(y, dtype=np.int64)
    agree = rng.random(len(y)) < np.asarray(p, dtype=np.float64)
    own = np.where(y == 0, GREEN, RED)
    return np.where(agree, own, 1 - own)


def class_partition(
    classes: np.ndarray, chosen: np.ndarray, rng: np.random.Generator
) -> P.Partition:
    """Deal the images of each class without replacement, in near-equal shares, to the
    partitions whose row of ``chosen`` lists it."""
    pieces: list[list[np.ndarray]] = [[] for _ in range(chosen.shape[0])]
    for c in np.unique(chosen):
        holders = np.flatnonzero((chosen == c).any(1))
        shares = deal(np.flatnonzero(classes == c), len(holders), rng)
        for h, s in zip(holders, shares, strict=True):
            pieces[h].append(s)
    return from_lists([np.sort(np.concatenate(p)) for p in pieces])


def choose_classes(o: ColouredOptions, rng: np.random.Generator) -> np.ndarray:
    """``[partitions, 2 · classes_per_label]``: per partition, classes of label 0 then 1."""
    low = balanced_choice(5, o.classes_per_label, o.partitions, rng)
    high = balanced_choice(5, o.classes_per_label, o.partitions, rng) + 5
    return np.concatenate([low, high], axis=1)


def build_coloured(name: str, dataset: str, o: ColouredOptions, seed: int, data_dir):
    build = build_arjovsky if o.construction == "arjovsky" else build_thesis
    data = build(name, dataset, o, seed, data_dir)
    return to_grayscale(data) if o.grayscale else data


def to_grayscale(data: FederatedData) -> FederatedData:
    """Every split's two colour channels summed into one (``[n, 1, 14, 14]``)."""

    def grey(s: Split) -> Split:
        return Split(s.x.sum(1, keepdim=True), s.y, s.offsets, s.env)

    return replace(
        data,
        train=grey(data.train),
        test={k: grey(v) for k, v in data.test.items()},
        val={k: grey(v) for k, v in data.val.items()},
        input_shape=(1, *data.input_shape[1:]),
        info={**data.info, "grayscale": True},
    )


def build_arjovsky(name: str, dataset: str, o: ColouredOptions, seed: int, data_dir):
    """Arjovsky et al.'s Coloured MNIST (see the module docstring)."""

    def rng(purpose: str, *extra: int) -> np.random.Generator:
        return P.make_rng(seed, f"{name}/arjovsky/{purpose}", *extra)

    x, digits = load_grey(dataset, True, data_dir, o.download)
    x, digits = to_unit(downsample(x)), digits.numpy()
    envs, ways = len(o.p_train), o.clients // len(o.p_train)
    train_pool = rng("shuffle").permutation(ARJOVSKY_TRAIN)
    if o.samples:
        train_pool = train_pool[: o.samples]
    test_pool = np.arange(ARJOVSKY_TRAIN, len(digits))
    test_pool = test_pool[cap_pool(len(test_pool), o.test_samples, rng("test-samples"))]

    def labels(pool: np.ndarray, purpose: str) -> np.ndarray:  # [digit < 5] xor Bernoulli(noise)
        flip = rng(purpose).random(len(pool)) < o.label_noise
        return (digits[pool] < 5).astype(np.int64) ^ flip.astype(np.int64)

    def coloured(pool: np.ndarray, y: np.ndarray, p, purpose: str, *extra: int) -> Tensor:
        flip = rng(purpose, *extra).random(len(pool)) >= np.asarray(p)  # w.p. 1 − p
        return two_channel(x[torch.from_numpy(pool)], y ^ flip.astype(np.int64))

    env_pools = [train_pool[k::envs] for k in range(envs)]  # reference: [::2], [1::2]
    train_part = from_lists(
        [c for k in range(envs) for c in deal(env_pools[k], ways, rng("clients", k))]
    )
    env = np.repeat(np.arange(o.clients) // ways, train_part.sizes())
    pool = train_part.indices
    y = labels(pool, "label-noise")
    p_img = np.full(len(pool), 0.5) if o.oracle else np.asarray(o.p_train)[env]
    train = Split(
        coloured(pool, y, p_img, "train-colours"),
        torch.from_numpy(y),
        torch.from_numpy(train_part.offsets),
        torch.from_numpy(env),
    )
    test_part = from_lists(deal(test_pool, o.clients, rng("test-clients")))
    ty = labels(test_part.indices, "test-label-noise")

    def environment(p: float) -> Split:  # seeded by p: "p=0.1" is the same whatever is listed
        xx = coloured(test_part.indices, ty, p, "test", int(round(p * 1_000_000)))
        return Split(xx, torch.from_numpy(ty), torch.from_numpy(test_part.offsets))

    return FederatedData(
        name=name,
        num_classes=2,
        input_shape=(2, 14, 14),
        train=train,
        test={env_name(p): environment(p) for p in o.p_test},
        train_env_names=[env_name(p) for p in o.p_train],
        default_model="mlp",
        participation=o.rate(),
        info={
            "dataset": dataset,
            "construction": "arjovsky",
            "oracle": o.oracle,
            "label_noise": o.label_noise,
            "label_rule": "y = [digit < 5] xor Bernoulli(label_noise); channel = y xor "
            "Bernoulli(1 - p) (Arjovsky et al. 2019 reference code)",
            "client_train_env": [env_name(o.p_train[k // ways]) for k in range(o.clients)],
            "channels": ["channel 0 (label-0 colour)", "channel 1 (label-1 colour)"],
        },
    )


def build_thesis(name: str, dataset: str, o: ColouredOptions, seed: int, data_dir):
    def rng(purpose: str, *extra: int) -> np.random.Generator:
        return P.make_rng(seed, f"{name}/{purpose}", *extra)

    x, cls = load_grey(dataset, True, data_dir, o.download)
    tx, tcls = load_grey(dataset, False, data_dir, o.download)
    x, tx = to_unit(downsample(x)), to_unit(downsample(tx))
    cls, tcls = cls.numpy(), tcls.numpy()

    chosen = choose_classes(o, rng("classes"))
    pool = cap_pool(len(cls), o.samples, rng("samples"))
    tpool = cap_pool(len(tcls), o.test_samples, rng("test-samples"))
    parts = class_partition(cls[pool], chosen, rng("partition")).remap(pool)
    tparts = class_partition(tcls[tpool], chosen, rng("test-partition")).remap(tpool)
    parts, vparts = P.split_fraction(parts, o.val_fraction, rng("val-split"))

    ways = o.clients // o.partitions
    train_part = subdivide(parts, ways, rng("clients"))
    val_part = subdivide(vparts, ways, rng("val-clients"))
    test_part = subdivide(tparts, ways, rng("test-clients"))
    partition_of = np.arange(o.clients) // ways

    if o.env_assignment == "balanced":
        part_env = balanced_assignment(o.partitions, len(o.p_train), rng("envs"))
    else:
        part_env = rng("envs").integers(0, len(o.p_train), size=o.partitions)
    client_env = part_env[partition_of]

    # label noise: drawn once per image of each pool (so test environments share labels)
    y_train = binary_labels(cls, o.label_noise, rng("label-noise"))
    y_test = binary_labels(tcls, o.label_noise, rng("test-label-noise"))

    env = np.repeat(client_env, train_part.sizes())
    ty = y_train[train_part.indices]
    p_img = np.full(len(ty), 0.5) if o.oracle else np.asarray(o.p_train)[env]
    channels = colour_channels(ty, p_img, rng("train-colours"))
    train = Split(
        two_channel(x[torch.from_numpy(train_part.indices)], channels),
        torch.from_numpy(ty),
        torch.from_numpy(train_part.offsets),
        torch.from_numpy(env),
    )

    def environment(images, labels, part: P.Partition, p: float, purpose: str) -> Split:
        # seeded by the value of p, so "p=0.3" is the same whatever else is listed
        yy = labels[part.indices]
        ch = colour_channels(yy, p, rng(purpose, int(round(p * 1_000_000))))
        xx = two_channel(images[torch.from_numpy(part.indices)], ch)
        return Split(xx, torch.from_numpy(yy), torch.from_numpy(part.offsets))

    test = {env_name(p): environment(tx, y_test, test_part, p, "test") for p in o.p_test}
    val = {env_name(o.p_val): environment(x, y_train, val_part, o.p_val, "val")}
    client_classes = chosen[partition_of].tolist()
    return FederatedData(
        name=name,
        num_classes=2,
        input_shape=(2, 14, 14),
        train=train,
        test=test,
        val=val,
        train_env_names=[env_name(p) for p in o.p_train],
        default_model="mlp",
        participation=o.rate(),
        info={
            "dataset": dataset,
            "oracle": o.oracle,
            "oracle_rule": "training images coloured with p = 0.5 (colour independent of the "
            "label); validation and test environments unchanged",
            "label_noise": o.label_noise,
            "client_train_env": [env_name(o.p_train[e]) for e in client_env],
            "client_partition": partition_of.tolist(),
            "client_classes": client_classes,
            "channels": ["red", "green"],
        },
    )


@register_scenario(
    "cmnist",
    ColouredOptions,
    "Coloured MNIST (thesis §4.5.2): binary label, colour shortcut, 2 training envs, "
    "test p=0.0…1.0, 2+2 digits per client",
)
def build_cmnist(o: ColouredOptions, seed: int, data_dir: Path | None) -> FederatedData:
    return build_coloured("cmnist", "mnist", o, seed, data_dir)


@register_scenario(
    "cfmnist",
    ColouredOptions,
    "Coloured Fashion-MNIST (thesis §4.5.2): cmnist's construction on Fashion-MNIST",
)
def build_cfmnist(o: ColouredOptions, seed: int, data_dir: Path | None) -> FederatedData:
    return build_coloured("cfmnist", "fmnist", o, seed, data_dir)
