"""Image helpers shared by the MNIST-derived scenario families (coloured, rotated, confounded,
background-coloured): loading, Arjovsky down-sampling, exact and interpolated rotation,
colouring, and turning index partitions into :class:`Split` tensors.

Not a scenario module (the leading underscore keeps the auto-importer away); nothing here
draws random numbers except through an explicit ``numpy.random.Generator``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...options import require
from .. import partition as P
from ..federated import Split
from ..idx import load_idx_dataset

MNIST_LIKE = ("mnist", "fmnist")


def env_name(p: float) -> str:
    """``"p=0.95"`` — the value as typed (no float noise like 0.30000000000000004)."""
    return f"p={round(float(p), 6)!r}"


def require_probabilities(key: str, ps: list[float], note: str = "") -> None:
    """Environment parameters ``scenario.<key>``: at least one, each in [0, 1], no two with
    the same environment name."""
    require(len(ps) >= 1, f"scenario.{key} must list at least one probability")
    require(
        all(0.0 <= p <= 1.0 for p in ps), f"scenario.{key}={ps} must hold probabilities in [0, 1]"
    )
    require(
        len({env_name(p) for p in ps}) == len(ps),
        f"scenario.{key}={ps} must not repeat a value{note}",
    )


def angle_name(angle: float) -> str:
    """``"angle=90"`` / ``"angle=22.5"``."""
    a = round(float(angle), 6)
    return f"angle={int(a) if a == int(a) else a}"


def load_grey(dataset: str, train: bool, data_dir: Path | None, download: bool):
    """MNIST / Fashion-MNIST ``(uint8 [N, 28, 28], int64 [N])``."""
    return load_idx_dataset(dataset, "train" if train else "test", data_dir, download)


def to_unit(x: Tensor) -> Tensor:
    """uint8 → float32 in [0, 1] (floats pass through as float32)."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def downsample(x: Tensor) -> Tensor:
    """28×28 → 14×14 by keeping every second row and column (Arjovsky et al. 2019)."""
    return x[..., ::2, ::2]


def rotate(x: Tensor, angle: float) -> Tensor:
    """Rotate ``[n, H, W]`` (or ``[n, C, H, W]``) images counter-clockwise by ``angle`` degrees.

    Multiples of 90° are exact (``torch.rot90``); other angles use bilinear interpolation
    about the image centre with zero padding (deterministic on CPU)."""
    a = float(angle) % 360.0
    squeeze = x.dim() == 3
    if abs(a - round(a / 90.0) * 90.0) < 1e-9:
        k = int(round(a / 90.0)) % 4
        return torch.rot90(x, k, dims=(-2, -1)).contiguous()
    img = to_unit(x)
    img = img.unsqueeze(1) if squeeze else img
    t = math.radians(a)
    c, s = math.cos(t), math.sin(t)
    theta = torch.tensor([[c, s, 0.0], [-s, c, 0.0]], dtype=img.dtype).expand(img.shape[0], 2, 3)
    grid = F.affine_grid(theta, list(img.shape), align_corners=False)
    out = F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    out = out.clamp_(0.0, 1.0)
    return out.squeeze(1) if squeeze else out


def two_channel(img: Tensor, channel: np.ndarray) -> Tensor:
    """``[n, H, W]`` grey images → ``[n, 2, H, W]`` with the digit in channel 0 (red) or 1
    (green) and zeros in the other (the CMNIST image format)."""
    n = img.shape[0]
    out = torch.zeros(n, 2, *img.shape[1:], dtype=torch.float32)
    ch = torch.from_numpy(np.asarray(channel, dtype=np.int64))
    out[torch.arange(n), ch] = img
    return out


def gather_split(x: Tensor, y: Tensor, part: P.Partition, env: np.ndarray | None = None) -> Split:
    """The rows of ``x``/``y`` that ``part`` assigns to each client, as a Split."""
    idx = torch.from_numpy(part.indices)
    e = None if env is None else torch.from_numpy(np.asarray(env, dtype=np.int64))
    return Split(x[idx].float(), y[idx].long(), torch.from_numpy(part.offsets), e)


def cap_pool(n: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """The indices in use: all ``n``, or a sorted random subset of ``samples``."""
    if samples and samples < n:
        return np.sort(rng.permutation(n)[:samples])
    return np.arange(n)


def deal(indices: np.ndarray, num: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``indices`` and deal them into ``num`` near-equal parts (sizes differ ≤ 1)."""
    return [np.asarray(p, dtype=np.int64) for p in np.array_split(rng.permutation(indices), num)]


def subdivide(part: P.Partition, ways: int, rng: np.random.Generator) -> P.Partition:
    """Split every client of ``part`` into ``ways`` clients (near-equal, random): client
    ``i`` becomes clients ``i·ways … i·ways + ways − 1``."""
    if ways == 1:
        return part
    pieces = []
    for i in range(part.num_clients):
        pieces.extend(deal(part.client(i), ways, rng))
    return from_lists(pieces)


def from_lists(pieces: list[np.ndarray]) -> P.Partition:
    sizes = np.array([len(p) for p in pieces], dtype=np.int64)
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    idx = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)
    return P.Partition(idx, offsets)


def balanced_choice(
    options: int, per_client: int, clients: int, rng: np.random.Generator
) -> np.ndarray:
    """``[clients, per_client]`` distinct choices among ``options`` items, each client picking
    among the items used least so far (random tie-breaks), so every item serves the same
    number of clients ±1."""
    usage = np.zeros(options)
    noise = rng.random((clients, options))
    out = np.empty((clients, per_client), dtype=np.int64)
    for i in range(clients):
        pick = np.sort(np.argsort(usage + noise[i], kind="stable")[:per_client])
        out[i] = pick
        usage[pick] += 1
    return out


def balanced_assignment(clients: int, choices: int, rng: np.random.Generator) -> np.ndarray:
    """Item ``0..choices-1`` per client, round-robin over a seeded shuffled client order (each
    item held by ⌊N/K⌋ or ⌈N/K⌉ clients)."""
    out = np.empty(clients, dtype=np.int64)
    out[rng.permutation(clients)] = np.arange(clients) % choices
    return out
