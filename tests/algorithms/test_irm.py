"""IRM† (src/fedshift/algorithms/irm.py): the λ = 0 reduction and the rescaling (only under a
scale-free server step, issue 18). The anchor's data and model are tested in
tests/data/test_arjovsky_cmnist.py and tests/models/test_models.py."""

from __future__ import annotations

import torch
from helpers import ADAM, two_equal_clients
from helpers import ood_run as run

import fedshift as fs


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
