"""CIFAR-10, EMNIST, dSprites, 3dshapes, PACS/VLCS and WaterBirds loaders and their
scenarios: missing-file errors, round trips on tiny fixtures written in the real formats
and layouts (all in tmp_path), download only from a local server on 127.0.0.1, the real
PACS subset, and determinism (build twice → identical tensors)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import pickle
import sys
import tarfile
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fedshift as fs
from fedshift.data import root
from fedshift.data.cifar import load_cifar10
from fedshift.data.emnist import load_emnist
from fedshift.data.imagefolder import load_domains, waterbirds_metadata
from fedshift.data.sprites import load_3dshapes_factors, load_dsprites
from fedshift.errors import FedshiftError


def _one_sentence(msg: str) -> bool:
    return "\n" not in msg and msg.count(". ") == 0


def _same(a, b) -> None:
    assert a.num_clients == b.num_clients and a.input_shape == b.input_shape
    for sa, sb in [(a.train, b.train)] + [(a.test[k], b.test[k]) for k in a.test]:
        assert torch.equal(sa.x, sb.x) and torch.equal(sa.y, sb.y)
        assert torch.equal(sa.offsets, sb.offsets)
    assert list(a.test) == list(b.test)


# ---------------------------------------------------------------- CIFAR-10


def _cifar_batches(folder: Path, n: int = 20) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    sub = folder / "cifar-10-batches-py"
    sub.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        rng = np.random.default_rng(i)
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        with open(sub / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f)
        out[name] = (data, np.array(labels))
    return out


def _cifar_spec(folder: Path, **kw):
    md5 = {
        f"cifar-10-batches-py/{p.name}": hashlib.md5(p.read_bytes()).hexdigest()
        for p in (folder / "cifar-10-batches-py").iterdir()
    }
    return replace(root.DATASETS["cifar10"], md5=md5, **kw)


def test_cifar10_round_trip(tmp_path, monkeypatch):
    batches = _cifar_batches(tmp_path / "cifar10")
    with pytest.raises(FedshiftError, match="md5"):  # generated files are not canonical
        load_cifar10(tmp_path, train=False)
    monkeypatch.setitem(root.DATASETS, "cifar10", _cifar_spec(tmp_path / "cifar10"))
    x, y = load_cifar10(tmp_path, train=True)
    assert x.shape == (100, 3, 32, 32) and x.dtype == torch.uint8 and y.shape == (100,)
    data, labels = batches["data_batch_2"]
    assert torch.equal(x[20:40], torch.from_numpy(data.reshape(-1, 3, 32, 32)))
    assert y[20:40].tolist() == labels.tolist()
    tx, ty = load_cifar10(tmp_path, train=False)
    assert tx.shape == (20, 3, 32, 32)
    d = fs.scenario("iid", dataset="cifar10", clients=4, data_dir=tmp_path)
    assert d.input_shape == (3, 32, 32) and d.num_clients == 4 and d.default_model == "fedavg-cnn"
    _same(d, fs.scenario("iid", dataset="cifar10", clients=4, data_dir=tmp_path))


def test_cifar10_missing_is_one_sentence(tmp_path):
    with pytest.raises(FedshiftError) as err:
        load_cifar10(tmp_path)
    msg = str(err.value)
    assert "data_batch_1" in msg and str(tmp_path / "cifar10") in msg and "download" in msg
    assert _one_sentence(msg)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_dir(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_Quiet, directory=str(served))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_cifar10_download_archive_from_local_server(http_dir, tmp_path, monkeypatch):
    served, url = http_dir
    src = tmp_path / "src"
    _cifar_batches(src)
    archive = served / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    spec = _cifar_spec(src, mirrors=(url,), archive=("cifar-10-python.tar.gz", md5))
    monkeypatch.setitem(root.DATASETS, "cifar10", spec)
    data = tmp_path / "root"
    with pytest.raises(FedshiftError, match="not found"):
        load_cifar10(data, train=False)  # off by default
    x, y = load_cifar10(data, train=False, download=True)
    assert x.shape == (20, 3, 32, 32)
    assert (data / "cifar10" / "cifar-10-batches-py" / "test_batch").is_file()
    # a corrupt archive (wrong md5) is refused and nothing is unpacked
    monkeypatch.setitem(
        root.DATASETS, "cifar10", replace(spec, archive=("cifar-10-python.tar.gz", "0" * 32))
    )
    with pytest.raises(FedshiftError, match="md5"):
        load_cifar10(tmp_path / "other", train=False, download=True)
    assert not (tmp_path / "other" / "cifar10" / "cifar-10-batches-py").exists()


def test_archive_with_escaping_member_is_refused(tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        info = tarfile.TarInfo("../evil")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(FedshiftError, match="outside"):
        root.extract_archive(bad, tmp_path / "into")


# ---------------------------------------------------------------- EMNIST


def _idx(arr: np.ndarray) -> bytes:
    return bytes([0, 0, 8, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes() + arr.tobytes()


def _emnist(folder: Path, split: str, n: int, low: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = (rng.integers(0, classes, size=n) + low).astype(np.uint8)
    (folder / "gzip").mkdir(parents=True, exist_ok=True)
    for part in ("train", "test"):
        base = folder / "gzip" / f"emnist-{split}-{part}"
        (base.parent / f"{base.name}-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(x)))
        (base.parent / f"{base.name}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(y)))
    return x, y


def test_emnist_round_trip_transposed_and_letters_shifted(tmp_path):
    x, y = _emnist(tmp_path / "emnist", "balanced", 300, 0, 47)
    tx, ty = load_emnist("balanced", tmp_path, train=True)
    assert torch.equal(tx, torch.from_numpy(x.transpose(0, 2, 1).copy()))  # made upright
    assert ty.tolist() == y.astype(int).tolist()
    _, ly = _emnist(tmp_path / "emnist", "letters", 50, 1, 26, seed=1)
    assert load_emnist("letters", tmp_path, train=False)[1].tolist() == (ly - 1).tolist()
    d = fs.scenario("dirichlet", dataset="emnist", clients=3, samples=200, data_dir=tmp_path)
    assert d.num_classes == 47 and d.input_shape == (1, 28, 28)
    with pytest.raises(FedshiftError, match="unknown EMNIST split"):
        load_emnist("nope", tmp_path)


def test_emnist_missing_and_bad_labels(tmp_path):
    with pytest.raises(FedshiftError) as err:
        load_emnist("digits", tmp_path)
    msg = str(err.value)
    assert "emnist-digits-train-images-idx3-ubyte.gz" in msg and "gzip.zip" in msg
    assert _one_sentence(msg)
    _emnist(tmp_path / "emnist", "digits", 20, 0, 12)  # labels up to 11: not EMNIST digits
    with pytest.raises(FedshiftError, match="outside"):
        load_emnist("digits", tmp_path)


# ---------------------------------------------------------------- dSprites / 3dshapes


def _dsprites(folder: Path, per: int = 2) -> None:
    # every (scale, orientation) pair `per` times, other latents random
    rng = np.random.default_rng(0)
    scale, orient = np.meshgrid(np.arange(6), np.arange(40), indexing="ij")
    scale = np.repeat(scale.ravel(), per)
    orient = np.repeat(orient.ravel(), per)
    n = len(scale)
    lat = np.stack(
        [
            np.zeros(n),
            rng.integers(0, 3, n),
            scale,
            orient,
            rng.integers(0, 32, n),
            rng.integers(0, 32, n),
        ],
        1,
    ).astype(np.int64)
    imgs = np.zeros((n, 64, 64), dtype=np.uint8)
    for i in range(n):  # a square whose side grows with the scale class
        s = 8 + 4 * scale[i]
        imgs[i, :s, :s] = 1
    folder.mkdir(parents=True)
    np.savez_compressed(
        folder / "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz",
        imgs=imgs,
        latents_classes=lat,
        latents_values=lat.astype(float),
    )


def test_dsprites_round_trip_and_scenario(tmp_path):
    with pytest.raises(FedshiftError) as err:
        load_dsprites(tmp_path)
    assert "dsprites_ndarray" in str(err.value) and _one_sentence(str(err.value))
    _dsprites(tmp_path / "dsprites")
    imgs, lat = load_dsprites(tmp_path)
    assert imgs.shape == (480, 64, 64) and lat.shape == (480, 6)
    d = fs.scenario("dsprites", data_dir=tmp_path, image_size=16)
    assert d.num_clients == 40 and d.num_classes == 6 and d.input_shape == (1, 16, 16)
    for k in range(40):  # client k sees only orientation k
        assert set(d.train.client_env(k).tolist()) <= {k}
    assert d.info["client_orientations"][3] == [3]
    assert d.test["test"].sizes().tolist() == [6] * 40  # half of the 12 images per client
    _same(d, fs.scenario("dsprites", data_dir=tmp_path, image_size=16))
    d8 = fs.scenario("dsprites", data_dir=tmp_path, image_size=16, clients=8)
    assert set(d8.train.client_env(1).tolist()) <= {1, 9, 17, 25, 33}


def test_dsprites_wrong_structure(tmp_path):
    (tmp_path / "dsprites").mkdir()
    np.savez(tmp_path / "dsprites" / "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz", a=1)
    with pytest.raises(FedshiftError, match="lacks"):
        load_dsprites(tmp_path)


def test_3dshapes_without_h5py_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py now raises ImportError
    with pytest.raises(FedshiftError) as err:
        load_3dshapes_factors(tmp_path)
    assert "h5py" in str(err.value) and "fedshift[h5]" in str(err.value)
    assert _one_sentence(str(err.value))


def test_3dshapes_round_trip_and_scenarios(tmp_path):
    h5py = pytest.importorskip("h5py")
    with pytest.raises(FedshiftError, match="3dshapes.h5"):
        load_3dshapes_factors(tmp_path)
    # all 10 × 10 floor/wall hues × 4 shapes × 8 scales would be 3,200 images; use
    # floor/wall × shape × (scale 0 or 1) = 800 images of 64×64×3
    grid = np.stack(
        np.meshgrid(np.arange(10), np.arange(10), [0], [0, 1], np.arange(4), [0], indexing="ij"), -1
    ).reshape(-1, 6)
    labels = grid.astype(float) * [0.1, 0.1, 0.1, 1.0, 1.0, 1.0] + [0, 0, 0, 0.75, 0, -30]
    images = np.zeros((len(grid), 64, 64, 3), dtype=np.uint8)
    images[:, :, :, 0] = (grid[:, 4] * 60)[:, None, None]
    (tmp_path / "3dshapes").mkdir()
    with h5py.File(tmp_path / "3dshapes" / "3dshapes.h5", "w") as f:
        f["images"] = images
        f["labels"] = labels
    factors = load_3dshapes_factors(tmp_path)
    assert factors.shape == (800, 6) and factors[:, 4].max() == 3 and factors[:, 3].max() == 1
    d = fs.scenario("3dshapes", data_dir=tmp_path, image_size=8, train_ratio=0.25)
    assert d.num_clients == 50 and d.num_classes == 4 and d.input_shape == (3, 8, 8)
    for k in range(50):  # each client two (floor, wall) pairs
        assert len(d.info["client_attributes"][k]) == 2
        assert set(d.train.client_env(k).tolist()) <= set(d.info["client_attributes"][k])
    x, y = d.test["test"].client(0)
    assert torch.allclose(x[:, 0, 0, 0], y.float() * 60 / 255)  # pixels follow their labels
    _same(d, fs.scenario("3dshapes", data_dir=tmp_path, image_size=8, train_ratio=0.25))
    s = fs.scenario("3dshapes", data_dir=tmp_path, image_size=8, skew="scale", train_ratio=0.2)
    assert s.num_clients == 10 and s.info["client_attributes"][3] == [1]


# ---------------------------------------------------------------- PACS / VLCS


def test_pacs_on_the_real_subset(shared_datasets):
    d = fs.scenario("pacs", dataset="pacs_small", held_out="photo", data_dir=shared_datasets)
    assert d.num_clients == 6 and d.num_classes == 7 and d.input_shape == (3, 32, 32)
    assert list(d.test) == ["domain=photo"]
    assert sorted(d.info["client_domain"]) == sorted(["art_painting", "cartoon", "sketch"] * 2)
    classes = d.info["classes"]
    g1, g2 = {"dog", "elephant", "giraffe"}, {"guitar", "horse", "house", "person"}
    for k in range(6):
        own = set(d.info["client_classes"][k])
        assert own in (g1, g2)
        tr = {classes[c] for c in d.train.client(k)[1].tolist()}
        te = {classes[c] for c in d.test["domain=photo"].client(k)[1].tolist()}
        assert tr == own and te == own  # same classes in train and test
        n_test = 50 * len(own)  # the subset has 50 images per domain × class
        assert len(d.test["domain=photo"].client(k)[1]) == n_test
        env = d.train_env_names[int(d.train.client_env(k)[0])]
        assert env == f"domain={d.info['client_domain'][k]}"
    assert "domain=photo" not in d.train_env_names
    # 60 clients: every one of the 6 split 10 ways
    d60 = fs.scenario("pacs", dataset="pacs_small", clients=60, data_dir=shared_datasets)
    assert (
        d60.num_clients == 60
        and int(d60.train.sizes().sum() + d60.val["val"].sizes().sum()) == 1050
    )
    _same(d, fs.scenario("pacs", dataset="pacs_small", held_out="photo", data_dir=shared_datasets))
    with pytest.raises(FedshiftError, match="held_out"):
        fs.scenario("pacs", dataset="pacs_small", held_out="moon", data_dir=shared_datasets)


def test_pacs_one_domain_per_client_as_fedipg(shared_datasets):
    # FedIPG's PACS-5: each client one domain, all classes; 5 clients over 3 domains: 2, 2, 1
    every = ["dog,elephant,giraffe,guitar,horse,house,person"]
    d = fs.scenario(
        "pacs", dataset="pacs_small", clients=5, groups=every, held_out="photo",
        data_dir=shared_datasets,
    )  # fmt: skip
    assert d.info["client_domain"] == ["art_painting"] * 2 + ["cartoon"] * 2 + ["sketch"]
    whole = d.train.sizes() + d.val["val"].sizes()
    assert whole.tolist() == [175, 175, 175, 175, 350]  # 350 images a domain, dealt
    for k in range(5):
        assert len(set(d.train.client(k)[1].tolist())) == 7  # every class
        assert len(d.test["domain=photo"].client(k)[1]) == 350  # all of the held-out domain
    with pytest.raises(FedshiftError, match="at least 3"):
        fs.scenario("pacs", dataset="pacs_small", clients=2, groups=every,
                    data_dir=shared_datasets)  # fmt: skip


def _image(path: Path, colour) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 10), colour).save(path)


def test_vlcs_fixture_and_missing_error(tmp_path):
    with pytest.raises(FedshiftError) as err:
        fs.scenario("vlcs", data_dir=tmp_path)
    msg = str(err.value)
    assert "Caltech101/bird/" in msg and "<domain>/<class>/<image>" in msg and _one_sentence(msg)
    domains = ("Caltech101", "LabelMe", "SUN09", "VOC2007")
    for di, dom in enumerate(domains):
        for ci, cls in enumerate(("bird", "car", "chair", "dog", "person")):
            for j in range(3):
                _image(tmp_path / "VLCS" / dom / cls / f"{j}.png", (40 * ci, 60 * di, 10 * j))
    imgs = load_domains("vlcs", 8, tmp_path)
    assert imgs["SUN09"][0].shape == (15, 3, 8, 8)
    assert imgs["SUN09"][0][3, 0, 0, 0].item() == 40 and imgs["SUN09"][1][3].item() == 1
    d = fs.scenario("vlcs", data_dir=tmp_path, held_out="VOC2007", image_size=8, val_fraction=0)
    assert d.num_clients == 6 and list(d.test) == ["domain=VOC2007"]
    assert d.train.sizes().tolist() == [6, 6, 6, 9, 9, 9]
    x, y = d.test["domain=VOC2007"].client(4)
    assert sorted(set(y.tolist())) == [2, 3, 4] and torch.allclose(
        x[:, 1, 0, 0], torch.tensor(180 / 255)
    )
    _same(
        d, fs.scenario("vlcs", data_dir=tmp_path, held_out="VOC2007", image_size=8, val_fraction=0)
    )


# ---------------------------------------------------------------- WaterBirds


def _waterbirds(folder: Path, water_species=8, land_species=10, per=12) -> None:
    rows = ["img_id,img_filename,y,split,place,place_filename"]
    i = 0
    for s in range(water_species + land_species):
        y = int(s < water_species)
        name = f"{s + 1:03d}.Species_{s}"
        for j in range(per):
            place = int(j % 3 != 0) if y else int(j % 3 == 0)  # 2/3 agree
            fn = f"{name}/img_{j}.jpg"
            _image(folder / fn, (200 * place, 100 * y, 0))
            i += 1
            rows.append(f"{i},{fn},{y},{j % 3},{place},/x/y.jpg")
    (folder / "metadata.csv").write_text("\n".join(rows) + "\n")


def test_waterbirds_thesis_variant_on_fixture(tmp_path):
    with pytest.raises(FedshiftError) as err:
        waterbirds_metadata(tmp_path)
    assert "metadata.csv" in str(err.value) and _one_sentence(str(err.value))
    _waterbirds(tmp_path / "waterbirds" / "waterbird_complete95_forest2water2")
    opts = dict(
        clients=4,
        partitions=4,
        waterbird_species=[2, 3],
        landbird_species=[2, 4],
        image_size=8,
        test_fraction=0.5,
        data_dir=tmp_path,
    )
    d = fs.scenario("waterbirds", **opts)
    assert d.num_clients == 4 and d.num_classes == 2 and len(d.test) == 11
    assert sorted(set(d.info["client_train_env"])) == ["p=0.85", "p=0.95"]
    for name, split in d.test.items():
        p = float(name.split("=")[1])
        x, y = split.x, split.y
        place = (x[:, 0, 0, 0] > 0.5).long()  # red channel encodes the background
        assert torch.equal((x[:, 1, 0, 0] > 0.2).long(), y)  # green encodes the bird type
        agree = (place == y).float().mean().item()
        assert abs(agree - p) <= 0.15, (name, agree)
    # oracle: background independent of the label in training
    o = fs.scenario("waterbirds", oracle=True, **opts)
    place = (o.train.x[:, 0, 0, 0] > 0.5).long()
    for label in (0, 1):
        assert abs((place[o.train.y == label] == label).float().mean().item() - 0.5) < 0.1
    _same(d, fs.scenario("waterbirds", **opts))


def test_waterbirds_perinvfl_variant(tmp_path):
    _waterbirds(tmp_path / "waterbirds" / "waterbird_complete95_forest2water2", per=30)
    d = fs.scenario(
        "waterbirds", variant="perinvfl", per_client=[40, 10], image_size=8, data_dir=tmp_path
    )
    assert d.num_clients == 4 and list(d.test) == [f"p={p}" for p in (0.1, 0.2, 0.3, 0.4, 0.5)]
    assert d.info["client_train_env"] == ["p=0.95", "p=0.9", "p=0.85", "p=0.8"]
    assert d.train.sizes().max() <= 40 and d.test["p=0.1"].sizes().max() <= 10


def test_waterbirds_partitions_dealt_over_clients(tmp_path):
    _waterbirds(tmp_path / "waterbirds" / "waterbird_complete95_forest2water2")
    opts = dict(
        partitions=2,
        waterbird_species=[2, 3],
        landbird_species=[2, 4],
        image_size=8,
        test_fraction=0.5,
        data_dir=tmp_path,
    )
    base = fs.scenario("waterbirds", **opts)
    split = fs.scenario("waterbirds", clients=6, **opts)
    assert base.num_clients == 2 and split.num_clients == 6
    # the 3 clients of a partition hold exactly that partition's data
    sizes = split.train.sizes().view(2, 3).sum(1)
    assert sizes.tolist() == base.train.sizes().tolist()
    assert split.info["client_train_env"][:3] == [base.info["client_train_env"][0]] * 3
