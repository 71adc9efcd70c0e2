"""IRM† (src/fedshift/algorithms/irm.py): the λ = 0 reduction and the rescaling (only under a
scale-free server step, issue 18); and, last, the IRM external anchor's data and model:
Arjovsky et al.'s Coloured MNIST and the one-logit binary head (tests of fedshift.data and
fedshift.models, kept here with the anchor they were written for)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import ADAM, two_equal_clients
from helpers import ood_run as run

import fedshift as fs
from fedshift.data.registry import build_scenario
from fedshift.errors import FedshiftError
from fedshift.models.registry import build_model


def test_irm_lambda_zero_after_annealing_is_fedavg():
    a = run("irm", algorithm_options={"lambda_": 0.0, "anneal_rounds": 0})
    b = run("fedavg")
    for k, v in b.result.server.items():
        torch.testing.assert_close(a.result.server[k], v)


def irm_run(rounds, **options):
    base = {"lambda_": 1000.0, "anneal_rounds": 2}
    return fs.run(
        algorithm="irm",
        data=two_equal_clients(),
        rounds=rounds,
        lr=0.05,
        batch_size=0,
        local_steps=1,
        model_options={"hidden": [8]},
        algorithm_options={**base, **options},
    )


def change(a, b):
    a, b = a["p"], b["p"]
    return sum(((a[k] - b[k]) ** 2).sum() for k in a).sqrt().item()


def test_irm_under_sgd_keeps_moving_after_annealing():
    before = irm_run(2).result.server  # two rounds at penalty weight 1
    auto, always = irm_run(4), irm_run(4, rescale="always")
    moved = change(auto.result.server, before)
    shrunk = change(always.result.server, before)
    # the reference's division shrinks the post-annealing step ~λ-fold under SGD
    assert shrunk < moved / 100
    assert moved > 1e-3
    # the logged loss is the risk R_i, not the objective divided by λ
    assert min(r.loss for r in auto.result.rounds) > 0.3
    assert min(r.loss for r in always.result.rounds) > 0.3


def test_irm_rescales_under_server_adam():
    """With a scale-free server step the objective is divided by λ_t (the reference's line):
    the same run as rescale = always, and a different one from rescale = never."""
    opts = {**ADAM, "server_lr": 0.01}
    auto, always = irm_run(4, **opts), irm_run(4, rescale="always", **opts)
    never = irm_run(4, rescale="never", **opts)
    for k, v in always.result.server.items():
        torch.testing.assert_close(auto.result.server[k], v)
    assert change(auto.result.server, never.result.server) > 1e-4


# --- the IRM anchor's dataset (fedshift.data: Arjovsky et al.'s Coloured MNIST) and model ---


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


def test_binary_head_is_one_logit_bce():
    model = build_model("mlp", (4,), 2, {"hidden": [3], "binary_head": True, "init": "xavier"})
    x, y = torch.randn(7, 4), torch.randint(0, 2, (7,))
    logits = model(x)
    assert (logits[:, 0] == 0).all()
    z = logits[:, 1]
    torch.testing.assert_close(
        F.cross_entropy(logits, y), F.binary_cross_entropy_with_logits(z, y.float())
    )
    assert all((m.bias == 0).all() for m in model.modules() if isinstance(m, torch.nn.Linear))
