"""CIFAR-10 from its python release (``cifar-10-batches-py/``: five pickled training
batches, one test batch, ``batches.meta``) to tensors.

Every batch file must have its canonical md5 (the values published with the release and
used by torchvision); downloading (opt-in) fetches ``cifar-10-python.tar.gz`` (md5-checked)
and unpacks it. Decoded arrays are cached per process, keyed by file path, size and mtime.
"""

from __future__ import annotations

import os
import pickle
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from ..errors import FedshiftError
from .root import DATASETS, DatasetFiles, dataset_files

SUB = "cifar-10-batches-py"
CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
_MD5 = {
    f"{SUB}/data_batch_1": "c99cafc152244af753f735de768cd75f",
    f"{SUB}/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    f"{SUB}/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    f"{SUB}/data_batch_4": "634d18415352ddfa80567beed471001a",
    f"{SUB}/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    f"{SUB}/test_batch": "40351d587109b95175f43aff81a1287e",
}
_TRAIN = [f"{SUB}/data_batch_{i}" for i in range(1, 6)]
_TEST = [f"{SUB}/test_batch"]

DATASETS["cifar10"] = DatasetFiles(
    "CIFAR-10",
    "cifar10",
    _MD5,
    ("https://www.cs.toronto.edu/~kriz/",),
    archive=("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),
    layout=f"the python release unpacked: {SUB}/data_batch_1…5 and {SUB}/test_batch",
)


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch → uint8 ``[n, 3, 32, 32]`` images and int64 ``[n]`` labels."""
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as e:
        raise FedshiftError(f"cannot read CIFAR-10 batch {path} ({e})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise FedshiftError(f"{path} is not a CIFAR-10 batch (no 'data' and 'labels' entries)")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise FedshiftError(
            f"{path} is not a CIFAR-10 batch: expected uint8 rows of 3072 values, found "
            f"{data.dtype} data of shape {data.shape}"
        )
    if len(labels) != len(data) or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise FedshiftError(f"{path} is not a CIFAR-10 batch: labels do not match its images")
    return data.reshape(-1, 3, 32, 32), labels


@lru_cache(maxsize=2)
def _decode(stamps: tuple) -> tuple[Tensor, Tensor]:
    parts = [read_cifar_batch(s[0]) for s in stamps]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return torch.from_numpy(x), torch.from_numpy(y)


def load_cifar10(
    data_dir: str | os.PathLike | None = None, train: bool = True, download: bool = False
) -> tuple[Tensor, Tensor]:
    """CIFAR-10 train (50,000) or test (10,000): uint8 ``[N, 3, 32, 32]``, labels int64."""
    names = _TRAIN if train else _TEST
    paths = dataset_files("cifar10", names, data_dir, download)
    stamps = tuple(
        (str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths.values()
    )
    x, y = _decode(stamps)
    return x.clone(), y.clone()
