"""Registered scenarios: structure, SPEC defaults, determinism, and the planted shortcut of
``digits-shortcut`` checked empirically on the built tensors."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from fedshift.data import SCENARIOS, FederatedData, Split, build_scenario
from fedshift.data.scenarios.basic import load_images
from fedshift.data.scenarios.digits_shortcut import COLOURS
from fedshift.errors import FedshiftError

CASES = [
    ("iid", {"dataset": "mnist"}),
    ("dirichlet", {"dataset": "fmnist"}),
    ("pathological", {"dataset": "mnist"}),
    ("iid", {"dataset": "digits", "clients": 5}),
    ("dirichlet", {"dataset": "digits", "clients": 10, "alpha": 0.1, "proportions": "per-class"}),
    ("pathological", {"dataset": "digits", "clients": 6, "samples_per_client": [60, 200]}),
    ("digits-shortcut", {}),
    ("digits-shortcut", {"oracle": True, "clients": 5}),
]


def _build(request, name, opts, seed=0) -> FederatedData:
    needs_files = name != "digits-shortcut" and opts.get("dataset", "mnist") != "digits"
    data_dir = request.getfixturevalue("shared_datasets") if needs_files else None
    return build_scenario(name, opts, seed, data_dir)


def _splits(d: FederatedData) -> dict[str, Split]:
    out = {"train": d.train}
    out.update({f"test/{k}": v for k, v in d.test.items()})
    out.update({f"val/{k}": v for k, v in d.val.items()})
    return out


def _same(a: FederatedData, b: FederatedData) -> bool:
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


def test_registered_names():
    assert {"iid", "dirichlet", "pathological", "digits-shortcut"} <= set(SCENARIOS.names())


@pytest.mark.parametrize("name, opts", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_build_is_deterministic_and_well_formed(request, name, opts):
    a = _build(request, name, opts, seed=0)
    b = _build(request, name, opts, seed=0)
    assert _same(a, b)
    c = _build(request, name, opts, seed=1)
    assert not _same(a, c)
    for split in _splits(a).values():
        assert tuple(split.x.shape[1:]) == a.input_shape
        assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
        assert 0.0 <= float(split.x.min()) and float(split.x.max()) <= 1.0
        assert split.num_clients == a.num_clients
    assert a.train.sizes().min() > 0
    assert a.default_model == "mlp" and a.num_classes == 10


def test_iid_defaults(shared_datasets):
    d = build_scenario("iid", {}, 0, shared_datasets)
    assert d.num_clients == 20 and d.input_shape == (1, 28, 28)
    assert list(d.test) == ["test"] and list(d.val) == ["val"] and d.train.env is None
    assert int(d.train.sizes().sum() + d.val["val"].sizes().sum()) == 60_000
    assert int(d.test["test"].sizes().sum()) == 10_000
    val_share = d.val["val"].sizes().float() / (d.val["val"].sizes() + d.train.sizes()).float()
    assert torch.allclose(val_share, torch.full_like(val_share, 0.1), atol=0.001)


def test_dirichlet_defaults_and_test_label_mix(shared_datasets):
    d = build_scenario("dirichlet", {}, 0, shared_datasets)
    assert d.num_clients == 20
    assert int(d.train.sizes().sum() + d.val["val"].sizes().sum()) == 10_000  # UCFL: 10k
    for i in range(d.num_clients):
        _, ytr = d.train.client(i)
        _, yva = d.val["val"].client(i)
        _, yte = d.test["test"].client(i)
        own = torch.bincount(torch.cat([ytr, yva]), minlength=10).double()
        mix = torch.bincount(yte, minlength=10).double()
        assert (own / own.sum() - mix / mix.sum()).abs().max() < 0.02


def test_dirichlet_alpha_controls_skew(shared_datasets):
    def top_share(alpha):
        d = build_scenario("dirichlet", {"alpha": alpha}, 0, shared_datasets)
        shares = [
            torch.bincount(d.train.client(i)[1], minlength=10).max().item() / d.train.sizes()[i]
            for i in range(d.num_clients)
        ]
        return float(np.mean(shares))

    assert top_share(0.05) > 0.5 > 0.2 > top_share(1000.0)


def test_pathological_defaults(shared_datasets):
    d = build_scenario("pathological", {"dataset": "fmnist"}, 0, shared_datasets)
    assert d.num_clients == 40
    tr, va, te = d.train.sizes(), d.val["val"].sizes(), d.test["test"].sizes()
    totals = tr + va + te
    assert int(totals.min()) >= 400 and int(totals.max()) <= 5000
    assert ((te.double() / totals.double() - 0.25).abs() < 0.01).all()
    for i in range(40):
        classes = set(torch.cat([d.train.client(i)[1], d.val["val"].client(i)[1]]).tolist())
        assert len(classes) == 3
        assert set(d.test["test"].client(i)[1].tolist()) <= classes


def test_pathological_standardize_is_pfedmes_per_pixel_scaling(shared_datasets):
    opts = {"dataset": "mnist", "clients": 5}
    raw = build_scenario("pathological", opts, 0, shared_datasets)
    std = build_scenario("pathological", {**opts, "standardize": True}, 0, shared_datasets)
    assert float(raw.train.x.min()) >= 0.0 and float(raw.train.x.max()) <= 1.0
    # the same images and partition, only rescaled per pixel by the statistics of the
    # images the scenario draws from (all 60,000 training images here)
    assert torch.equal(raw.train.y, std.train.y) and torch.equal(
        raw.train.offsets, std.train.offsets
    )
    pooled, _ = load_images("mnist", True, shared_datasets, False)
    mu, sigma = pooled.float().mean(0), pooled.float().std(0, unbiased=False)
    pixels = (raw.train.x * 255).round()  # pFedMe scales the raw 0–255 pixel values
    torch.testing.assert_close(std.train.x, (pixels - mu) / (sigma + 0.001), atol=1e-3, rtol=1e-4)
    assert float(std.train.x.abs().max()) > 10  # rare pixels: pFedMe's scaling, not [0, 1]


def test_scenario_option_errors():
    with pytest.raises(FedshiftError, match="scenario.dataset"):
        build_scenario("iid", {"dataset": "cifar"})
    with pytest.raises(FedshiftError, match="scenario.alpha"):
        build_scenario("dirichlet", {"alpha": 0})
    with pytest.raises(FedshiftError, match="scenario.p_test"):
        build_scenario("digits-shortcut", {"p_test": [0.1, 1.5]})
    with pytest.raises(FedshiftError, match="scenario.classes_per_client"):
        build_scenario("pathological", {"classes_per_client": 11})


def test_missing_data_names_files(tmp_path):
    with pytest.raises(FedshiftError, match="train-images-idx3-ubyte.gz"):
        build_scenario("iid", {}, 0, tmp_path)


# ---------------------------------------------------------------- digits-shortcut


def _border_class(x: torch.Tensor) -> torch.Tensor:
    """The class whose colour the border (top-left pixel) has."""
    pix = x[:, :, 0, 0]  # [n, 3]
    return torch.cdist(pix, COLOURS).argmin(1)


def _agreement(s: Split) -> float:
    return float((_border_class(s.x) == s.y).double().mean())


def test_colours_are_distinct():
    d = torch.cdist(COLOURS, COLOURS) + torch.eye(10) * 10
    assert float(d.min()) >= 0.4


def test_digits_shortcut_structure():
    t = time.perf_counter()
    d = build_scenario("digits-shortcut")
    assert time.perf_counter() - t < 1.0
    assert d.num_clients == 8 and d.input_shape == (3, 12, 12)
    assert d.train_env_names == ["p=0.95", "p=0.85"]
    assert list(d.test) == [f"p={i / 10}" for i in range(11)]
    assert list(d.val) == ["p=0.1"]
    total = d.train.sizes() + d.val["p=0.1"].sizes() + d.test["p=0.0"].sizes()
    assert int(total.sum()) == 1797
    assert ((d.test["p=0.0"].sizes().double() / total.double() - 0.3).abs() < 0.01).all()
    # one training environment per client, four clients each
    envs = [set(d.train.client_env(i).tolist()) for i in range(8)]
    assert all(len(e) == 1 for e in envs)
    assert sorted(e.pop() for e in envs) == [0, 0, 0, 0, 1, 1, 1, 1]
    # the digit is grey: identical in the three channels; the border is a class colour
    inner = d.train.x[:, :, 2:10, 2:10]
    assert torch.equal(inner[:, 0], inner[:, 1]) and torch.equal(inner[:, 0], inner[:, 2])
    ring = d.train.x.clone()
    ring[:, :, 2:10, 2:10] = d.train.x[:, :, :1, :1]
    assert torch.equal(ring, d.train.x[:, :, :1, :1].expand_as(ring))  # one colour all round


def test_digits_shortcut_colour_agrees_with_label_at_p():
    d = build_scenario("digits-shortcut")
    env = d.train.env
    for e, p in enumerate([0.95, 0.85]):
        sel = env == e
        agree = float((_border_class(d.train.x[sel]) == d.train.y[sel]).double().mean())
        assert abs(agree - p) < 0.05, (p, agree)
    for name, split in d.test.items():
        p = float(name.removeprefix("p="))
        assert abs(_agreement(split) - p) < 0.06, (name, _agreement(split))
    assert abs(_agreement(d.val["p=0.1"]) - 0.1) < 0.08
    # when the colour disagrees it is never the label's colour, and spreads over the others
    wrong = _border_class(d.test["p=0.0"].x)
    assert not bool((wrong == d.test["p=0.0"].y).any())
    assert len(set(wrong.tolist())) == 10


def test_digits_shortcut_test_envs_share_images():
    d = build_scenario("digits-shortcut")
    ref = d.test["p=0.0"]
    for split in d.test.values():
        assert torch.equal(split.y, ref.y) and torch.equal(split.offsets, ref.offsets)
        assert torch.equal(split.x[:, :, 2:10, 2:10], ref.x[:, :, 2:10, 2:10])
    assert not torch.equal(d.test["p=1.0"].x, ref.x)  # only the border differs


def test_digits_shortcut_oracle_makes_colour_uninformative():
    d = build_scenario("digits-shortcut", {"oracle": True})
    base = build_scenario("digits-shortcut")
    agree = _agreement(d.train)
    assert abs(agree - 0.1) < 0.04
    # colour frequencies do not depend on the label (chi-square style bound)
    table = torch.zeros(10, 10)
    table.index_put_((d.train.y, _border_class(d.train.x)), torch.ones(len(d.train.y)), True)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    chi2 = float(((table - expected) ** 2 / expected).sum())
    assert chi2 < 150  # 81 degrees of freedom; a p=0.9 shortcut gives thousands
    # same images and test environments as the shortcut version
    assert torch.equal(d.train.y, base.train.y) and _same_envs(d, base)


def _same_envs(a: FederatedData, b: FederatedData) -> bool:
    return all(torch.equal(a.test[k].x, b.test[k].x) for k in a.test) and list(a.val) == list(b.val)


def test_digits_shortcut_env_seeded_by_value():
    a = build_scenario("digits-shortcut", {"p_test": [0.3, 0.7]})
    b = build_scenario("digits-shortcut", {"p_test": [0.7, 0.2, 0.3]})
    assert torch.equal(a.test["p=0.3"].x, b.test["p=0.3"].x)
    assert torch.equal(a.test["p=0.7"].x, b.test["p=0.7"].x)


def test_digits_shortcut_label_noise_is_shared_by_every_environment():
    clean = build_scenario("digits-shortcut")
    d = build_scenario("digits-shortcut", {"label_noise": 0.2})
    flipped = float((d.train.y != clean.train.y).double().mean())
    assert abs(flipped - 0.2) < 0.05, flipped
    assert torch.equal(d.train.x[:, :, 2:10, 2:10], clean.train.x[:, :, 2:10, 2:10])
    for split in d.test.values():  # every test environment scores the same (noisy) labels
        assert torch.equal(split.y, d.test["p=0.0"].y)
    # the border follows the noisy label: p = 1 agrees with it everywhere
    assert _agreement(d.test["p=1.0"]) == 1.0
    assert abs(_agreement(d.train) - 0.9) < 0.05
    with pytest.raises(FedshiftError):
        build_scenario("digits-shortcut", {"label_noise": 0.95})
