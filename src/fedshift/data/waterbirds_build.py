"""Build the WaterBirds folder from raw CUB-200-2011 and Places365 images, following the
procedure Sagawa et al. (2020, "Distributionally Robust Neural Networks") describe for
their ``dataset_scripts/generate_waterbirds.py``; the result has the layout of the released
``waterbird_complete95_forest2water2`` folder, so :func:`waterbirds_metadata` reads both.

* Label: y = 1 (waterbird) when the species name (``NNN.Species`` folder, after the dot)
  contains, case-insensitively, one of the seabird / waterfowl names of
  :data:`WATER_BIRDS`, else 0. As in the release, this substring rule also makes
  Eastern_Towhee, Western_Meadowlark and Western_Wood_Pewee waterbirds ("tern"): 46
  waterbird and 154 landbird species.
* Split: CUB's test images are split 2; of CUB's training images a seeded
  ``round(val_frac · n)`` are validation (split 1), the rest training (split 0).
* Place (0 land, 1 water): in training, per label, a seeded ``round(s · n)`` of the images
  get the agreeing background (water for waterbirds, land for landbirds) and the rest the
  other one, s = ``confounder_strength``; in validation and test, per label, a seeded
  ``round(n / 2)`` get water and the rest land.
* Background: land images from Places365's ``b/bamboo_forest`` and ``f/forest/broadleaf``,
  water from ``o/ocean`` and ``l/lake/natural``; each image gets its own file from a seeded
  shuffle of its place's files (files are re-used, in a new shuffle, only when a place has
  fewer files than images — our choice; the release never needs it). The background is
  scaled to cover the bird image and centre-cropped to its size, and the composite is
  ``mask · bird + (1 − mask) · background`` with the CUB segmentation scaled to [0, 1].

Every random draw has its own stream of ``(seed, purpose)``, so the folder depends on the
seed only, never on the file system's order; the composites are written as JPEG (quality
95) in a temporary folder beside the result and renamed into place at the end.
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import FedshiftError
from .partition import make_rng

WATER_BIRDS = (
    "Albatross",  # seabirds
    "Auklet",
    "Cormorant",
    "Frigatebird",
    "Fulmar",
    "Gull",
    "Jaeger",
    "Kittiwake",
    "Pelican",
    "Puffin",
    "Tern",
    "Gadwall",  # waterfowl
    "Grebe",
    "Mallard",
    "Merganser",
    "Guillemot",
    "Pacific_Loon",
)
# place 0 (land) and place 1 (water): Places365 categories as <letter>/<category>
PLACE_CATEGORIES = (("b/bamboo_forest", "f/forest/broadleaf"), ("o/ocean", "l/lake/natural"))
PLACE_SUFFIXES = (".jpg", ".jpeg", ".png")
COLUMNS = ("img_id", "img_filename", "y", "split", "place", "place_filename")
CUB_LAYOUT = (
    "CUB_200_2011/images.txt, CUB_200_2011/train_test_split.txt and "
    "CUB_200_2011/images/<NNN.Species>/<image>.jpg"
)
PLACES_LAYOUT = (
    "<places>/data_large/<letter>/<category>/<image>.jpg (land: b/bamboo_forest, "
    "f/forest/broadleaf; water: o/ocean, l/lake/natural)"
)


def waterbirds_folder_name(confounder_strength: float = 0.95) -> str:
    """The release's folder name, ``waterbird_complete95_forest2water2`` for s = 0.95."""
    return f"waterbird_complete{round(confounder_strength * 100)}_forest2water2"


def is_water_bird(species: str) -> bool:
    """Whether a CUB species (``NNN.Name`` or ``Name``) counts as a waterbird."""
    name = species.split(".", 1)[-1].lower()
    return any(w.lower() in name for w in WATER_BIRDS)


def find_cub(cub_dir) -> Path:
    """The ``CUB_200_2011`` folder: ``cub_dir`` itself or ``cub_dir/CUB_200_2011``."""
    cub_dir = Path(cub_dir).expanduser()
    for c in (cub_dir, cub_dir / "CUB_200_2011"):
        if (c / "images.txt").is_file():
            return c
    raise FedshiftError(
        f"CUB-200-2011 images.txt not found in {cub_dir} (nor in {cub_dir / 'CUB_200_2011'}); "
        f"unpack CUB_200_2011.tgz so that {CUB_LAYOUT} are there"
    )


def find_segmentations(cub: Path) -> Path:
    """``segmentations/`` inside ``CUB_200_2011/`` or beside it."""
    candidates = (cub / "segmentations", cub.parent / "segmentations")
    for c in candidates:
        if c.is_dir():
            return c
    raise FedshiftError(
        f"CUB-200-2011 segmentations folder not found (looked for {candidates[0]} and "
        f"{candidates[1]}); unpack segmentations.tgz (the separate CUB download) so that "
        "segmentations/<NNN.Species>/<image>.png lies inside or beside CUB_200_2011/"
    )


