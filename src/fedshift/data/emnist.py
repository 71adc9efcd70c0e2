"""EMNIST (Cohen et al. 2017) from the IDX files of NIST's ``gzip.zip`` release.

Layout: ``<root>/emnist/gzip/emnist-<split>-<train|test>-<images-idx3|labels-idx1>-ubyte.gz``
(what unpacking ``gzip.zip`` into ``<root>/emnist/`` gives; un-gzipped copies are accepted
too). NIST publishes an md5 only for the zip archive (checked when downloading, opt-in);
the IDX files are checked by structure instead: magic number, 28×28 uint8 images, one
label per image, labels in the split's range. EMNIST stores images transposed relative to
MNIST; they are returned upright. ``letters`` labels (1–26 in the files) become 0–25.
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from ..errors import FedshiftError
from .idx import read_idx
from .root import DATASETS, DatasetFiles, dataset_files

# split -> (number of classes, smallest label in the files)
SPLITS = {"balanced": (47, 0), "letters": (26, 1), "digits": (10, 0), "byclass": (62, 0)}


def _names(split: str, train: bool) -> tuple[str, str]:
    part = "train" if train else "test"
    return (
        f"gzip/emnist-{split}-{part}-images-idx3-ubyte.gz",
        f"gzip/emnist-{split}-{part}-labels-idx1-ubyte.gz",
    )


_ALL = [n for s in SPLITS for t in (True, False) for n in _names(s, t)]
DATASETS["emnist"] = DatasetFiles(
    "EMNIST",
    "emnist",
    {n: None for n in _ALL},
    ("https://biometrics.nist.gov/cs_links/EMNIST/",),
    {n: (n.removesuffix(".gz"),) for n in _ALL},
    archive=("gzip.zip", "58c8d27c78d21e728a6bc7b3cc06412e"),
    layout="NIST's gzip.zip unpacked there: gzip/emnist-<split>-<train|test>-…-ubyte.gz",
)


@lru_cache(maxsize=4)
def _decode(images: tuple, labels: tuple, split: str) -> tuple[Tensor, Tensor]:
    classes, low = SPLITS[split]
    x = read_idx(images[0])
    y = read_idx(labels[0])
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28):
        raise FedshiftError(
            f"{images[0]} is not an EMNIST image file: expected uint8 images of 28×28, found "
            f"{x.dtype} data of shape {x.shape}"
        )
    if y.dtype != np.uint8 or y.shape != (len(x),):
        raise FedshiftError(
            f"{labels[0]} is not the label file of {images[0]}: expected {len(x)} uint8 "
            f"labels, found {y.dtype} data of shape {y.shape}"
        )
    y = y.astype(np.int64) - low
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise FedshiftError(
            f"{labels[0]} holds labels outside {low}–{low + classes - 1}, the range of "
            f"EMNIST {split}"
        )
    x = np.ascontiguousarray(x.transpose(0, 2, 1))  # stored column-major: make upright
    return torch.from_numpy(x), torch.from_numpy(y)


def load_emnist(
    split: str = "balanced",
    data_dir: str | os.PathLike | None = None,
    train: bool = True,
    download: bool = False,
) -> tuple[Tensor, Tensor]:
    """EMNIST ``split`` (balanced, letters, digits, byclass): uint8 ``[N, 28, 28]`` upright
    images and int64 labels from 0 (``num_classes = SPLITS[split][0]``)."""
    if split not in SPLITS:
        raise FedshiftError(f"unknown EMNIST split {split!r}; choose one of: {', '.join(SPLITS)}")
    images, labels = _names(split, train)
    paths = dataset_files("emnist", [images, labels], data_dir, download)

    def stamp(p):
        st = p.stat()
        return str(p.resolve()), st.st_size, st.st_mtime_ns

    x, y = _decode(stamp(paths[images]), stamp(paths[labels]), split)
    return x.clone(), y.clone()
