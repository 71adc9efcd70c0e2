"""WaterBirds built from raw CUB-200-2011 + Places365 (Sagawa et al. 2020's procedure) on
tiny fixtures written in the real layouts (all in tmp_path): metadata, labels, splits, the
seeded place draw, composite pixels, determinism, missing-file errors, atomicity, the
auto-build through the scenario and the CLI command."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.data.imagefolder import waterbirds_metadata
from fedshift.data.registry import build_scenario
from fedshift.data.waterbirds_build import (
    PLACE_CATEGORIES,
    build_waterbirds_folder,
    is_water_bird,
    waterbirds_folder_name,
)
from fedshift.errors import FedshiftError

FOLDER = "waterbird_complete95_forest2water2"
SPECIES = [
    "001.Black_footed_Albatross",
    "059.California_Gull",
    "143.Caspian_Tern",
    "050.Eared_Grebe",
    "073.Blue_Jay",
    "020.Yellow_breasted_Chat",
    "150.Sage_Thrasher",
    "151.Black_capped_Vireo",
]
WATER = {0, 1, 2, 3}
# background colours: land categories greenish, water categories bluish
PLACE_COLOURS = {
    "b/bamboo_forest": (40, 200, 40),
    "f/forest/broadleaf": (60, 160, 20),
    "o/ocean": (20, 40, 220),
    "l/lake/natural": (40, 80, 180),
}
BIRD = (220, 60, 60)
W, H = 48, 16  # three 16-px JPEG blocks: mask 1 | 0.5 | 0


def _one_sentence(msg: str) -> bool:
    return "\n" not in msg and msg.count(". ") == 0


def _img(path: Path, colour, size=(W, H), fmt=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, format=fmt)


def _raw(
    base: Path,
    species=SPECIES,
    per: int = 6,
    seg_beside: bool = False,
    places_prefix: str = "data_large",
    places_per: int = 2,
) -> tuple[Path, Path]:
    """CUB_200_2011/ (+ segmentations/) and places365/ under ``base``; image j of a
    species is a CUB test image when j is odd."""
    cub = base / "CUB_200_2011"
    segs = (base if seg_beside else cub) / "segmentations"
    images, split, labels = [], [], []
    i = 0
    for s, name in enumerate(species):
        for j in range(per):
            i += 1
            rel = f"{name}/{name.split('.')[1]}_{j:04d}_{i}.jpg"
            images.append(f"{i} {rel}")
            split.append(f"{i} {int(j % 2 == 0)}")
            labels.append(f"{i} {s + 1}")
            _img(cub / "images" / rel, BIRD)
            mask = np.zeros((H, W), dtype=np.uint8)
            mask[:, :16] = 255
            mask[:, 16:32] = 128
            seg = segs / rel.replace(".jpg", ".png")
            seg.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(mask, "L").save(seg)
    cub.mkdir(parents=True, exist_ok=True)
    (cub / "images.txt").write_text("\n".join(images) + "\n")
    (cub / "train_test_split.txt").write_text("\n".join(split) + "\n")
    (cub / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    places = base / "places365"
    for cat, colour in PLACE_COLOURS.items():
        for j in range(places_per):
            folder = places / places_prefix / cat if places_prefix else places / cat
            _img(folder / f"{j:08d}.jpg", colour, size=(64 + 8 * j, 40))
    return cub, places


def _rows(folder: Path) -> list[dict]:
    with open(folder / "metadata.csv", newline="") as f:
        return list(csv.DictReader(f))


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int64)


def test_label_rule_is_the_release_substring_rule():
    assert is_water_bird("001.Black_footed_Albatross") and is_water_bird("Pacific_Loon")
    assert is_water_bird("100.Brown_Pelican") and is_water_bird("Red_breasted_Merganser")
    assert not is_water_bird("073.Blue_Jay") and not is_water_bird("108.White_necked_Raven")
    assert is_water_bird("166.Eastern_Towhee")  # "tern", as in the released folder
    assert waterbirds_folder_name(0.95) == FOLDER


def test_build_metadata_labels_splits_and_places(tmp_path):
    cub, places = _raw(tmp_path / "raw", per=10)
    folder = build_waterbirds_folder(cub, places, tmp_path / "out", confounder_strength=1.0)
    assert folder == tmp_path / "out" / "waterbird_complete100_forest2water2"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [folder.name]  # no temp
    with open(folder / "metadata.csv", newline="") as f:
        assert next(csv.reader(f)) == [
            "img_id",
            "img_filename",
            "y",
            "split",
            "place",
            "place_filename",
        ]
    rows = _rows(folder)
    images = (cub / "images.txt").read_text().split()
    assert [r["img_filename"] for r in rows] == images[1::2]
    assert [int(r["img_id"]) for r in rows] == list(range(1, len(rows) + 1))
    is_train = dict(
        line.split() for line in (cub / "train_test_split.txt").read_text().split("\n") if line
    )
    y = np.array([int(r["y"]) for r in rows])
    split = np.array([int(r["split"]) for r in rows])
    place = np.array([int(r["place"]) for r in rows])
    for r, lab, sp in zip(rows, y, split, strict=True):
        s = SPECIES.index(r["img_filename"].split("/")[0])
        assert lab == int(s in WATER)
        assert (sp == 2) == (is_train[r["img_id"]] == "0")
        assert (folder / r["img_filename"]).is_file()
        cat = "/".join(r["place_filename"].split("/")[1:-1])
        assert cat in PLACE_CATEGORIES[int(r["place"])]
    n_train = int((split != 2).sum())
    assert (split == 1).sum() == int(np.round(0.2 * n_train))
    assert np.array_equal(place[split == 0], y[split == 0])  # strength 1: always agrees
    for s in (1, 2):  # validation and test: half the images of each label on water
        for lab in (0, 1):
            sel = (split == s) & (y == lab)
            assert place[sel].sum() == int(np.round(sel.sum() / 2))


def test_train_place_draw_with_strength(tmp_path):
    cub, places = _raw(tmp_path / "raw", per=20)
    folder = build_waterbirds_folder(cub, places, tmp_path / "out", confounder_strength=0.75)
    rows = _rows(folder)
    y = np.array([int(r["y"]) for r in rows])
    split = np.array([int(r["split"]) for r in rows])
    place = np.array([int(r["place"]) for r in rows])
    for lab in (0, 1):
        sel = (split == 0) & (y == lab)
        assert (place[sel] == lab).sum() == int(np.round(0.75 * sel.sum()))


def test_composite_pixels(tmp_path):
    cub, places = _raw(tmp_path / "raw", per=4)
    folder = build_waterbirds_folder(cub, places, tmp_path / "out")
    assert folder.name == FOLDER
    colours = {k: np.array(v) for k, v in PLACE_COLOURS.items()}
    seen = set()
    for r in _rows(folder):
        px = _pixels(folder / r["img_filename"])
        assert px.shape == (H, W, 3)
        bird = _pixels(cub / "images" / r["img_filename"])[0, 0]
        cat = "/".join(r["place_filename"].split("/")[1:-1])
        seen.add(cat)
        bg = _pixels(places / "data_large" / r["place_filename"][1:])[0, 0]
        assert np.abs(bg - colours[cat]).max() <= 3
        # away from the region borders (JPEG's chroma upsampling blends across them)
        assert np.abs(px[:, :14] - bird).max() <= 4  # mask 1: the bird
        assert np.abs(px[:, 18:30] - (bird + bg) / 2).max() <= 4  # mask 0.5: the blend
        assert np.abs(px[:, 34:] - bg).max() <= 4  # mask 0: the background
    assert seen == set(PLACE_COLOURS)  # backgrounds from every category


def test_size_seed_and_determinism(tmp_path):
    cub, places = _raw(tmp_path / "raw", per=8)
    a = build_waterbirds_folder(cub, places, tmp_path / "a", seed=3, size=8)
    b = build_waterbirds_folder(cub, places, tmp_path / "b", seed=3, size=8)
    c = build_waterbirds_folder(cub, places, tmp_path / "c", seed=4, size=8)
    assert (a / "metadata.csv").read_bytes() == (b / "metadata.csv").read_bytes()
    assert (a / "metadata.csv").read_bytes() != (c / "metadata.csv").read_bytes()
    for r in _rows(a):
        assert (a / r["img_filename"]).read_bytes() == (b / r["img_filename"]).read_bytes()
        assert _pixels(a / r["img_filename"]).shape == (8, 8, 3)


def test_accepted_layouts(tmp_path):
    # segmentations beside CUB_200_2011/, Places categories directly under the folder,
    # CUB given as the folder holding CUB_200_2011/
    _, places = _raw(tmp_path / "raw", per=2, seg_beside=True, places_prefix="")
    folder = build_waterbirds_folder(tmp_path / "raw", places, tmp_path / "out")
    assert len(_rows(folder)) == 2 * len(SPECIES)


def _remove(path: Path) -> None:
    if path.is_dir():
        for p in sorted(path.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        path.rmdir()
    else:
        path.unlink()


@pytest.mark.parametrize(
    "missing, named",
    [
        ("CUB_200_2011/images.txt", "images.txt"),
        ("CUB_200_2011/train_test_split.txt", "train_test_split.txt"),
        ("CUB_200_2011/segmentations", "segmentations"),
        ("CUB_200_2011/images/073.Blue_Jay/Blue_Jay_0001_14.jpg", "Blue_Jay_0001_14.jpg"),
        (
            "CUB_200_2011/segmentations/001.Black_footed_Albatross/"
            "Black_footed_Albatross_0000_1.png",
            "Black_footed_Albatross_0000_1.png",
        ),
        ("places365/data_large/o/ocean/00000000.jpg|00000001.jpg", "o/ocean"),
        ("places365/data_large/f/forest/broadleaf", "f/forest/broadleaf"),
    ],
)
def test_missing_files_one_sentence(tmp_path, missing, named):
    cub, places = _raw(tmp_path / "raw", per=3)
    first, *more = missing.split("|")
    _remove(tmp_path / "raw" / first)
    for name in more:
        _remove((tmp_path / "raw" / first).parent / name)
    with pytest.raises(FedshiftError) as err:
        build_waterbirds_folder(cub, places, tmp_path / "out")
    msg = str(err.value)
    assert named in msg and _one_sentence(msg), msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_failure_midway_leaves_nothing(tmp_path):
    cub, places = _raw(tmp_path / "raw", per=3)
    bad = cub / "images" / "073.Blue_Jay" / "Blue_Jay_0001_14.jpg"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(FedshiftError) as err:
        build_waterbirds_folder(cub, places, tmp_path / "out")
    assert "Blue_Jay_0001_14.jpg" in str(err.value) and "\n" not in str(err.value)
    assert list((tmp_path / "out").iterdir()) == []
    bad.unlink()
    _img(bad, BIRD)
    build_waterbirds_folder(cub, places, tmp_path / "out")
    with pytest.raises(FedshiftError, match="already exists"):
        build_waterbirds_folder(cub, places, tmp_path / "out")


def test_scenario_builds_the_folder_from_raw_data(tmp_path, capsys):
    with pytest.raises(FedshiftError) as err:
        waterbirds_metadata(tmp_path)
    msg = str(err.value)
    assert "tar.gz" in msg and "CUB_200_2011" in msg and "places365" in msg
    assert _one_sentence(msg)
    species = [f"{s + 1:03d}.Sea_Gull_{s}" for s in range(8)]
    species += [f"{s + 9:03d}.Song_Sparrow_{s}" for s in range(10)]
    cub, places = _raw(tmp_path / "waterbirds", species=species, per=12)
    # Places365 directly under the data root is accepted too
    places.rename(tmp_path / "places365")
    opts = dict(
        clients=4,
        partitions=4,
        waterbird_species=[2, 3],
        landbird_species=[2, 4],
        image_size=8,
        test_fraction=0.5,
    )
    d = build_scenario("waterbirds", opts, 0, tmp_path)
    assert "building WaterBirds" in capsys.readouterr().err
    folder = tmp_path / "waterbirds" / FOLDER
    assert (folder / "metadata.csv").is_file()
    assert d.num_clients == 4 and d.num_classes == 2 and d.input_shape == (3, 8, 8)
    meta = waterbirds_metadata(tmp_path)
    assert meta.folder == folder and len(meta.files) == 18 * 12
    assert set(meta.y[meta.species < 8]) == {1} and set(meta.y[meta.species >= 8]) == {0}
    stamp = (folder / "metadata.csv").stat().st_mtime_ns
    d2 = build_scenario("waterbirds", opts, 0, tmp_path)  # read, not rebuilt
    assert (folder / "metadata.csv").stat().st_mtime_ns == stamp
    assert "building" not in capsys.readouterr().err
    assert np.array_equal(d.train.y.numpy(), d2.train.y.numpy())


def test_auto_build_without_places_names_both_folders(tmp_path):
    _raw(tmp_path / "waterbirds", per=2)
    _remove(tmp_path / "waterbirds" / "places365")
    with pytest.raises(FedshiftError) as err:
        waterbirds_metadata(tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "places365") in msg and str(tmp_path / "waterbirds" / "places365") in msg
    assert _one_sentence(msg)


def test_cli_build_waterbirds(tmp_path):
    cub, places = _raw(tmp_path / "raw", per=2)
    runner = CliRunner()
    args = ["data", "build-waterbirds", "--cub", str(cub), "--places", str(places)]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "out"), "--seed", "2"])
    assert res.exit_code == 0, res.output
    folder = tmp_path / "out" / FOLDER
    assert len(_rows(folder)) == 2 * len(SPECIES)
    ref = build_waterbirds_folder(cub, places, tmp_path / "ref", seed=2)
    assert (folder / "metadata.csv").read_bytes() == (ref / "metadata.csv").read_bytes()
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "already exists" in res.output
    assert "Traceback" not in res.output
