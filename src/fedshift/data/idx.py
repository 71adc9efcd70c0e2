"""MNIST and Fashion-MNIST from their IDX files (gzipped or raw) to tensors.

Gzipped files are trusted only with their canonical md5 (checked in :mod:`.root`); raw
files have no published checksum, so their header (magic number, item count, 28×28 shape)
and labels are checked instead. Decoded arrays are cached per process because tests and
repeated scenario builds read the same files many times.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import FedshiftError
from .root import DATASETS, dataset_files

# IDX type byte -> numpy dtype (IDX stores multi-byte values big-endian)
_IDX_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

# dataset name (and accepted aliases) -> root.DATASETS key
_ALIASES = {"mnist": "mnist", "fashion_mnist": "fashion_mnist", "fmnist": "fashion_mnist"}
_SPLITS = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60_000),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10_000),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Decode one IDX file (gzip detected from its first bytes, not its name)."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a damaged deflate stream
        raise FedshiftError(f"cannot read IDX file {path} ({e})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise FedshiftError(f"{path} is not an IDX file (bad magic number)")
    dtype, ndim = _IDX_TYPES[data[2]], data[3]
    if not 1 <= ndim <= 16:  # images and labels have 1 to 4; NumPy allows at most 64
        raise FedshiftError(f"{path} announces {ndim} dimensions; an IDX dataset has 1 to 4")
    start = 4 + 4 * ndim
    if len(data) < start:
        raise FedshiftError(f"{path} is truncated (its IDX header is incomplete)")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    count = math.prod(dims)  # Python integers: wrapped or huge dimensions cannot overflow
    if len(data) - start != count * dtype.itemsize:
        raise FedshiftError(
            f"{path} holds {len(data) - start} data bytes but its IDX header announces "
            f"{count * dtype.itemsize} (shape {dims}); the file is truncated or corrupt"
        )
    arr = np.frombuffer(data, dtype, count=count, offset=start).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


@lru_cache(maxsize=8)
def _decode(images: tuple, labels: tuple, expected: int, title: str) -> tuple[Tensor, Tensor]:
    # keyed by (path, size, mtime) so that a replaced file is read again
    x = read_idx(images[0])
    y = read_idx(labels[0])
    if x.dtype != np.uint8 or x.shape != (expected, 28, 28):
        raise FedshiftError(
            f"{images[0]} is not a {title} image file: expected {expected} uint8 images of "
            f"28×28, found {x.dtype} data of shape {x.shape}"
        )
    if y.dtype != np.uint8 or y.shape != (expected,) or (y.size and y.max() > 9):
        raise FedshiftError(
            f"{labels[0]} is not a {title} label file: expected {expected} labels in 0–9, "
            f"found {y.dtype} data of shape {y.shape}"
        )
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def load_idx_dataset(
    name: str,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(images, labels)`` of ``name`` (``mnist``, ``fashion_mnist``/``fmnist``), ``split``
    ``train`` or ``test``: uint8 ``[N, 28, 28]`` and int64 ``[N]`` (fresh copies)."""
    if name not in _ALIASES:
        raise FedshiftError(
            f"unknown IDX dataset {name!r}; choose one of: {', '.join(sorted(_ALIASES))}"
        )
    if split not in _SPLITS:
        raise FedshiftError(f"unknown split {split!r}; choose train or test")
    key = _ALIASES[name]
    images, labels, expected = _SPLITS[split]
    paths = dataset_files(key, [images, labels], data_dir, download)
    x, y = _decode(_stamp(paths[images]), _stamp(paths[labels]), expected, DATASETS[key].title)
    return x.clone(), y.clone()


def load_mnist(
    data_dir: str | os.PathLike | None = None, train: bool = True, download: bool = False
) -> tuple[Tensor, Tensor]:
    """MNIST train (60,000) or test (10,000) images, uint8 ``[N, 28, 28]``, labels int64."""
    return load_idx_dataset("mnist", "train" if train else "test", data_dir, download)


def load_fashion_mnist(
    data_dir: str | os.PathLike | None = None, train: bool = True, download: bool = False
) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST train (60,000) or test (10,000), uint8 ``[N, 28, 28]``, labels int64."""
    return load_idx_dataset("fashion_mnist", "train" if train else "test", data_dir, download)
