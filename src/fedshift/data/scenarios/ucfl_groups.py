"""Group-structured scenarios of User-centric FL (papers/user-centric-fl.txt §V-A), where
the clients fall into hidden groups and clustering methods should find them:

* ``rotation-groups`` — label + covariate shift: each client's label mix ~ Dir(α = 8)
  (the per-client Dirichlet partition of ``dirichlet``), clients in 4 groups, the images of
  group g (training, validation and test) rotated by [0°, 90°, 180°, 270°][g].
* ``label-permutation`` — concept shift: images dealt IID to 20 clients in 4 groups; group
  g relabels every image with its own seeded random permutation π_g of the classes
  (distinct permutations), so the same image means different classes in different groups.

UCFL used EMNIST (and CIFAR-10 for the concept shift); here any dataset of the basic
scenarios (MNIST, Fashion-MNIST, digits, and what the loaders add) works. Groups are
assigned round-robin over a seeded shuffled client order (each group ⌊N/G⌋ or ⌈N/G⌉
clients); ``info["client_group"]`` holds each client's true group so that clustering
methods can report purity. Test sets: each client's share of the official test set with
its own label mix (rotation-groups) or an IID share (label-permutation), transformed like
its training data; ``val``: ``val_fraction`` of its training data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData, Split
from ..registry import register_scenario
from ._images import angle_name, balanced_assignment, cap_pool, rotate, to_unit
from .basic import DATASETS, load_images


@dataclass
class _GroupOptions:
    dataset: str = opt("mnist", "images to use (UCFL used EMNIST / CIFAR-10)", DATASETS)
    samples: int = opt(0, "use at most this many training images in total (0 = all)")
    val_fraction: float = opt(0.1, "fraction of each client's training data held out as 'val'")
    participation: float = opt(1.0, "default fraction of clients sampled per round")
    download: bool = opt(False, "download missing dataset files (off: offline)")

    def __post_init__(self) -> None:
        require(self.clients >= 1, f"scenario.clients={self.clients} must be at least 1")
        require(
            1 <= self.groups <= self.clients,
            f"scenario.groups={self.groups} must lie in 1..clients ({self.clients})",
        )
        require(self.samples >= 0, f"scenario.samples={self.samples} must be 0 (all) or more")
        require(
            0.0 <= self.val_fraction < 1.0,
            f"scenario.val_fraction={self.val_fraction} must lie in [0, 1)",
        )
        require(0.0 < self.participation <= 1.0, "scenario.participation must lie in (0, 1]")


@dataclass
class RotationGroupsOptions(_GroupOptions):
    clients: int = opt(100, "number of clients (UCFL: 100 users)")
    groups: int = opt(4, "number of groups (UCFL: 4)")
    rotations: list[float] = opt(
        [0.0, 90.0, 180.0, 270.0], "rotation (degrees, counter-clockwise) of each group"
    )
    alpha: float = opt(8.0, "Dirichlet concentration of each client's label mix (UCFL: 8)")
    min_samples: int = opt(10, "every client gets at least this many training images")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            len(self.rotations) == self.groups,
            f"scenario.rotations={self.rotations} must give one angle per group ({self.groups})",
        )
        require(self.alpha > 0, f"scenario.alpha={self.alpha} must be positive")
        require(self.min_samples >= 1, "scenario.min_samples must be >= 1")


@dataclass
class LabelPermutationOptions(_GroupOptions):
    clients: int = opt(20, "number of clients (UCFL: 20 users)")
    groups: int = opt(4, "number of groups, each with its own label permutation (UCFL: 4)")


def _num_classes(y: torch.Tensor, ty: torch.Tensor) -> int:
    return int(max(int(y.max()), int(ty.max()))) + 1


def _gather(x, y, part: P.Partition, transform) -> Split:
    """Client ``i``'s rows, passed through ``transform(i, images, labels)``."""
    xs, ys = [], []
    for i in range(part.num_clients):
        idx = torch.from_numpy(part.client(i))
        xi, yi = transform(i, to_unit(x[idx]), y[idx])
        xs.append(xi.unsqueeze(1)), ys.append(yi)
    return Split(torch.cat(xs), torch.cat(ys).long(), torch.from_numpy(part.offsets))


