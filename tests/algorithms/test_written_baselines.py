"""FedRoD's loss and FedPAC's two objectives with their gradients written out for an MLP
(``gradient_by(batched=True)``: the whole cohort at once, no vmap), against autograd per
client, and trained against autograd's training."""

from __future__ import annotations

import pytest
import torch
from helpers import BASELINE_SETTINGS, baseline_experiment
from toy import toy_data

from fedshift.api import make_config
from fedshift.engine import local
from fedshift.engine.contract import flatten
from fedshift.experiment import build_experiment


def _algorithm(name, hidden):
    data = toy_data()
    settings = {**BASELINE_SETTINGS, "model_options": {"hidden": hidden}}
    cfg = make_config(algorithm=name, scenario=data.name, **settings)
    return build_experiment(cfg, data=data).algorithm


def _cohort(alg, c=3, b=9):
    g = torch.Generator().manual_seed(0)
    params = {k: v + 0.3 * torch.randn(c, *v.shape, generator=g)
              for k, v in alg.ctx.initial_params.items()}  # fmt: skip
    x = torch.randn(c, b, *alg.ctx.data.input_shape, generator=g)
    y = torch.randint(0, alg.ctx.data.num_classes, (c, b), generator=g)
    w = torch.ones(c, b)
    w[2, 5:] = 0  # a short batch
    return g, params, x, y, w


def _against_autograd(loss, params, extras, x, y, w):
    assert local.written_gradient(loss) is not None
    grads, value = local.written_gradient(loss)(params, {}, extras, x, y, w)
    dims = (0, None, 0, 0, 0, 0)
    want = torch.func.vmap(torch.func.grad(loss), in_dims=dims)(params, {}, extras, x, y, w)
    torch.testing.assert_close(
        value, torch.func.vmap(loss, in_dims=dims)(params, {}, extras, x, y, w)
    )
    got, want = flatten(grads), flatten(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("hidden", [[8], [8, 6]])
def test_fedrod_written_gradient_is_autograds(hidden):
    alg = _algorithm("fedrod", hidden)
    g, params, x, y, w = _cohort(alg)
    k = alg.ctx.data.num_classes
    params["personal"] = {n: params[n] + 0.3 * torch.randn(params[n].shape, generator=g)
                          for n in ("head.weight", "head.bias")}  # fmt: skip
    counts = torch.randint(0, 5, (3, k), generator=g).float()  # absent classes included
    _against_autograd(alg.loss, params, {"counts": counts}, x, y, w)


@pytest.mark.parametrize("hidden", [[8], [8, 6]])
def test_fedpac_written_gradients_are_autograds(hidden):
    alg = _algorithm("fedpac", hidden)
    g, params, x, y, w = _cohort(alg)
    k, d = alg.ctx.data.num_classes, alg.ctx.model.feature_dim
    targets = torch.randn(3, k, d, generator=g)
    align = torch.tensor([1.0, 0.0, 1.0])  # round 0 aligns nothing
    _against_autograd(alg.aligned, params, {"targets": targets, "align": align}, x, y, w)
    _against_autograd(alg.ce, params, {}, x, y, w)


@pytest.mark.parametrize("algorithm", ["fedrod", "fedpac"])
def test_written_baselines_train_as_autograd(monkeypatch, algorithm):
    written, _ = baseline_experiment(algorithm, rounds=3)
    monkeypatch.setattr(local, "written_gradient", lambda loss: None)
    autograd, _ = baseline_experiment(algorithm, rounds=3)
    a, b = flatten(written.runner.server), flatten(autograd.runner.server)
    for name, v in b.items():
        torch.testing.assert_close(a[name], v, rtol=1e-4, atol=1e-5, msg=name)
    sa, sb = flatten(written.runner.store.state or {}), flatten(autograd.runner.store.state or {})
    for name, v in sb.items():
        torch.testing.assert_close(sa[name], v, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("algorithm", ["fedprox", "ditto", "scaffold"])
def test_proximal_and_corrected_gradients_are_autograds_for_the_cohort(algorithm):
    """FedProx's and Ditto's proximal objectives and SCAFFOLD's corrected step, written for
    the whole cohort at once: each client's gradient and value (the proximal distance per
    client, not summed over the cohort) equal autograd's on that client alone."""
    alg = _algorithm(algorithm, [8])
    g, params, x, y, w = _cohort(alg)
    extras = {k: v + torch.randn(v.shape, generator=g) for k, v in params.items()}
    loss = alg.personal_loss if algorithm == "ditto" else alg.loss
    _against_autograd(loss, params, extras, x, y, w)
