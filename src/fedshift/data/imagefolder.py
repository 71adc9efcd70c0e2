"""Image-folder datasets to tensors: PACS and VLCS (``<domain>/<class>/<image>``) and the
released WaterBirds folder (``waterbird_complete95_forest2water2/`` with ``metadata.csv``),
built once from raw CUB-200-2011 + Places365 images when only those are there.

Images are decoded with Pillow (a dependency of matplotlib), converted to RGB and resized
to ``size × size`` (bilinear), giving uint8 ``[n, 3, size, size]``; files are read in sorted
name order, so the result never depends on the file system. Decoded folders are cached per
process (keyed by the folder, its files' sizes/mtimes and the size).

None of these releases publishes per-file checksums, so the structure is checked instead:
every expected domain and class folder must exist and hold at least one image. Where the
folder holds an ``MD5SUMS.txt`` (as ``shared/datasets/pacs_small`` does), every listed file
is checked against it. No download: PACS and VLCS are distributed through file-sharing
links, and the WaterBirds tarball has no published checksum; the errors say where to put
the files.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import FedshiftError
from .root import ENV_VAR, data_root, file_md5

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


@dataclass(frozen=True)
class DomainDataset:
    """A ``<domain>/<class>/`` image dataset: its names, folder candidates and layout."""

    title: str
    folders: tuple[str, ...]  # tried in order under the data root
    domains: tuple[str, ...]
    classes: tuple[str, ...]


PACS = DomainDataset(
    "PACS",
    ("pacs", "PACS", "pacs/kfold", "PACS/kfold"),
    ("art_painting", "cartoon", "photo", "sketch"),
    ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"),
)
PACS_SMALL = DomainDataset("PACS (small subset)", ("pacs_small",), PACS.domains, PACS.classes)
VLCS = DomainDataset(
    "VLCS",
    ("vlcs", "VLCS"),
    ("Caltech101", "LabelMe", "SUN09", "VOC2007"),
    ("bird", "car", "chair", "dog", "person"),
)
DOMAIN_DATASETS = {"pacs": PACS, "pacs_small": PACS_SMALL, "vlcs": VLCS}


def decode_images(paths: list[Path], size: int) -> Tensor:
    """Decode image files to uint8 ``[n, 3, size, size]`` (RGB, bilinear resize)."""
    from PIL import Image, UnidentifiedImageError

    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for i, p in enumerate(paths):
        try:
            with Image.open(p) as im:
                im.draft("RGB", (size, size))  # JPEG: decode at a reduced scale ≥ size
                im = im.convert("RGB")
                if im.size != (size, size):
                    im = im.resize((size, size), Image.BILINEAR)
                out[i] = np.asarray(im, dtype=np.uint8)
        except (OSError, UnidentifiedImageError) as e:
            raise FedshiftError(f"cannot decode image {p} ({e})") from None
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def _find_folder(ds: DomainDataset, data_dir) -> Path:
    root = data_root(data_dir)
    for name in ds.folders:
        if all((root / name / d).is_dir() for d in ds.domains):
            return root / name
    for name in ds.folders:  # report against the first candidate that exists at all
        if (root / name).is_dir():
            return root / name
    return root / ds.folders[0]


def _check_md5sums(folder: Path) -> None:
    sums = folder / "MD5SUMS.txt"
    if not sums.is_file():
        return
    bad = []
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        md5, rel = parts
        path = folder / rel.lstrip("*")
        if path.is_file() and file_md5(path) != md5:
            bad.append(rel)
    if bad:
        raise FedshiftError(
            f"{len(bad)} file(s) in {folder} differ from its MD5SUMS.txt (first: {bad[0]}); "
            "replace them with the released files"
        )


def domain_files(ds: DomainDataset, data_dir=None) -> dict[str, list[tuple[Path, int]]]:
    """``domain -> [(image path, class index)]`` in sorted order, after checking that every
    domain/class folder exists and holds images (one sentence naming what is missing)."""
    folder = _find_folder(ds, data_dir)
    missing, out = [], {}
    for d in ds.domains:
        items = []
        for c, cls in enumerate(ds.classes):
            sub = folder / d / cls
            files = (
                sorted(p for p in sub.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
                if sub.is_dir()
                else []
            )
            if not files:
                missing.append(f"{d}/{cls}/")
            items += [(p, c) for p in files]
        out[d] = items
    if missing:
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        shown = ", ".join(missing[:6]) + more
        raise FedshiftError(
            f"{ds.title} image folders {shown} are missing or empty in {folder}; put the images "
            f"there as <domain>/<class>/<image> (domains {', '.join(ds.domains)}; classes "
            f"{', '.join(ds.classes)}) or point the data root ({ENV_VAR} or --data-dir) at a "
            f"folder holding {ds.folders[0]}/"
        )
    _check_md5sums(folder)
    return out


@lru_cache(maxsize=4)
def _decode_domain(key: tuple, size: int) -> tuple[Tensor, Tensor]:
    paths = [Path(k[0]) for k in key]
    labels = torch.tensor([k[3] for k in key], dtype=torch.int64)
    return decode_images(paths, size), labels


def load_domains(
    name: str, size: int = 64, data_dir=None, domains: list[str] | None = None
) -> dict[str, tuple[Tensor, Tensor]]:
    """``domain -> (images uint8 [n, 3, size, size], labels int64 [n])`` of ``pacs``,
    ``pacs_small`` or ``vlcs`` (every domain, or those listed). Shared: do not modify."""
    if name not in DOMAIN_DATASETS:
        raise FedshiftError(
            f"unknown image-folder dataset {name!r}; choose one of: {', '.join(DOMAIN_DATASETS)}"
        )
    files = domain_files(DOMAIN_DATASETS[name], data_dir)
    out = {}
    for d in domains or list(files):
        key = tuple((str(p), *_stat(p), c) for p, c in files[d])
        out[d] = _decode_domain(key, int(size))
    return out


# ---------------------------------------------------------------- WaterBirds

WATERBIRDS_FOLDER = "waterbird_complete95_forest2water2"


@dataclass(frozen=True)
class WaterbirdsMeta:
    """One row per image of the released folder (``metadata.csv``)."""

    folder: Path
    files: tuple[str, ...]  # img_filename, relative to folder
    y: np.ndarray  # 0 landbird, 1 waterbird
    place: np.ndarray  # 0 land, 1 water (background of the released composite)
    species: np.ndarray  # CUB class index 0..199 (from the "NNN.Name/" folder)
    split: np.ndarray  # 0 train, 1 val, 2 test (the release's own split)


def _build_waterbirds_from_raw(root: Path, target: Path) -> Path | None:
    """Build the WaterBirds folder once from ``<root>/waterbirds/CUB_200_2011`` (with
    ``segmentations/`` inside or beside it) and ``<root>/waterbirds/places365`` or
    ``<root>/places365``; None when there is no raw CUB folder."""
    cub = root / "waterbirds" / "CUB_200_2011"
    if not cub.is_dir():
        return None
    from .waterbirds_build import build_waterbirds_folder, stderr_progress

    candidates = [root / "waterbirds" / "places365", root / "places365"]
    places = next((c for c in candidates if c.is_dir()), None)
    if places is None:
        raise FedshiftError(
            f"CUB-200-2011 is in {cub} but no Places365 folder was found at {candidates[0]} "
            f"or {candidates[1]}; put Places365's data_large/<letter>/<category>/ images "
            "(b/bamboo_forest, f/forest/broadleaf, o/ocean, l/lake/natural) in one of them to "
            "build WaterBirds"
        )
    print(
        f"building WaterBirds from {cub} and {places} into {target} (once)",
        file=sys.stderr,
        flush=True,
    )
    try:
        return build_waterbirds_folder(
            cub, places, root / "waterbirds", progress=stderr_progress("WaterBirds")
        )
    except FedshiftError:
        if (target / "metadata.csv").is_file():  # built meanwhile by another process
            return target
        raise


def waterbirds_metadata(data_dir=None) -> WaterbirdsMeta:
    """Read ``<root>/waterbirds/waterbird_complete95_forest2water2/metadata.csv`` (or the
    folder directly under the root) and check its columns. Without it, but with raw
    CUB-200-2011 and Places365 images under the root, the folder is built from them once
    (:mod:`fedshift.data.waterbirds_build`)."""
    root = data_root(data_dir)
    candidates = [root / "waterbirds" / WATERBIRDS_FOLDER, root / WATERBIRDS_FOLDER]
    folder = next((c for c in candidates if (c / "metadata.csv").is_file()), None)
    if folder is None:
        folder = _build_waterbirds_from_raw(root, candidates[0])
    if folder is None:
        raise FedshiftError(
            f"WaterBirds metadata.csv not found in {candidates[0]}; either unpack the released "
            f"{WATERBIRDS_FOLDER}.tar.gz (Sagawa et al., 2020) into {root / 'waterbirds'} so "
            f"that {WATERBIRDS_FOLDER}/metadata.csv and its <species>/<image>.jpg folders are "
            f"there, or put raw CUB-200-2011 (CUB_200_2011/ with segmentations/ inside or "
            f"beside it) into {root / 'waterbirds'} and Places365 (places365/data_large/"
            f"<letter>/<category>/) into {root / 'waterbirds'} or {root} to have it built "
            f"from them (fedshift data build-waterbirds), or point the data root elsewhere "
            f"({ENV_VAR} or --data-dir)"
        )
    need = ("img_filename", "y", "split", "place")
    with open(folder / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or any(k not in rows[0] for k in need):
        raise FedshiftError(
            f"{folder / 'metadata.csv'} is not the WaterBirds metadata: it needs the columns "
            f"{', '.join(need)}"
        )
    try:
        files = tuple(r["img_filename"] for r in rows)
        y = np.array([int(r["y"]) for r in rows], dtype=np.int64)
        place = np.array([int(r["place"]) for r in rows], dtype=np.int64)
        split = np.array([int(r["split"]) for r in rows], dtype=np.int64)
        species = np.array([int(fn.split("/")[0].split(".")[0]) - 1 for fn in files])
    except (ValueError, IndexError) as e:
        raise FedshiftError(f"{folder / 'metadata.csv'} has a malformed row ({e})") from None
    if not (set(y) <= {0, 1} and set(place) <= {0, 1}):
        raise FedshiftError(f"{folder / 'metadata.csv'}: y and place must be 0 or 1")
    return WaterbirdsMeta(folder, files, y, place, species.astype(np.int64), split)


def load_waterbirds_images(meta: WaterbirdsMeta, indices: np.ndarray, size: int) -> Tensor:
    """The released composites at ``indices`` (rows of ``metadata.csv``), uint8
    ``[n, 3, size, size]``."""
    paths = [meta.folder / meta.files[i] for i in np.asarray(indices, dtype=np.int64)]
    absent = [str(p) for p in paths if not p.is_file()]
    if absent:
        raise FedshiftError(
            f"{len(absent)} WaterBirds image(s) listed in metadata.csv are missing (first: "
            f"{absent[0]}); unpack the complete released folder"
        )
    return decode_images(paths, size)


def _stat(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_size, st.st_mtime_ns
