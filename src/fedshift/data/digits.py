"""scikit-learn's bundled digits (1,797 images of 8×8) as tensors.

They ship with scikit-learn, so scenarios built on them (the offline demo) need no files
and no network. The set has no official train/test split; ``split="train"``/``"test"``
give a fixed one (the first 1,437 images / the last 360, in the file's order, so the
split never depends on a run's seed).
"""

from __future__ import annotations

import gzip
import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import FedshiftError

DIGITS_TRAIN = 1437  # first 80 % of the file


def _digits_csv() -> Path | None:
    # the CSV that sklearn.datasets.load_digits reads, found without importing scikit-learn
    # (importing it costs about a second, more than building the demo scenario)
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


@lru_cache(maxsize=1)
def _digits() -> tuple[Tensor, Tensor]:
    path = _digits_csv()
    if path is not None:
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1]
    else:
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        images, target = bunch.images, bunch.target
    x = torch.from_numpy((images / 16.0).astype(np.float32))  # pixel values 0..16
    y = torch.from_numpy(target.astype(np.int64))
    return x, y


def load_digits(split: str = "all") -> tuple[Tensor, Tensor]:
    """``(images, labels)``: float32 ``[N, 8, 8]`` in [0, 1] and int64 ``[N]`` (copies).

    ``split`` is ``all`` (1,797), ``train`` (first 1,437) or ``test`` (last 360).
    """
    x, y = _digits()
    if split == "all":
        sl = slice(None)
    elif split == "train":
        sl = slice(0, DIGITS_TRAIN)
    elif split == "test":
        sl = slice(DIGITS_TRAIN, None)
    else:
        raise FedshiftError(f"unknown digits split {split!r}; choose all, train or test")
    return x[sl].clone(), y[sl].clone()
