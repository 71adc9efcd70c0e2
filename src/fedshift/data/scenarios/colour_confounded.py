"""Colour-confounded MNIST variants with ten digit classes and RGB images:

* ``confounded-cmnist`` (FedIPG §VI-C, papers/fedipg-invariant-fl-edge.txt): ten colours ×
  ten digits. A *combination* k ∈ 0..9 is a colour–digit pairing: digit d gets colour
  (d + k) mod 10 (with probability ``correlation``, else a uniformly random colour). The
  colour stains the foreground (the digit), the background, or both (digit in colour c,
  background in c's complement 1 − c). Nine combinations are dealt to the 50 training
  clients (round-robin over a seeded shuffled order, one combination per client); the
  remaining one — ``held_out``, or drawn with the seed — colours the test environment, so
  every test image carries a colour never paired with its digit in training.
* ``bgcolor-mnist`` (DFL §4, papers/dfl-disentangled-fl.txt): every client has its own
  background colour (white digits on it), the same in its training and test data; 20
  clients, 10 sampled per round; ``train_ratio`` 0.5 of the training set and
  ``test_ratio`` 0.5 of the test set used (DFL's sample ratios). Client colours are 20
  hues evenly spaced on the colour wheel (saturation 1, value 0.8, so the white digit
  stays visible), dealt to clients in a seeded random order.

Images are 3×H×W in [0, 1]; H = W = ``image_size`` (28, or 14 by Arjovsky's down-sampling
to save memory).
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData, Split
from ..registry import register_scenario
from ._images import MNIST_LIKE, balanced_assignment, cap_pool, deal, from_lists, load_grey

# Ten saturated colours, none grey (so a colour and its complement always differ).
PALETTE = torch.tensor(
    [
        [1.0, 0.0, 0.0],  # red
        [0.0, 1.0, 0.0],  # green
        [0.0, 0.0, 1.0],  # blue
        [1.0, 1.0, 0.0],  # yellow
        [1.0, 0.0, 1.0],  # magenta
        [0.0, 1.0, 1.0],  # cyan
        [1.0, 0.5, 0.0],  # orange
        [0.5, 0.0, 1.0],  # violet
        [0.5, 1.0, 0.0],  # lime
        [1.0, 0.0, 0.5],  # pink
    ]
)


def stain(grey: torch.Tensor, colour: torch.Tensor, where: str) -> torch.Tensor:
    """``[n, H, W]`` grey digits and ``[n, 3]`` colours → ``[n, 3, H, W]``."""
    g = grey.unsqueeze(1)
    c = colour[:, :, None, None]
    if where == "foreground":
        return g * c
    if where == "background":
        return g + (1 - g) * c
    return g * c + (1 - g) * (1 - c)  # both: digit in c, background in the complement


def _images(dataset, train, size, data_dir, download):
    x, y = load_grey(dataset, train, data_dir, download)
    x = x.float().div_(255.0)
    return (x[:, ::2, ::2].contiguous() if size == 14 else x), y


@dataclass
class ConfoundedOptions:
    dataset: str = opt("mnist", "images to stain", MNIST_LIKE)
    clients: int = opt(50, "training clients (FedIPG: 50)")
    stain: str = opt("foreground", "what the colour stains", ("foreground", "background", "both"))
    held_out: int | None = opt(None, "test combination 0–9 (none = drawn with the seed)")
    correlation: float = opt(1.0, "P(an image takes its combination's colour), else random")
    image_size: int = opt(14, "side of the images: 14 (down-sampled) or 28", (14, 28))
    val_fraction: float = opt(0.1, "share of each client's training images for validation")
    samples: int = opt(0, "use at most this many training images in total (0 = all)")
    test_samples: int = opt(0, "use at most this many test images in total (0 = all)")
    participation: float = opt(1.0, "fraction of clients sampled per round")
    download: bool = opt(False, "download missing MNIST/Fashion-MNIST files (off: offline)")

    def __post_init__(self) -> None:
        require(self.clients >= 1, f"scenario.clients={self.clients} must be at least 1")
        require(
            self.held_out is None or 0 <= self.held_out <= 9,
            f"scenario.held_out={self.held_out} must be a combination 0–9 or none",
        )
        require(0.0 <= self.correlation <= 1.0, "scenario.correlation must lie in [0, 1]")
        require(0.0 <= self.val_fraction < 1.0, "scenario.val_fraction must lie in [0, 1)")
        require(self.samples >= 0 and self.test_samples >= 0, "sample caps must be >= 0")
        require(0.0 < self.participation <= 1.0, "scenario.participation must lie in (0, 1]")


def combination_colours(digits: np.ndarray, combo, correlation: float, rng) -> np.ndarray:
    """Colour index per image: (digit + combination) mod 10 w.p. ``correlation``."""
    follow = rng.random(len(digits)) < correlation
    return np.where(follow, (digits + combo) % 10, rng.integers(0, 10, len(digits)))


@register_scenario(
    "confounded-cmnist",
    ConfoundedOptions,
    "FedIPG §VI-C: 10 colour–digit combinations, 9 to 50 training clients, 1 held out for test",
)
def build_confounded(o: ConfoundedOptions, seed: int, data_dir: Path | None) -> FederatedData:
    def rng(purpose: str) -> np.random.Generator:
        return P.make_rng(seed, f"confounded-cmnist/{purpose}")

    x, y = _images(o.dataset, True, o.image_size, data_dir, o.download)
    tx, ty = _images(o.dataset, False, o.image_size, data_dir, o.download)
    held = o.held_out if o.held_out is not None else int(rng("held-out").integers(0, 10))
    combos = np.array([k for k in range(10) if k != held])
    client_combo = combos[balanced_assignment(o.clients, 9, rng("combinations"))]

    pool = cap_pool(len(y), o.samples, rng("samples"))
    whole = from_lists([np.sort(s) for s in deal(pool, o.clients, rng("clients"))])
    train_part, val_part = P.split_fraction(whole, o.val_fraction, rng("val"))
    tpool = cap_pool(len(ty), o.test_samples, rng("test-samples"))
    test_part = from_lists([np.sort(s) for s in deal(tpool, o.clients, rng("test"))])

    def split(images, labels, part, combo_per_client, purpose, env=None) -> Split:
        idx = torch.from_numpy(part.indices)
        yy = labels[idx]
        combo = np.repeat(combo_per_client, part.sizes())
        colour = combination_colours(yy.numpy(), combo, o.correlation, rng(purpose))
        xx = stain(images[idx], PALETTE[torch.from_numpy(colour)], o.stain)
        e = None if env is None else torch.from_numpy(env)
        return Split(xx, yy, torch.from_numpy(part.offsets), e)

    env_index = {int(k): i for i, k in enumerate(combos)}
    env = np.repeat([env_index[int(k)] for k in client_combo], train_part.sizes())
    train = split(x, y, train_part, client_combo, "train-colours", env)
    val = {"val": split(x, y, val_part, client_combo, "val-colours")}
    test = {
        f"combination={held}": split(tx, ty, test_part, np.full(o.clients, held), "test-colours")
    }
    return FederatedData(
        name="confounded-cmnist",
        num_classes=10,
        input_shape=(3, o.image_size, o.image_size),
        train=train,
        test=test,
        val=val,
        train_env_names=[f"combination={k}" for k in combos],
        default_model="mlp",
        participation=o.participation,
        info={
            "dataset": o.dataset,
            "stain": o.stain,
            "held_out": held,
            "client_combination": client_combo.tolist(),
            "rule": "combination k colours digit d with palette colour (d + k) mod 10",
        },
    )


@dataclass
class BackgroundOptions:
    dataset: str = opt("mnist", "digit images", MNIST_LIKE)
    clients: int = opt(20, "clients, each with its own background colour (DFL: 20)")
    participation: float = opt(0.5, "fraction of clients per round (DFL: 10 of 20)")
    train_ratio: float = opt(0.5, "share of the training set used (DFL: 0.5)")
    test_ratio: float = opt(0.5, "share of the test set used (DFL: 0.5)")
    image_size: int = opt(28, "side of the images: 28 or 14 (down-sampled)", (14, 28))
    val_fraction: float = opt(0.1, "share of each client's training images for validation")
    download: bool = opt(False, "download missing MNIST/Fashion-MNIST files (off: offline)")

    def __post_init__(self) -> None:
        require(self.clients >= 1, f"scenario.clients={self.clients} must be at least 1")
        for key in ("train_ratio", "test_ratio", "participation"):
            v = getattr(self, key)
            require(0.0 < v <= 1.0, f"scenario.{key}={v} must lie in (0, 1]")
        require(0.0 <= self.val_fraction < 1.0, "scenario.val_fraction must lie in [0, 1)")


def client_colours(clients: int, rng: np.random.Generator) -> torch.Tensor:
    """``clients`` hues evenly spaced on the wheel (s = 1, v = 0.8), in a random order."""
    hues = rng.permutation(clients) / clients
    return torch.tensor([colorsys.hsv_to_rgb(h, 1.0, 0.8) for h in hues], dtype=torch.float32)


@register_scenario(
    "bgcolor-mnist",
    BackgroundOptions,
    "DFL §4: MNIST with one background colour per client, 20 clients, 10 per round",
)
def build_bgcolor(o: BackgroundOptions, seed: int, data_dir: Path | None) -> FederatedData:
    def rng(purpose: str) -> np.random.Generator:
        return P.make_rng(seed, f"bgcolor-mnist/{purpose}")

    x, y = _images(o.dataset, True, o.image_size, data_dir, o.download)
    tx, ty = _images(o.dataset, False, o.image_size, data_dir, o.download)
    pool = cap_pool(len(y), int(round(o.train_ratio * len(y))), rng("samples"))
    tpool = cap_pool(len(ty), int(round(o.test_ratio * len(ty))), rng("test-samples"))
    whole = from_lists([np.sort(s) for s in deal(pool, o.clients, rng("clients"))])
    train_part, val_part = P.split_fraction(whole, o.val_fraction, rng("val"))
    test_part = from_lists([np.sort(s) for s in deal(tpool, o.clients, rng("test"))])
    colours = client_colours(o.clients, rng("colours"))

    def split(images, labels, part) -> Split:
        idx = torch.from_numpy(part.indices)
        owner = torch.from_numpy(part.owners())
        xx = stain(images[idx], colours[owner], "background")
        return Split(xx, labels[idx], torch.from_numpy(part.offsets))

    return FederatedData(
        name="bgcolor-mnist",
        num_classes=10,
        input_shape=(3, o.image_size, o.image_size),
        train=split(x, y, train_part),
        test={"test": split(tx, ty, test_part)},
        val={"val": split(x, y, val_part)},
        default_model="dfl-cnn",
        participation=o.participation,
        info={"dataset": o.dataset, "client_colour": colours.tolist()},
    )
