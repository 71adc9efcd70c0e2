"""Train–train shift scenarios (SPEC §2.1) on MNIST, Fashion-MNIST, scikit-learn digits,
CIFAR-10 or EMNIST: ``iid``, ``dirichlet`` (label shift) and ``pathological`` (few classes
per client). CIFAR-10 images are ``3×32×32``; EMNIST uses the split ``emnist_split``
(balanced: 47 classes, letters: 26, digits: 10) — UCFL's character/digit task.

Each client gets one test environment, ``test``, and a validation split, ``val`` (a random
``val_fraction`` of its training data). For ``iid``/``dirichlet`` a client's test set is
drawn from the official test set with the label mix of its training data, so it measures
the client's own distribution; the official test set is split in proportion to client
sizes. ``pathological`` splits each client's own samples 75/25, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...options import opt, require
from .. import partition as P
from ..cifar import load_cifar10
from ..digits import load_digits
from ..emnist import SPLITS as EMNIST_SPLITS
from ..emnist import load_emnist
from ..federated import FederatedData, Split
from ..idx import load_idx_dataset
from ..partition_file import ClientPartition, labels_digest
from ..registry import register_scenario

DATASETS = ("mnist", "fmnist", "digits", "cifar10", "emnist")
NUM_CLASSES = 10


def num_classes(dataset: str, emnist_split: str = "balanced") -> int:
    return EMNIST_SPLITS[emnist_split][0] if dataset == "emnist" else NUM_CLASSES


def require_split_options(val_fraction: float, participation: float) -> None:
    """The checks every image scenario with a validation share and a participation makes."""
    require(0.0 <= val_fraction < 1.0, f"scenario.val_fraction={val_fraction} must lie in [0, 1)")
    require(
        0.0 < participation <= 1.0,
        f"scenario.participation={participation} must lie in (0, 1]",
    )


@dataclass
class _ImageOptions:
    dataset: str = opt(
        "mnist", "images: MNIST, Fashion-MNIST, sklearn digits, CIFAR-10 or EMNIST", DATASETS
    )
    emnist_split: str = opt(
        "balanced", "EMNIST split when dataset = emnist", ("balanced", "letters", "digits")
    )
    clients: int = opt(20, "number of clients")
    samples: int = opt(0, "use at most this many training images in total (0 = all)")
    val_fraction: float = opt(0.1, "fraction of each client's training data held out as 'val'")
    participation: float = opt(1.0, "default fraction of clients sampled per round")
    download: bool = opt(False, "download missing dataset files (off: offline)")

    def __post_init__(self) -> None:
        require(self.clients >= 1, f"scenario.clients={self.clients} must be at least 1")
        require(self.samples >= 0, f"scenario.samples={self.samples} must be 0 (all) or more")
        require_split_options(self.val_fraction, self.participation)


@dataclass
class IIDOptions(_ImageOptions):
    clients: int = opt(20, "number of clients")


@dataclass
class DirichletOptions(_ImageOptions):
    clients: int = opt(20, "number of clients (UCFL §V-A: 20 users)")
    samples: int = opt(10_000, "training images in total, 0 = all (UCFL §V-A: 10k)")
    alpha: float = opt(0.4, "Dirichlet concentration; smaller = more label skew (UCFL: 0.4)")
    proportions: str = opt(
        "per-client",
        "per-client: each client's label mix ~ Dir(alpha), equal sizes; "
        "per-class: each class split over clients ~ Dir(alpha), unequal sizes",
        ("per-client", "per-class"),
    )
    min_samples: int = opt(10, "every client gets at least this many training images")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.alpha > 0, f"scenario.alpha={self.alpha} must be positive")
        require(self.min_samples >= 1, f"scenario.min_samples={self.min_samples} must be >= 1")


@dataclass
class PathologicalOptions(_ImageOptions):
    clients: int = opt(40, "number of clients (CGPFL §3.8.1: 40)")
    classes_per_client: int = opt(3, "distinct classes per client (CGPFL: 3)")
    samples_per_client: list[int] = opt(
        [400, 5000], "[low, high]: each client's sample count ~ U[low, high] (CGPFL)"
    )
    test_fraction: float = opt(0.25, "fraction of each client's samples used for test (0.25)")
    standardize: bool = opt(
        False,
        "per-pixel (x − mean) / (std + 0.001) of the 0–255 pixels over the images drawn"
        " from, as pFedMe's data generator (the code CGPFL's Table 3.1 builds on);"
        " off: pixels in [0, 1]",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        k = num_classes(self.dataset, self.emnist_split)
        require(
            1 <= self.classes_per_client <= k,
            f"scenario.classes_per_client={self.classes_per_client} must lie in 1..{k}",
        )
        lohi = self.samples_per_client
        require(
            len(lohi) == 2 and 1 <= lohi[0] <= lohi[1],
            f"scenario.samples_per_client={lohi} must be [low, high] with 1 <= low <= high",
        )
        require(
            0.0 < self.test_fraction < 1.0,
            f"scenario.test_fraction={self.test_fraction} must lie in (0, 1)",
        )


def load_images(
    dataset: str, train: bool, data_dir: Path | None, download: bool, emnist_split="balanced"
):
    """``(x, y)`` of a dataset split: x uint8 ``[N, 28, 28]`` / ``[N, 3, 32, 32]`` (CIFAR-10)
    or float ``[N, 8, 8]`` (digits)."""
    if dataset == "digits":
        return load_digits("train" if train else "test")
    if dataset == "cifar10":
        return load_cifar10(data_dir, train, download)
    if dataset == "emnist":
        return load_emnist(emnist_split, data_dir, train, download)
    return load_idx_dataset(dataset, "train" if train else "test", data_dir, download)


def gather(x: torch.Tensor, y: torch.Tensor, part: P.Partition) -> Split:
    """The rows ``part`` names, as a split (uint8 pixels scaled to [0, 1])."""
    idx = torch.from_numpy(part.indices)
    xs = x[idx]
    xs = xs.float().div_(255.0) if xs.dtype == torch.uint8 else xs.float()
    if xs.dim() == 3:  # grey images get a channel axis
        xs = xs.unsqueeze(1)
    return Split(xs, y[idx], torch.from_numpy(part.offsets))


def _cap(n: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """The training images in use: all, or a random subset of ``samples``."""
    if samples and samples < n:
        return np.sort(rng.permutation(n)[:samples])
    return np.arange(n)


def _assemble(
    name, o, seed, x, y, train_part, test_x, test_y, test_part, info, pool="separate"
) -> FederatedData:
    """``pool``: what the test indices index — the official test set (``separate``), or
    the training set (``train+test``: pathological tests on each client's own samples);
    None when the pixels were transformed, so there is no partition to export."""
    train_part, val_part = P.split_fraction(
        train_part, o.val_fraction, P.make_rng(seed, f"{name}/val")
    )
    parts = {"train": train_part, "val": val_part, "test": test_part}
    sources = {"train": (x, y), "val": (x, y), "test": (test_x, test_y)}
    splits = {k: gather(*sources[k], p) for k, p in parts.items()}
    emnist = o.emnist_split if o.dataset == "emnist" else None
    digests = {k: labels_digest(s.y) for k, s in splits.items()}
    partition = None if pool is None else ClientPartition(o.dataset, parts, pool, emnist, digests)
    return FederatedData(
        name=name,
        num_classes=num_classes(o.dataset, o.emnist_split),
        input_shape=(1, *x.shape[1:]) if x.dim() == 3 else tuple(x.shape[1:]),
        train=splits["train"],
        test={"test": splits["test"]},
        val={"val": splits["val"]},
        default_model="fedavg-cnn" if o.dataset == "cifar10" else "mlp",
        participation=o.participation,
        info={"dataset": o.dataset, **info},
        partition=partition,
    )


def _label_shift(name: str, o, seed: int, data_dir: Path | None, split_fn) -> FederatedData:
    """Shared by iid and dirichlet: partition the training images, then draw each client's
    test set from the official test set with its label mix."""
    x, y = load_images(o.dataset, True, data_dir, o.download, o.emnist_split)
    tx, ty = load_images(o.dataset, False, data_dir, o.download, o.emnist_split)
    pool = _cap(len(y), o.samples, P.make_rng(seed, f"{name}/samples"))
    part = split_fn(y.numpy()[pool], P.make_rng(seed, f"{name}/partition")).remap(pool)
    totals = P.apportion(len(ty), part.sizes())
    test_part = P.match_label_mix(
        part, y.numpy(), ty.numpy(), totals, P.make_rng(seed, f"{name}/test")
    )
    info = {"test_set": "official test set, each client's label mix, shared in proportion"}
    return _assemble(name, o, seed, x, y, part, tx, ty, test_part, info)


@register_scenario("iid", IIDOptions, "MNIST/FMNIST/digits shuffled and dealt evenly to clients")
def build_iid(o: IIDOptions, seed: int, data_dir: Path | None) -> FederatedData:
    def split(labels, rng):
        return P.iid(len(labels), o.clients, rng, min_samples=1)

    return _label_shift("iid", o, seed, data_dir, split)


@register_scenario(
    "dirichlet", DirichletOptions, "label shift: client label proportions ~ Dirichlet(alpha)"
)
def build_dirichlet(o: DirichletOptions, seed: int, data_dir: Path | None) -> FederatedData:
    def split(labels, rng):
        return P.dirichlet(labels, o.clients, o.alpha, rng, o.min_samples, o.proportions)

    return _label_shift("dirichlet", o, seed, data_dir, split)


@register_scenario(
    "pathological",
    PathologicalOptions,
    "pathological class split: few classes per client, 400–5000 samples, 75/25 train/test",
)
def build_pathological(o: PathologicalOptions, seed: int, data_dir: Path | None) -> FederatedData:
    x, y = load_images(o.dataset, True, data_dir, o.download, o.emnist_split)
    pool = _cap(len(y), o.samples, P.make_rng(seed, "pathological/samples"))
    train, test = P.pathological(
        y.numpy()[pool],
        o.clients,
        P.make_rng(seed, "pathological/partition"),
        o.classes_per_client,
        tuple(o.samples_per_client),
        o.test_fraction,
    )
    info = {"test_set": "each client's own samples, split train/test per client"}
    if o.standardize:
        x = standardized(x[pool], x)
    return _assemble(
        "pathological", o, seed, x, y, train.remap(pool), x, y, test.remap(pool), info,
        pool=None if o.standardize else "train+test",  # test: the clients' own samples
    )  # fmt: skip


def standardized(pooled: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(x − μ) / (σ + 0.001) per pixel, μ and σ over ``pooled`` (pFedMe's
    generate_niid_users_mnist.py; a statistic of the images only, never of a label)."""
    mu = pooled.float().mean(0)
    sigma = pooled.float().std(0, unbiased=False)
    return (x.float() - mu) / (sigma + 0.001)