def _read_table(path: Path, what: str) -> dict[int, str]:
    if not path.is_file():
        raise FedshiftError(
            f"CUB-200-2011 {path.name} not found in {path.parent}; it belongs beside images.txt "
            f"({CUB_LAYOUT})"
        )
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        try:
            out[int(parts[0])] = parts[1].strip()
        except (ValueError, IndexError):
            raise FedshiftError(f"{path} line {n} is not '<id> <{what}>': {line!r}") from None
    return out


def read_cub(cub: Path) -> tuple[np.ndarray, list[str], np.ndarray]:
    """``(img_id, img_filename, is_train)`` in img_id order, from images.txt and
    train_test_split.txt."""
    files = _read_table(cub / "images.txt", "image path")
    is_train = _read_table(cub / "train_test_split.txt", "is_training_image")
    if not files:
        raise FedshiftError(f"{cub / 'images.txt'} lists no images")
    ids = np.array(sorted(files), dtype=np.int64)
    absent = [i for i in ids if i not in is_train]
    if absent:
        raise FedshiftError(
            f"{cub / 'train_test_split.txt'} has no row for {len(absent)} image id(s) of "
            f"images.txt (first: {absent[0]})"
        )
    bad = [i for i in ids if is_train[i] not in ("0", "1") or "/" not in files[i]]
    if bad:
        raise FedshiftError(
            f"image id {bad[0]} of {cub} is malformed: images.txt needs "
            "<NNN.Species>/<image>.jpg and train_test_split.txt 0 or 1"
        )
    train = np.array([is_train[i] == "1" for i in ids])
    return ids, [files[i] for i in ids], train


def place_files(places_dir) -> tuple[list[list[str]], list[list[str]]]:
    """``/letter/category/file`` names (sorted) and their paths of the land (0) and water
    (1) categories; every category must hold images."""
    places_dir = Path(places_dir).expanduser()
    names: list[list[str]] = [[], []]
    paths: list[list[str]] = [[], []]
    for place, cats in enumerate(PLACE_CATEGORIES):
        for cat in cats:
            bare = cat.split("/", 1)[1]
            candidates = [
                places_dir / "data_large" / cat,
                places_dir / "data_256" / cat,
                places_dir / cat,
                places_dir / bare,
            ]
            found = None
            for c in candidates:
                files = (
                    sorted(
                        p.name
                        for p in c.iterdir()
                        if p.suffix.lower() in PLACE_SUFFIXES and p.is_file()
                    )
                    if c.is_dir()
                    else []
                )
                if files:
                    found = (c, files)
                    break
            if found is None:
                raise FedshiftError(
                    f"Places365 category {cat} is missing or holds no images in {places_dir} "
                    f"(looked in data_large/{cat}, data_256/{cat}, {cat} and {bare}); put "
                    f"Places365 images there as {PLACES_LAYOUT}"
                )
            folder, files = found
            names[place] += [f"/{cat}/{f}" for f in files]
            paths[place] += [str(folder / f) for f in files]
    return names, paths


