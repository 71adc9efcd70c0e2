"""Client partitions as files: a scenario's index lists exported (JSON, NPZ) and read back by
the from-partition scenario give the same clients, tensors and first-round metrics; splits
made elsewhere (train lists only, FL-bench's train+test pool) run; bad files are one
sentence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.data import load_mnist
from fedshift.data.partition_file import read_partition

DIRICHLET = {"dataset": "mnist", "clients": 4, "samples": 1200, "alpha": 0.3}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def export(tmp_path, data_dir, name: str, scenario: str = "dirichlet", **options):
    sets = [f"--set=scenario.{k}={v}" for k, v in options.items()]
    out = tmp_path / name
    res = invoke("data", "export-partition", str(out), f"--set=scenario={scenario}", *sets,
                 "--seed", "3", "--data-dir", str(data_dir), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["clients"] == options["clients"] and summary["path"] == str(out)
    return out


def same_clients(a, b) -> None:
    assert a.partition.splits.keys() == b.partition.splits.keys()
    for s in a.partition.splits:
        pa, pb = a.partition.splits[s], b.partition.splits[s]
        assert pa.num_clients == pb.num_clients
        for i in range(pa.num_clients):
            assert np.array_equal(pa.client(i), pb.client(i)), (s, i)


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_export_then_import_gives_the_same_clients_and_metrics(tmp_path, shared_datasets, suffix):
    path = export(tmp_path, shared_datasets, f"part{suffix}", **DIRICHLET)
    original = fs.scenario("dirichlet", seed=3, data_dir=shared_datasets, **DIRICHLET)
    loaded = fs.scenario("from-partition", data_dir=shared_datasets, file=str(path))
    same_clients(original, loaded)
    assert loaded.fingerprint() == original.fingerprint()  # sizes, labels, pixels
    settings = dict(algorithm="fedavg", rounds=1, seed=3, batch_size=20)
    first = fs.run(data=original, **settings).metrics
    again = fs.run(data=loaded, **settings).metrics
    assert again == first
    part = read_partition(path)
    assert part.source == {"scenario": "dirichlet", "options": DIRICHLET, "seed": 3}


def test_a_json_file_is_plain_lists_another_framework_can_read(tmp_path, shared_datasets):
    path = export(tmp_path, shared_datasets, "part.json", **DIRICHLET)
    doc = json.loads(path.read_text())
    assert doc["format"] == "fedshift-partition" and doc["dataset"] == "mnist"
    assert doc["pool"] == "separate" and len(doc["clients"]) == 4
    client = doc["clients"][0]
    assert set(client) == {"train", "val", "test"}
    assert all(isinstance(i, int) for i in client["train"])
    npz = np.load(export(tmp_path, shared_datasets, "part.npz", **DIRICHLET))
    off = npz["train_offsets"]
    assert npz["train"][off[0] : off[1]].tolist() == client["train"]


def test_pathological_exports_with_the_train_plus_test_pool(tmp_path, shared_datasets):
    options = dict(dataset="mnist", clients=3, samples=3000, samples_per_client=[100, 300])
    path = export(tmp_path, shared_datasets, "patho.npz", "pathological", **options)
    assert read_partition(path).pool == "train+test"
    original = fs.scenario("pathological", seed=3, data_dir=shared_datasets, **options)
    loaded = fs.scenario("from-partition", data_dir=shared_datasets, file=str(path))
    same_clients(original, loaded)
    assert loaded.fingerprint() == original.fingerprint()
    bad = invoke("data", "export-partition", str(tmp_path / "s.json"),
                 "--set=scenario=pathological", "--set=scenario.standardize=true",
                 *[f"--set=scenario.{k}={v}" for k, v in options.items()],
                 "--data-dir", str(shared_datasets))  # fmt: skip
    assert bad.exit_code == 2 and "records no index lists" in bad.output


def test_train_lists_only_get_a_test_set_and_a_validation_split(tmp_path, shared_datasets):
    """What Flower Datasets gives: which training images each client holds."""
    rng = np.random.default_rng(0)
    lists = np.array_split(rng.permutation(60000)[:900], 3)
    path = tmp_path / "flower.json"
    clients = [{"train": v.tolist()} for v in lists]
    path.write_text(json.dumps({"dataset": "mnist", "clients": clients}))
    data = fs.scenario("from-partition", data_dir=shared_datasets, file=str(path), val_fraction=0.2)
    assert data.train.sizes().tolist() == [240, 240, 240]
    assert data.val["val"].sizes().tolist() == [60, 60, 60]
    assert data.test["test"].sizes().sum() == 10000  # the official test set, shared out
    for i, v in enumerate(lists):  # train + val are exactly the client's images
        got = np.concatenate([data.partition.splits[s].client(i) for s in ("train", "val")])
        assert sorted(got.tolist()) == sorted(v.tolist())


def test_flbench_style_indices_over_train_then_test(tmp_path, shared_datasets):
    """FL-bench (and PFLlib) index MNIST's training set followed by its test set."""
    clients = [{"train": [0, 1, 2, 60005], "test": [60000, 3]}, {"train": [4, 5], "test": [69999]}]
    doc = {"dataset": "mnist", "pool": "train+test", "clients": clients}
    path = tmp_path / "flbench.json"
    path.write_text(json.dumps(doc))
    data = fs.scenario("from-partition", data_dir=shared_datasets, file=str(path), val_fraction=0)
    assert data.train.sizes().tolist() == [4, 2] and data.test["test"].sizes().tolist() == [2, 1]
    test_labels = load_mnist(shared_datasets, train=False)[1].tolist()
    train_labels = load_mnist(shared_datasets, train=True)[1].tolist()
    assert data.test["test"].y.tolist() == [test_labels[0], train_labels[3], test_labels[9999]]
    client0 = sorted(data.train.client(0)[1].tolist())  # (its order is shuffled)
    assert client0 == sorted([*train_labels[:3], test_labels[5]])
    path.write_text(json.dumps({**doc, "pool": "separate"}))
    res = invoke("describe", "scenario", "from-partition", "--set", f"file={path}",
                 "--data-dir", str(shared_datasets))  # fmt: skip
    assert res.exit_code == 2 and '"pool": "train+test"' in res.output
    assert "'train' index 60005 is out of range" in res.output


