"""dSprites (Matthey et al. 2017) and 3dshapes (Burgess & Kim 2018), the disentanglement
datasets of DFL §4, from their released files to tensors.

* dSprites: ``<root>/dsprites/dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz`` with
  ``imgs`` (uint8 ``[N, 64, 64]``, 0/1) and ``latents_classes`` (int ``[N, 6]``: colour,
  shape, scale, orientation, x, y).
* 3dshapes: ``<root>/3dshapes/3dshapes.h5`` with ``images`` (uint8 ``[N, 64, 64, 3]``) and
  ``labels`` (float ``[N, 6]``: floor hue, wall hue, object hue, scale, shape,
  orientation). Reading it needs h5py (``pip install fedshift[h5]``); only the requested
  images are read.

Neither release publishes a checksum, so both are checked by structure (keys, dtypes,
shapes, one latent row per image). Download is opt-in, from the authors' addresses.
"""

from __future__ import annotations

import os
import zipfile
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from ..errors import FedshiftError
from .root import DATASETS, DatasetFiles, dataset_files

DSPRITES_FILE = "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz"
DSPRITES_FACTORS = ("colour", "shape", "scale", "orientation", "x", "y")
SHAPES3D_FILE = "3dshapes.h5"
_BLOCK = 8192  # images per contiguous h5 read
SHAPES3D_FACTORS = ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation")

DATASETS["dsprites"] = DatasetFiles(
    "dSprites",
    "dsprites",
    {DSPRITES_FILE: None},
    ("https://github.com/deepmind/dsprites-dataset/raw/master/",),
    layout="the released .npz, unchanged",
)
DATASETS["3dshapes"] = DatasetFiles(
    "3dshapes",
    "3dshapes",
    {SHAPES3D_FILE: None},
    ("https://storage.googleapis.com/3d-shapes/",),
    layout="the released .h5, unchanged",
)


@lru_cache(maxsize=1)
def _dsprites(stamp: tuple) -> tuple[Tensor, Tensor]:
    path = stamp[0]
    try:
        with np.load(path, allow_pickle=False) as z:
            if "imgs" not in z.files or "latents_classes" not in z.files:
                raise FedshiftError(
                    f"{path} is not the dSprites release: it lacks 'imgs' or 'latents_classes'"
                )
            imgs = z["imgs"]
            lat = z["latents_classes"]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise FedshiftError(f"cannot read dSprites file {path} ({e})") from None
    if imgs.ndim != 3 or imgs.shape[1:] != (64, 64) or lat.shape != (len(imgs), 6):
        raise FedshiftError(
            f"{path} is not the dSprites release: expected imgs [N, 64, 64] and "
            f"latents_classes [N, 6], found {imgs.shape} and {lat.shape}"
        )
    return torch.from_numpy(imgs.astype(np.uint8)), torch.from_numpy(lat.astype(np.int64))


def load_dsprites(
    data_dir: str | os.PathLike | None = None, download: bool = False
) -> tuple[Tensor, Tensor]:
    """All dSprites images (uint8 ``[N, 64, 64]``, values 0/1) and their latent classes
    (int64 ``[N, 6]``, columns :data:`DSPRITES_FACTORS`). Shared, do not modify in place."""
    path = dataset_files("dsprites", [DSPRITES_FILE], data_dir, download)[DSPRITES_FILE]
    st = path.stat()
    return _dsprites((str(path.resolve()), st.st_size, st.st_mtime_ns))


def _h5py():
    try:
        import h5py
    except ImportError:
        raise FedshiftError(
            "reading 3dshapes.h5 needs h5py, which is not installed; install it with "
            "pip install 'fedshift[h5]' (or pip install h5py)"
        ) from None
    return h5py


def _factor_classes(labels: np.ndarray) -> np.ndarray:
    """Float factor values → class index per column (rank among the column's values)."""
    out = np.empty(labels.shape, dtype=np.int64)
    for j in range(labels.shape[1]):
        values = np.unique(np.round(labels[:, j], 6))
        out[:, j] = np.searchsorted(values, np.round(labels[:, j], 6))
    return out


def load_3dshapes_factors(
    data_dir: str | os.PathLike | None = None, download: bool = False
) -> np.ndarray:
    """Factor classes of every 3dshapes image, int64 ``[N, 6]`` (:data:`SHAPES3D_FACTORS`)."""
    h5py = _h5py()
    path = dataset_files("3dshapes", [SHAPES3D_FILE], data_dir, download)[SHAPES3D_FILE]
    try:
        with h5py.File(path, "r") as f:
            _check_3dshapes(f, path)
            labels = np.asarray(f["labels"][()], dtype=np.float64)
    except OSError as e:
        raise FedshiftError(f"cannot read 3dshapes file {path} ({e})") from None
    return _factor_classes(labels)


def load_3dshapes_images(
    indices: np.ndarray, data_dir: str | os.PathLike | None = None, download: bool = False
) -> Tensor:
    """The 3dshapes images at ``indices`` (any order), uint8 ``[n, 3, 64, 64]``."""
    h5py = _h5py()
    path = dataset_files("3dshapes", [SHAPES3D_FILE], data_dir, download)[SHAPES3D_FILE]
    indices = np.asarray(indices, dtype=np.int64)
    uniq, inverse = np.unique(indices, return_inverse=True)
    imgs = np.zeros((len(uniq), 64, 64, 3), dtype=np.uint8)
    try:
        with h5py.File(path, "r") as f:
            _check_3dshapes(f, path)
            data = f["images"]
            if len(uniq) and (uniq[0] < 0 or uniq[-1] >= data.shape[0]):
                raise FedshiftError(f"3dshapes indices must lie in 0..{data.shape[0] - 1}")
            # h5py's scattered (fancy) reads are very slow: read contiguous blocks instead
            for lo in range(0, len(uniq) and int(uniq[-1]) + 1, _BLOCK):
                a, b = np.searchsorted(uniq, [lo, lo + _BLOCK])
                if b > a:
                    block = data[lo : min(lo + _BLOCK, int(uniq[-1]) + 1)]
                    imgs[a:b] = block[uniq[a:b] - lo]
    except OSError as e:
        raise FedshiftError(f"cannot read 3dshapes file {path} ({e})") from None
    return torch.from_numpy(imgs.astype(np.uint8)[inverse]).permute(0, 3, 1, 2).contiguous()


def _check_3dshapes(f, path) -> None:
    if "images" not in f or "labels" not in f:
        raise FedshiftError(f"{path} is not the 3dshapes release: it lacks 'images' or 'labels'")
    n = f["images"].shape[0]
    if f["images"].shape[1:] != (64, 64, 3) or f["labels"].shape != (n, 6):
        raise FedshiftError(
            f"{path} is not the 3dshapes release: expected images [N, 64, 64, 3] and labels "
            f"[N, 6], found {f['images'].shape} and {f['labels'].shape}"
        )