def assign(
    y: np.ndarray,
    is_train: np.ndarray,
    *,
    val_frac: float,
    confounder_strength: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(split, place)`` per image: the seeded validation draw and background draw."""
    n = len(y)
    split = np.where(is_train, 0, 2).astype(np.int64)
    train = np.flatnonzero(is_train)
    rng = make_rng(seed, "waterbirds-build/val")
    val = rng.choice(train, size=int(np.round(val_frac * len(train))), replace=False)
    split[val] = 1
    place = np.zeros(n, dtype=np.int64)
    for s in (0, 1, 2):
        for label in (0, 1):
            if s == 0:  # P(water) = s for waterbirds, 1 − s for landbirds
                water = confounder_strength if label == 1 else 1.0 - confounder_strength
            else:
                water = 0.5
            ids = np.flatnonzero((split == s) & (y == label))
            rng = make_rng(seed, "waterbirds-build/place", s, label)
            place[rng.choice(ids, size=int(np.round(water * len(ids))), replace=False)] = 1
    return split, place


def _backgrounds(place: np.ndarray, n_files: tuple[int, int], seed: int) -> np.ndarray:
    """Index into its place's file list for every image (a seeded shuffle, re-shuffled
    when a place has fewer files than images)."""
    out = np.zeros(len(place), dtype=np.int64)
    for k in (0, 1):
        ids = np.flatnonzero(place == k)
        if not len(ids):
            continue
        rng = make_rng(seed, "waterbirds-build/background", k)
        rounds = -(-len(ids) // n_files[k])
        order = np.concatenate([rng.permutation(n_files[k]) for _ in range(rounds)])
        out[ids] = order[: len(ids)]
    return out


def composite(bird_path, seg_path, background_path, size: int | None = None):
    """``mask · bird + (1 − mask) · background`` as a PIL RGB image (the bird's size, or
    ``size × size``); the background scaled to cover and centre-cropped."""
    from PIL import Image, ImageOps

    with Image.open(bird_path) as im:
        bird = im.convert("RGB")
    with Image.open(seg_path) as im:
        seg = im.convert("L")
    if size is not None:
        bird = bird.resize((size, size), Image.BILINEAR)
    if seg.size != bird.size:
        seg = seg.resize(bird.size, Image.BILINEAR)
    with Image.open(background_path) as im:
        bg = ImageOps.fit(im.convert("RGB"), bird.size, Image.LANCZOS)
    mask = np.asarray(seg, dtype=np.float64)[..., None] / 255.0
    out = mask * np.asarray(bird, dtype=np.float64) + (1.0 - mask) * np.asarray(bg, np.float64)
    return Image.fromarray(np.clip(np.round(out), 0, 255).astype(np.uint8), "RGB")


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """A progress callback printing ``label: k/n`` on stderr at every tenth."""
    shown = set()

    def report(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth not in shown and (done == total or done % max(total // 10, 1) == 0):
            shown.add(tenth)
            print(f"{label}: {done}/{total} images", file=sys.stderr, flush=True)

    return report


def build_waterbirds_folder(
    cub_dir,
    places_dir,
    out_dir,
    *,
    val_frac: float = 0.2,
    confounder_strength: float = 0.95,
    seed: int = 0,
    size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Composite CUB-200-2011 birds onto Places365 backgrounds into
    ``out_dir/waterbird_complete{round(100 s)}_forest2water2/`` (``metadata.csv`` with
    the columns img_id, img_filename, y, split, place, place_filename and
    ``<NNN.Species>/<image>.jpg``) and return that folder. ``cub_dir`` is
    ``CUB_200_2011/`` or the folder holding it; ``segmentations/`` lies inside or beside
    it. ``size`` resizes the composites to ``size × size`` (None: the bird's own size).
    Nothing is left behind when the build fails or is interrupted."""
    if not 0.0 <= val_frac < 1.0:
        raise FedshiftError(f"val_frac={val_frac} must lie in [0, 1)")
    if not 0.0 <= confounder_strength <= 1.0:
        raise FedshiftError(f"confounder_strength={confounder_strength} must lie in [0, 1]")
    if size is not None and not 1 <= int(size) <= 4096:
        raise FedshiftError(f"size={size} must lie in 1..4096 (or be None)")
    cub = find_cub(cub_dir)
    ids, files, is_train = read_cub(cub)
    segs = find_segmentations(cub)
    bird_paths = [cub / "images" / f for f in files]
    seg_paths = [segs / (f.rsplit(".", 1)[0] + ".png") for f in files]
    for kind, paths, where in (
        ("image", bird_paths, f"{cub / 'images'}/<NNN.Species>/<image>.jpg"),
        ("segmentation", seg_paths, f"{segs}/<NNN.Species>/<image>.png"),
    ):
        absent = [p for p in paths if not p.is_file()]
        if absent:
            raise FedshiftError(
                f"{len(absent)} CUB-200-2011 {kind}(s) of the images listed in images.txt are "
                f"missing (first: {absent[0]}); they belong in {where}"
            )
    names, place_paths = place_files(places_dir)

    y = np.array([int(is_water_bird(f.split("/", 1)[0])) for f in files], dtype=np.int64)
    split, place = assign(
        y, is_train, val_frac=val_frac, confounder_strength=confounder_strength, seed=seed
    )
    bg = _backgrounds(place, (len(names[0]), len(names[1])), seed)

    out_dir = Path(out_dir).expanduser()
    final = out_dir / waterbirds_folder_name(confounder_strength)
    if final.exists():
        raise FedshiftError(f"{final} already exists; remove it to build WaterBirds again")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=out_dir))
    try:
        for i, f in enumerate(files):
            background = place_paths[int(place[i])][bg[i]]
            try:
                img = composite(bird_paths[i], seg_paths[i], background, size)
            except OSError as e:  # PIL's UnidentifiedImageError included
                raise FedshiftError(
                    f"cannot composite {bird_paths[i]} (segmentation {seg_paths[i]}, background "
                    f"{background}): {e}"
                ) from None
            target = tmp / f
            target.parent.mkdir(parents=True, exist_ok=True)
            img.save(target, format="JPEG", quality=95)
            if progress is not None:
                progress(i + 1, len(files))
        with open(tmp / "metadata.csv", "w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(COLUMNS)
            for i, f in enumerate(files):
                pf = names[int(place[i])][bg[i]]
                w.writerow([int(ids[i]), f, int(y[i]), int(split[i]), int(place[i]), pf])
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            raise FedshiftError(
                f"{final} appeared while WaterBirds was being built; remove it to build again"
            ) from None
    except OSError as e:
        raise FedshiftError(f"building WaterBirds in {out_dir} failed ({e})") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
