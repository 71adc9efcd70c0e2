"""The MNIST-derived and synthetic shift scenarios (SPEC §2.1–2.3): structure, the papers'
statistics checked on the built tensors, determinism, and the SCM's analytic oracle."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift.data import FederatedData, Split, build_scenario
from fedshift.data.idx import load_idx_dataset
from fedshift.errors import FedshiftError

SMALL = {"samples": 6000, "test_samples": 2000}


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """``shared/datasets`` beside the repository, else ``$FEDSHIFT_DATA`` (skip if neither)."""
    candidates = [Path(__file__).resolve().parents[1].parent / "shared" / "datasets"]
    if os.environ.get("FEDSHIFT_DATA"):
        candidates.append(Path(os.environ["FEDSHIFT_DATA"]))
    for c in candidates:
        if (c / "mnist").is_dir():
            return c
    pytest.skip("MNIST files not found (shared/datasets or $FEDSHIFT_DATA)")


def _splits(d: FederatedData) -> dict[str, Split]:
    out = {"train": d.train}
    out.update({f"test/{k}": v for k, v in d.test.items()})
    out.update({f"val/{k}": v for k, v in d.val.items()})
    return out


def same(a: FederatedData, b: FederatedData) -> bool:
    sa, sb = _splits(a), _splits(b)
    if sa.keys() != sb.keys() or a.train_env_names != b.train_env_names:
        return False
    for k in sa:
        x, y = sa[k], sb[k]
        if not (
            torch.equal(x.x, y.x) and torch.equal(x.y, y.y) and torch.equal(x.offsets, y.offsets)
        ):
            return False
        if (x.env is None) != (y.env is None) or (
            x.env is not None and not torch.equal(x.env, y.env)
        ):
            return False
    return True


def well_formed(d: FederatedData) -> None:
    for split in _splits(d).values():
        assert tuple(split.x.shape[1:]) == d.input_shape
        assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
        assert 0.0 <= float(split.x.min()) and float(split.x.max()) <= 1.0
        assert split.num_clients == d.num_clients
        assert int(split.y.max()) < d.num_clients * 0 + d.num_classes
    assert d.train.sizes().min() > 0


# ---------------------------------------------------------------- cmnist / cfmnist


def colour_agreement(s: Split) -> float:
    """Share of images whose colour is their label's (label 0 → green, 1 → red)."""
    channel = s.x.sum((2, 3)).argmax(1)
    own = torch.where(s.y == 0, 1, 0)
    return float((channel == own).double().mean())


@pytest.fixture(scope="module")
def cmnist(shared_datasets) -> FederatedData:
    return build_scenario("cmnist", {}, 0, shared_datasets)


def test_cmnist_structure(cmnist):
    d = cmnist
    well_formed(d)
    assert d.name == "cmnist" and d.num_clients == 8 and d.participation == 1.0
    assert d.input_shape == (2, 14, 14) and d.num_classes == 2 and d.default_model == "mlp"
    assert list(d.test) == [f"p={i / 10}" for i in range(11)]
    assert list(d.val) == ["p=0.1"] and d.train_env_names == ["p=0.9", "p=0.8"]
    # all 60,000 training / 10,000 test images used exactly once
    assert int(d.train.sizes().sum() + d.val["p=0.1"].sizes().sum()) == 60_000
    assert int(d.test["p=0.0"].sizes().sum()) == 10_000
    # one training environment per client, both environments present (balanced: 4 + 4)
    envs = [set(d.train.client_env(i).tolist()) for i in range(8)]
    assert all(len(e) == 1 for e in envs)
    assert sorted(next(iter(e)) for e in envs) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert d.info["client_train_env"] == [d.train_env_names[next(iter(e))] for e in envs]
    # one colour channel per image, the other all zero
    nonzero = (d.train.x.flatten(2).abs().sum(2) > 0).sum(1)
    assert bool((nonzero == 1).all())