def _model_for(shape) -> str:
    return "lenet5" if min(shape[-2:]) >= 12 else "mlp"  # UCFL: LeNet-5


@register_scenario(
    "rotation-groups",
    RotationGroupsOptions,
    "UCFL label + covariate shift: Dir(8) label mixes, 4 client groups rotated 0/90/180/270°",
)
def build_rotation_groups(
    o: RotationGroupsOptions, seed: int, data_dir: Path | None
) -> FederatedData:
    def rng(purpose: str) -> np.random.Generator:
        return P.make_rng(seed, f"rotation-groups/{purpose}")

    x, y = load_images(o.dataset, True, data_dir, o.download)
    tx, ty = load_images(o.dataset, False, data_dir, o.download)
    pool = cap_pool(len(y), o.samples, rng("samples"))
    part = P.dirichlet(y.numpy()[pool], o.clients, o.alpha, rng("partition"), o.min_samples)
    part = part.remap(pool)
    test_part = P.match_label_mix(
        part, y.numpy(), ty.numpy(), P.apportion(len(ty), part.sizes()), rng("test")
    )
    train_part, val_part = P.split_fraction(part, o.val_fraction, rng("val"))
    group = balanced_assignment(o.clients, o.groups, rng("groups"))

    def turn(i, images, labels):
        return rotate(images, o.rotations[group[i]]), labels

    return FederatedData(
        name="rotation-groups",
        num_classes=_num_classes(y, ty),
        input_shape=(1, *x.shape[1:]),
        train=_gather(x, y, train_part, turn),
        test={"test": _gather(tx, ty, test_part, turn)},
        val={"val": _gather(x, y, val_part, turn)},
        default_model=_model_for(x.shape),
        participation=o.participation,
        info={
            "dataset": o.dataset,
            "client_group": group.tolist(),
            "group_rotation": [angle_name(a) for a in o.rotations],
            "client_rotation": [angle_name(o.rotations[g]) for g in group],
        },
    )


def group_permutations(groups: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """``groups`` distinct random permutations of ``classes`` labels (a duplicate is drawn
    again; needs ``groups <= classes!``)."""
    out: list[np.ndarray] = []
    seen: set[tuple] = set()
    while len(out) < groups:
        p = rng.permutation(classes)
        if tuple(p) not in seen:
            seen.add(tuple(p))
            out.append(p)
    return np.stack(out)


@register_scenario(
    "label-permutation",
    LabelPermutationOptions,
    "UCFL concept shift: IID images, 4 client groups each with its own label permutation",
)
def build_label_permutation(
    o: LabelPermutationOptions, seed: int, data_dir: Path | None
) -> FederatedData:
    def rng(purpose: str) -> np.random.Generator:
        return P.make_rng(seed, f"label-permutation/{purpose}")

    x, y = load_images(o.dataset, True, data_dir, o.download)
    tx, ty = load_images(o.dataset, False, data_dir, o.download)
    classes = _num_classes(y, ty)
    require(
        o.groups <= math.factorial(classes),
        f"scenario.groups={o.groups}: {classes} classes allow only "
        f"{math.factorial(classes)} distinct label permutations",
    )
    pool = cap_pool(len(y), o.samples, rng("samples"))
    part = P.iid(len(pool), o.clients, rng("partition")).remap(pool)
    test_part = P.iid(len(ty), o.clients, rng("test"))
    train_part, val_part = P.split_fraction(part, o.val_fraction, rng("val"))
    group = balanced_assignment(o.clients, o.groups, rng("groups"))
    perms = group_permutations(o.groups, classes, rng("permutations"))
    table = torch.from_numpy(perms)

    def relabel(i, images, labels):
        return images, table[group[i]][labels]

    return FederatedData(
        name="label-permutation",
        num_classes=classes,
        input_shape=(1, *x.shape[1:]),
        train=_gather(x, y, train_part, relabel),
        test={"test": _gather(tx, ty, test_part, relabel)},
        val={"val": _gather(x, y, val_part, relabel)},
        default_model=_model_for(x.shape),
        participation=o.participation,
        info={
            "dataset": o.dataset,
            "client_group": group.tolist(),
            "group_permutation": perms.tolist(),
        },
    )