BAD = {
    "not-json.json": ("{not json", "not valid JSON"),
    "no-clients.json": ({"dataset": "mnist"}, 'expected an object with a "clients" list'),
    "typo.json": ({"clients": [{"train": [1], "validation": [2]}]}, "has key 'validation'"),
    "negative.json": ({"dataset": "mnist", "clients": [{"train": [-1]}]}, "negative index"),
    "floats.json": ({"clients": [{"train": [1.5]}]}, "list of integer indices"),
    "empty.json": ({"clients": [{"train": [1]}, {"train": []}]}, "client 1 has no training"),
    "mixed.json": (
        {"clients": [{"train": [1], "test": [2]}, {"train": [3]}]},
        "every client must give the same ones",
    ),
    "format.json": ({"format": "flower", "clients": [{"train": [1]}]}, "is not 'fedshift-"),
    "version.json": ({"version": 9, "clients": [{"train": [1]}]}, "newer than this fedshift"),
    "dataset.json": ({"dataset": "imagenet", "clients": [{"train": [1]}]}, "from-partition reads"),
    "nodataset.json": ({"clients": [{"train": [1]}]}, "names no dataset"),
    "pool.json": ({"pool": "train+test", "clients": [{"train": [1]}]}, "needs 'test' lists"),
    "missing.json": (None, "does not exist"),
    "part.txt": ("x", "must end in .json or .npz"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_partition_files_are_one_sentence(tmp_path, name):
    content, words = BAD[name]
    path = tmp_path / name
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    res = invoke("describe", "scenario", "from-partition", "--set", f"file={path}")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert words in res.output


def test_bad_npz_files_and_a_reordered_dataset(tmp_path, shared_datasets):
    path = export(tmp_path, shared_datasets, "part.npz", **DIRICHLET)
    arrays = dict(np.load(path))
    broken = tmp_path / "offsets.npz"
    np.savez(broken, **{**arrays, "train_offsets": arrays["train_offsets"][::-1]})
    res = invoke("describe", "scenario", "from-partition", "--set", f"file={broken}")
    assert res.exit_code == 2 and "'train_offsets' must start at 0" in res.output
    # indices shifted by one: another ordering of MNIST, caught by the label check
    shifted = tmp_path / "shifted.npz"
    np.savez(shifted, **{**arrays, "train": (arrays["train"] + 1) % 60000})
    res = invoke("describe", "scenario", "from-partition", "--set", f"file={shifted}",
                 "--data-dir", str(shared_datasets))  # fmt: skip
    assert res.exit_code == 2 and "indexes another ordering of mnist" in res.output
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    res = invoke("describe", "scenario", "from-partition", "--set", f"file={garbage}")
    assert res.exit_code == 2 and "not a readable NPZ file" in res.output
