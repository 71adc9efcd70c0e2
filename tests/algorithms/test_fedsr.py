"""FedSR (src/fedshift/algorithms/fedsr.py): the CMI bound, evaluation with the mean
representation, r_μ, r_σ and C kept on each client, and uniform averaging (issue 18)."""

from __future__ import annotations

import torch
from helpers import INVARIANT_SIZES as SIZES
from helpers import baseline_experiment
from helpers import invariant_experiment as experiment
from toy import toy_data

from fedshift.algorithms.base import RoundInfo
from fedshift.algorithms.common.global_model import split_state
from fedshift.algorithms.common.split import classify
from fedshift.algorithms.fedsr import cmi_bound


def test_cmi_bound_is_the_gaussian_kl():
    mu, sigma = torch.tensor([[1.0, -0.5]]), torch.tensor([[0.7, 1.3]])
    r_mu, r_sigma, c = torch.tensor([[0.2, 0.0]]), torch.tensor([[1.5, 0.4]]), torch.tensor(2.0)
    want = torch.distributions.kl_divergence(
        torch.distributions.Normal(c * mu, c * sigma), torch.distributions.Normal(r_mu, r_sigma)
    ).sum(-1)
    torch.testing.assert_close(cmi_bound(mu, sigma, r_mu, r_sigma, c), want)
    zero = cmi_bound(torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3), torch.ones(1, 3), 1.0)
    torch.testing.assert_close(zero, torch.zeros(1))


def test_fedsr_evaluates_the_mean_representation():
    exp, _ = baseline_experiment("fedsr", rounds=1)
    alg, ctx = exp.algorithm, exp.ctx
    params, buffers = split_state(exp.runner.server)
    x = ctx.data.train.x[:5]
    mu, _ = alg.distribution(params, buffers, x)
    want = classify(ctx, {k: v for k, v in params.items() if k.startswith("head.")}, mu)
    pred = alg.predictor(exp.runner.server, {}, ctx.cohort(torch.arange(2), 0))
    torch.testing.assert_close(
        ctx.forward(pred.params, pred.buffers, x), want, rtol=1e-5, atol=1e-5
    )


def test_fedsr_reference_distributions_and_scale_stay_per_client():
    exp = experiment("fedsr", rounds=2, participation=0.5, data=toy_data(sizes=SIZES))
    exp.runner.run()
    server, state = exp.runner.server, exp.runner.store.state
    assert not any("ref_" in k or "scale" in k for k in server["p"])
    assert set(state) == {"p"}  # client state: {"p": {r_μ, r_σ, C}}
    state = state["p"]
    assert set(state) == {"fedsr.ref_mu", "fedsr.ref_sigma", "fedsr.scale"}
    k, d = exp.ctx.data.num_classes, exp.ctx.model.feature_dim
    assert state["fedsr.ref_mu"].shape == (len(SIZES), k, d)
    moved = [not torch.equal(state["fedsr.ref_mu"][c], torch.zeros(k, d)) for c in range(4)]
    assert 0 < sum(moved) <= 4  # clients that trained moved theirs ...
    trained = [c for c in range(4) if moved[c]]
    if len(trained) > 1:  # ... each to its own values
        a, b = trained[:2]
        assert not torch.equal(state["fedsr.ref_mu"][a], state["fedsr.ref_mu"][b])
    for c in range(4):
        if not moved[c]:  # never sampled: still the authors' initialisation
            torch.testing.assert_close(state["fedsr.scale"][c], torch.ones(()))


def test_fedsr_averages_uniformly():
    exp = experiment("fedsr", data=toy_data(sizes=SIZES))
    params = exp.runner.server["p"]  # Φ, A and ω
    uploads = {"p": {k: torch.stack([v + 1.0, v + 3.0]) for k, v in params.items()}}
    weights = torch.tensor([1.0, 9.0])  # very unequal n_u must not matter
    info = RoundInfo(torch.tensor([0, 1]), weights, 0)
    out = exp.runner.alg.aggregate(exp.runner.server, uploads, info)
    for k, v in params.items():
        torch.testing.assert_close(out["p"][k], v + 2.0)