def test_cmnist_colour_agreement_matches_p(cmnist):
    d = cmnist
    for e, p in enumerate([0.9, 0.8]):
        sel = d.train.env == e
        s = Split(d.train.x[sel], d.train.y[sel], torch.tensor([0, int(sel.sum())]))
        n = int(sel.sum())
        assert abs(colour_agreement(s) - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-3, (p, n)
    for name, split in d.test.items():
        p = float(name.removeprefix("p="))
        n = len(split.y)
        assert abs(colour_agreement(split) - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-3, name
    assert abs(colour_agreement(d.val["p=0.1"]) - 0.1) < 0.02
    # test environments share images (grey content) and labels; only the colour differs
    ref = d.test["p=0.0"]
    for split in d.test.values():
        assert torch.equal(split.y, ref.y) and torch.equal(split.x.sum(1), ref.x.sum(1))


def _class_lookup(shared_datasets, dataset: str, train: bool) -> dict[bytes, int]:
    x, y = load_idx_dataset(dataset, "train" if train else "test", shared_datasets)
    small = (x[:, ::2, ::2].float() / 255.0).numpy()
    return {small[i].tobytes(): int(y[i]) for i in range(len(y))}


def test_cmnist_label_noise_and_client_classes(cmnist, shared_datasets):
    d = cmnist
    lookup = _class_lookup(shared_datasets, "mnist", True)
    tlookup = _class_lookup(shared_datasets, "mnist", False)
    flips, total = 0, 0
    for i in range(d.num_clients):
        listed = d.info["client_classes"][i]
        assert len(set(listed)) == 4
        assert sum(c < 5 for c in listed) == 2 and sum(c >= 5 for c in listed) == 2
        for split, table in ((d.train, lookup), (d.test["p=0.5"], tlookup)):
            x, y = split.client(i)
            grey = x.sum(1).numpy()
            cls = np.array([table[g.tobytes()] for g in grey])
            assert set(cls.tolist()) == set(listed)
            flips += int(((cls >= 5).astype(int) != y.numpy()).sum())
            total += len(y)
    rate = flips / total
    assert abs(rate - 0.25) < 4 * np.sqrt(0.25 * 0.75 / total), rate


def test_cmnist_oracle_removes_the_shortcut(shared_datasets):
    base = build_scenario("cmnist", SMALL, 0, shared_datasets)
    d = build_scenario("cmnist", {**SMALL, "oracle": True}, 0, shared_datasets)
    n = len(d.train.y)
    assert abs(colour_agreement(d.train) - 0.5) < 4 * np.sqrt(0.25 / n)
    assert colour_agreement(base.train) > 0.8
    assert torch.equal(d.train.y, base.train.y) and torch.equal(d.train.env, base.train.env)
    assert all(torch.equal(d.test[k].x, base.test[k].x) for k in d.test)
    assert torch.equal(d.val["p=0.1"].x, base.val["p=0.1"].x)


def test_cmnist_80_clients_split_the_8_partitions(shared_datasets):
    d = build_scenario("cmnist", {**SMALL, "clients": 80}, 0, shared_datasets)
    eight = build_scenario("cmnist", SMALL, 0, shared_datasets)
    assert d.num_clients == 80 and d.participation == 0.1
    assert d.info["client_partition"] == [i // 10 for i in range(80)]
    for k in range(8):
        block = range(10 * k, 10 * k + 10)
        assert {d.info["client_train_env"][i] for i in block} == {eight.info["client_train_env"][k]}
        assert all(d.info["client_classes"][i] == eight.info["client_classes"][k] for i in block)
        sizes = d.train.sizes()[10 * k : 10 * k + 10]
        assert int(sizes.max() - sizes.min()) <= 1
        assert int(sizes.sum()) == int(eight.train.sizes()[k])
    with pytest.raises(FedshiftError, match="multiple"):
        build_scenario("cmnist", {"clients": 12}, 0, shared_datasets)


@pytest.mark.parametrize("name", ["cmnist", "cfmnist"])
def test_coloured_deterministic(shared_datasets, name):
    a = build_scenario(name, SMALL, 0, shared_datasets)
    b = build_scenario(name, SMALL, 0, shared_datasets)
    c = build_scenario(name, SMALL, 1, shared_datasets)
    well_formed(a)
    assert same(a, b) and not same(a, c)
