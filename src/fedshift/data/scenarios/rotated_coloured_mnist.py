"""``rcmnist`` / ``rcfmnist``: Rotated Coloured MNIST / Fashion-MNIST of PerInvFL (§5.1 and
Table 6 of papers/perinvfl-personalized-invariance.txt).

Four clients; client k has one training environment p_tr[k] ∈ [0.95, 0.90, 0.85, 0.80]
(P(colour agrees with label), with cmnist's colouring and 0.25 label noise) and all its
images — training, validation and test — are rotated by rotations[k] ∈ [0°, 90°, 180°,
270°]: the rotation is a useful *personal* feature, the colour a shortcut. As in the
paper's appendix, training images are drawn without replacement from the first 50,000
MNIST training images (12,500 per client) and test images from the last 10,000 (2,500 per
client); every test environment p_te ∈ [0.1 … 0.5] recolours the same test images.
Images are rotated at 28×28 and then down-sampled to 2×14×14.

Choice (the paper has no validation data): each client's validation environment
``p=0.1`` holds ``val_per_client`` images drawn from the official MNIST test set (unused by
the paper's construction), so training and test sizes stay the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData, Split
from ..registry import register_scenario
from ._images import (
    angle_name,
    downsample,
    env_name,
    from_lists,
    load_grey,
    require_probabilities,
    rotate,
    to_unit,
    two_channel,
)
from .coloured_mnist import binary_labels, colour_channels

TRAIN_POOL = 50_000  # the first 50,000 training images build the train sets (paper, App.)


@dataclass
class RotatedColouredOptions:
    p_train: list[float] = opt(
        [0.95, 0.9, 0.85, 0.8], "one training environment per client (its length = clients)"
    )
    rotations: list[float] = opt(
        [0.0, 90.0, 180.0, 270.0], "rotation (degrees) of each client's images"
    )
    p_test: list[float] = opt([0.1, 0.2, 0.3, 0.4, 0.5], "test environments")
    p_val: float = opt(0.1, "validation environment (from the official test set)")
    train_per_client: int = opt(12_500, "training images per client (PerInvFL: 12,500)")
    test_per_client: int = opt(2_500, "test images per client (PerInvFL: 2,500)")
    val_per_client: int = opt(2_500, "validation images per client (official test set)")
    label_noise: float = opt(0.25, "probability the binary label is flipped")
    participation: float = opt(1.0, "fraction of clients sampled per round")
    oracle: bool = opt(False, "shortcut-free variant: training colour independent of the label")
    download: bool = opt(False, "download missing MNIST/Fashion-MNIST files (off: offline)")

    def __post_init__(self) -> None:
        n = len(self.p_train)
        require(n >= 1, "scenario.p_train must list at least one environment")
        require(
            len(self.rotations) == n,
            f"scenario.rotations={self.rotations} must give one angle per client "
            f"({n}, the length of p_train)",
        )
        for key in ("p_train", "p_test"):
            require_probabilities(key, getattr(self, key), " (one environment per client)")
        require(0.0 <= self.p_val <= 1.0, f"scenario.p_val={self.p_val} must lie in [0, 1]")
        require(
            1 <= self.train_per_client and n * self.train_per_client <= TRAIN_POOL,
            f"scenario.train_per_client={self.train_per_client} must lie in 1..{TRAIN_POOL // n}",
        )
        require(
            1 <= self.test_per_client and n * self.test_per_client <= 60_000 - TRAIN_POOL,
            f"scenario.test_per_client={self.test_per_client} must lie in "
            f"1..{(60_000 - TRAIN_POOL) // n}",
        )
        require(
            1 <= self.val_per_client and n * self.val_per_client <= 10_000,
            f"scenario.val_per_client={self.val_per_client} must lie in 1..{10_000 // n}",
        )
        require(0.0 <= self.label_noise <= 0.5, "scenario.label_noise must lie in [0, 0.5]")
        require(0.0 < self.participation <= 1.0, "scenario.participation must lie in (0, 1]")


def _draw(pool: np.ndarray, per_client: int, clients: int, rng) -> P.Partition:
    chosen = rng.permutation(pool)[: per_client * clients]
    return from_lists([np.sort(c) for c in np.split(chosen, clients)])


def build_rotated_coloured(name, dataset, o: RotatedColouredOptions, seed, data_dir):
    def rng(purpose: str, *extra: int) -> np.random.Generator:
        return P.make_rng(seed, f"{name}/{purpose}", *extra)

    n = len(o.p_train)
    x, cls = load_grey(dataset, True, data_dir, o.download)
    vx, vcls = load_grey(dataset, False, data_dir, o.download)
    cls, vcls = cls.numpy(), vcls.numpy()
    train_part = _draw(np.arange(TRAIN_POOL), o.train_per_client, n, rng("train"))
    test_part = _draw(np.arange(TRAIN_POOL, len(cls)), o.test_per_client, n, rng("test"))
    val_part = _draw(np.arange(len(vcls)), o.val_per_client, n, rng("val"))
    y_all = binary_labels(cls, o.label_noise, rng("label-noise"))
    vy_all = binary_labels(vcls, o.label_noise, rng("val-label-noise"))

    def images(source: torch.Tensor, part: P.Partition) -> torch.Tensor:
        """Each client's images rotated by its angle, then down-sampled to 14×14."""
        out = []
        for k in range(n):
            img = to_unit(source[torch.from_numpy(part.client(k))])
            out.append(downsample(rotate(img, o.rotations[k])))
        return torch.cat(out)

    def coloured(grey, labels, part, p, g: np.random.Generator) -> Split:
        yy = labels[part.indices]
        ch = colour_channels(yy, p, g)
        return Split(two_channel(grey, ch), torch.from_numpy(yy), torch.from_numpy(part.offsets))

    env = np.repeat(np.arange(n), train_part.sizes())
    p_img = np.full(len(env), 0.5) if o.oracle else np.asarray(o.p_train)[env]
    train = coloured(images(x, train_part), y_all, train_part, p_img, rng("train-colours"))
    train.env = torch.from_numpy(env)
    test_grey = images(x, test_part)
    test = {  # seeded by the value of p, so "p=0.3" is the same whatever else is listed
        env_name(p): coloured(test_grey, y_all, test_part, p, rng("test", int(round(p * 1e6))))
        for p in o.p_test
    }
    val_grey = images(vx, val_part)
    val = {env_name(o.p_val): coloured(val_grey, vy_all, val_part, o.p_val, rng("val-colours"))}
    return FederatedData(
        name=name,
        num_classes=2,
        input_shape=(2, 14, 14),
        train=train,
        test=test,
        val=val,
        train_env_names=[env_name(p) for p in o.p_train],
        default_model="mlp",
        participation=o.participation,
        info={
            "dataset": dataset,
            "oracle": o.oracle,
            "label_noise": o.label_noise,
            "client_train_env": [env_name(p) for p in o.p_train],
            "client_rotation": [angle_name(a) for a in o.rotations],
            "client_group": list(range(n)),
        },
    )


@register_scenario(
    "rcmnist",
    RotatedColouredOptions,
    "Rotated Coloured MNIST (PerInvFL §5.1): 4 clients, p_tr 0.95…0.80, rotated 0/90/180/270°",
)
def build_rcmnist(o: RotatedColouredOptions, seed: int, data_dir: Path | None) -> FederatedData:
    return build_rotated_coloured("rcmnist", "mnist", o, seed, data_dir)


@register_scenario(
    "rcfmnist",
    RotatedColouredOptions,
    "Rotated Coloured Fashion-MNIST (PerInvFL §5.1): rcmnist's construction on Fashion-MNIST",
)
def build_rcfmnist(o: RotatedColouredOptions, seed: int, data_dir: Path | None) -> FederatedData:
    return build_rotated_coloured("rcfmnist", "fmnist", o, seed, data_dir)
