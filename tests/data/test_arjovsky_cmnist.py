"""The IRM anchor's dataset: Arjovsky et al.'s Coloured MNIST (`cmnist` with
``construction = "arjovsky"``): sizes, environments, colour and label rates, grayscale."""

from __future__ import annotations

import pytest
import torch

from fedshift.data.registry import build_scenario
from fedshift.errors import FedshiftError


@pytest.fixture(scope="module")
def arjovsky(shared_datasets):
    opts = {"construction": "arjovsky", "clients": 2, "p_train": [0.8, 0.9], "p_test": [0.1]}
    return build_scenario("cmnist", opts, seed=3, data_dir=shared_datasets)


def channel(x):
    """The channel holding the digit (1 if channel 1 has any ink)."""
    return (x[:, 1].flatten(1).sum(1) > 0).long()


def test_arjovsky_sizes_and_environments(arjovsky):
    d = arjovsky
    assert d.train.sizes().tolist() == [25_000, 25_000]
    assert d.test["p=0.1"].sizes().tolist() == [5_000, 5_000]
    assert d.val == {} and d.participation == 1.0 and d.input_shape == (2, 14, 14)
    assert d.train.env.tolist()[:1] == [0] and set(d.train.env[25_000:].tolist()) == {1}
    # one channel holds the digit, the other is zero
    x = d.train.x
    assert ((x[:, 0].flatten(1).sum(1) > 0) ^ (x[:, 1].flatten(1).sum(1) > 0)).all()
    assert x.max() == 1.0 and x.min() == 0.0


def test_arjovsky_colour_and_label_rates(arjovsky, shared_datasets):
    d = arjovsky
    ch, y = channel(d.train.x), d.train.y
    for env, p in ((0, 0.8), (1, 0.9)):  # P(colour = label) = p, ±4 binomial std
        agree = (ch[d.train.env == env] == y[d.train.env == env]).float().mean().item()
        assert abs(agree - p) < 0.012
        assert abs(y[d.train.env == env].float().mean().item() - 0.5) < 0.02
    t = d.test["p=0.1"]
    assert abs((channel(t.x) == t.y).float().mean().item() - 0.1) < 0.015
    # label = [digit < 5] flipped w.p. 0.25: recover each image's digit from the raw data
    from fedshift.data.idx import load_idx_dataset

    raw, digits = load_idx_dataset("mnist", "train", shared_datasets, False)
    grey = raw[:, ::2, ::2].float().div(255).flatten(1)
    test_grey = t.x.sum(1).flatten(1)
    key = {tuple(g[::7].tolist()): i for i, g in enumerate(grey[50_000:])}
    found = [key.get(tuple(g[::7].tolist())) for g in test_grey[:500]]
    assert all(f is not None for f in found)  # test images are training images 50000:
    low = (digits[50_000:][torch.tensor(found)] < 5).long()
    assert abs((low == t.y[:500]).float().mean().item() - 0.75) < 0.07
    # training images are images 0 … 49,999 (each once): compare sorted ink totals
    ink = torch.sort(d.train.x.sum((1, 2, 3)))[0]
    torch.testing.assert_close(ink, torch.sort(grey[:50_000].sum(1))[0])


def test_arjovsky_grayscale_sums_channels(arjovsky, shared_datasets):
    opts = {"construction": "arjovsky", "clients": 2, "p_train": [0.8, 0.9], "p_test": [0.1]}
    g = build_scenario("cmnist", {**opts, "grayscale": True}, seed=3, data_dir=shared_datasets)
    assert g.input_shape == (1, 14, 14)
    torch.testing.assert_close(g.train.x[:, 0], arjovsky.train.x.sum(1))


def test_arjovsky_needs_a_client_multiple_of_environments():
    with pytest.raises(FedshiftError):
        build_scenario("cmnist", {"construction": "arjovsky", "clients": 3})
