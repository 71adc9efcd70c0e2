"""``rotmnist-lodo``: Rotated MNIST, leave one domain out (FedIPG §VI-B,
papers/fedipg-invariant-fl-edge.txt), with the strongly rotated aberrant client of FedIPG
§VI-A (SPEC §2.3) as an option.

Domains are rotation angles [0°, 15°, 30°, 45°, 60°, 75°] (the DomainBed Rotated MNIST
domains). ``held_out`` (0°) is never trained on; every client holds one of the other
domains (FedIPG: 5 clients = one per domain, or 50 = ten per domain). The training images
(official training set) are dealt into equal disjoint shares, one per client, each rotated
by its client's angle; 10 % of each client's share is its validation split ``val`` (the
paper's 90/10 split, the training-domain validation of DomainBed). Test environments use
the official test set, dealt into equal shares per client: ``angle=0`` (the held-out
domain) in leave-one-domain-out mode; with ``held_out=none`` one test environment per
angle used in training.

**Aberrant client** (FedIPG §VI-A, SPEC §2.3): ``aberrant_angle=θ`` makes the last client
rotated by θ while the other ``clients − 1`` are dealt round-robin over the training
angles, e.g. ``clients=20, held_out=none, aberrant_angle=135`` is the paper's experiment
(regular clients at 0/15/…/75°, one client at 135°). Its index is in
``info["aberrant_clients"]`` and θ is added to the test environments when no domain is
held out. Angles other than multiples of 90° use bilinear rotation.
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
from ._images import MNIST_LIKE, angle_name, cap_pool, deal, from_lists, load_grey, rotate


@dataclass
class RotatedMnistOptions:
    dataset: str = opt("mnist", "images to rotate", MNIST_LIKE)
    angles: list[float] = opt([0.0, 15.0, 30.0, 45.0, 60.0, 75.0], "domains: rotation angles")
    held_out: float | None = opt(
        0.0, "angle of the held-out test domain (none = no domain held out)"
    )
    clients: int = opt(5, "clients, each one domain (FedIPG: 5 or 50)")
    aberrant_angle: float | None = opt(
        None, "FedIPG §VI-A: the last client rotated by this angle instead (none = off)"
    )
    val_fraction: float = opt(0.1, "share of each client's images for validation (FedIPG: 10 %)")
    samples: int = opt(0, "use at most this many training images in total (0 = all)")
    test_samples: int = opt(0, "use at most this many test images in total (0 = all)")
    participation: float = opt(1.0, "fraction of clients sampled per round")
    download: bool = opt(False, "download missing MNIST/Fashion-MNIST files (off: offline)")

    def __post_init__(self) -> None:
        names = [angle_name(a) for a in self.angles]
        require(len(set(names)) == len(names) >= 1, "scenario.angles must list distinct angles")
        require(
            self.held_out is None or angle_name(self.held_out) in names,
            f"scenario.held_out={self.held_out} must be one of scenario.angles or none",
        )
        require(len(self.training_angles()) >= 1, "at least one angle must remain for training")
        regular = self.clients - (self.aberrant_angle is not None)
        require(
            regular >= len(self.training_angles()),
            f"scenario.clients={self.clients} must give every training angle a client",
        )
        if self.aberrant_angle is None:
            require(
                self.clients % len(self.training_angles()) == 0,
                f"scenario.clients={self.clients} must be a multiple of the "
                f"{len(self.training_angles())} training domains",
            )
        require(0.0 <= self.val_fraction < 1.0, "scenario.val_fraction must lie in [0, 1)")
        require(self.samples >= 0 and self.test_samples >= 0, "sample caps must be >= 0")
        require(0.0 < self.participation <= 1.0, "scenario.participation must lie in (0, 1]")

    def training_angles(self) -> list[float]:
        held = None if self.held_out is None else angle_name(self.held_out)
        return [a for a in self.angles if angle_name(a) != held]


def _rotated(x: torch.Tensor, part: P.Partition, angles: list[float]) -> torch.Tensor:
    out = [rotate(x[torch.from_numpy(part.client(i))], angles[i]) for i in range(len(angles))]
    return torch.cat(out).unsqueeze(1).float()


@register_scenario(
    "rotmnist-lodo",
    RotatedMnistOptions,
    "Rotated MNIST leave-one-domain-out (FedIPG §VI-B); aberrant rotated client (§VI-A)",
)
def build_rotmnist(o: RotatedMnistOptions, seed: int, data_dir: Path | None) -> FederatedData:
    def rng(purpose: str) -> np.random.Generator:
        return P.make_rng(seed, f"rotmnist-lodo/{purpose}")

    x, y = load_grey(o.dataset, True, data_dir, o.download)
    tx, ty = load_grey(o.dataset, False, data_dir, o.download)
    x, tx = x.float().div_(255.0), tx.float().div_(255.0)
    domains = o.training_angles()
    regular = o.clients - (o.aberrant_angle is not None)
    client_domain = np.arange(regular) % len(domains)
    client_angle = [float(domains[d]) for d in client_domain]
    train_env_names = [angle_name(a) for a in domains]
    if o.aberrant_angle is not None:
        client_angle.append(float(o.aberrant_angle))
        client_domain = np.append(client_domain, len(domains))
        train_env_names.append(angle_name(o.aberrant_angle))

    pool = cap_pool(len(y), o.samples, rng("samples"))
    whole = from_lists([np.sort(s) for s in deal(pool, o.clients, rng("clients"))])
    train_part, val_part = P.split_fraction(whole, o.val_fraction, rng("val"))
    tpool = cap_pool(len(ty), o.test_samples, rng("test-samples"))
    test_part = from_lists([np.sort(s) for s in deal(tpool, o.clients, rng("test"))])

    train = Split(
        _rotated(x, train_part, client_angle),
        y[torch.from_numpy(train_part.indices)],
        torch.from_numpy(train_part.offsets),
        torch.from_numpy(np.repeat(client_domain, train_part.sizes())),
    )
    val = {
        "val": Split(
            _rotated(x, val_part, client_angle),
            y[torch.from_numpy(val_part.indices)],
            torch.from_numpy(val_part.offsets),
        )
    }
    if o.held_out is not None:
        test_angles = [float(o.held_out)]
    else:
        test_angles = [float(a) for a in domains]
        if (
            o.aberrant_angle is not None
            and angle_name(o.aberrant_angle) not in train_env_names[:-1]
        ):
            test_angles.append(float(o.aberrant_angle))
    ty_split = ty[torch.from_numpy(test_part.indices)]
    test = {
        angle_name(a): Split(
            _rotated(tx, test_part, [a] * o.clients), ty_split, torch.from_numpy(test_part.offsets)
        )
        for a in test_angles
    }
    return FederatedData(
        name="rotmnist-lodo",
        num_classes=10,
        input_shape=(1, 28, 28),
        train=train,
        test=test,
        val=val,
        train_env_names=train_env_names,
        default_model="fedavg-cnn",
        participation=o.participation,
        info={
            "dataset": o.dataset,
            "held_out": None if o.held_out is None else angle_name(o.held_out),
            "client_rotation": [angle_name(a) for a in client_angle],
            "client_group": client_domain.tolist(),
            "aberrant_clients": [o.clients - 1] if o.aberrant_angle is not None else [],
        },
    )
