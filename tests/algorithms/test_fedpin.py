"""FedPIN (src/fedshift/algorithms/fedpin.py): reductions, variants, K in steps or epochs,
uniform averaging and the estimate of I(E,U;Y|Φ_g)."""

from __future__ import annotations

import pytest
import torch
from helpers import INVARIANT_SETTINGS as SETTINGS
from helpers import env_toy, same_clients, uniform_check
from helpers import invariant_experiment as experiment
from helpers import invariant_run as run

from fedshift.algorithms.common.losses import cross_entropy
from fedshift.algorithms.fedpin import fit_linear
from fedshift.api import make_config
from fedshift.engine.contract import flatten
from fedshift.errors import FedshiftError
from fedshift.experiment import build_experiment


def test_fedpin_lambda_gamma_zero_personal_model_is_local_erm():
    # with λ = γ = 0 the personal model never sees the anchor: α cannot change it
    a = run("fedpin", {"lambda_": 0.0, "gamma": 0.0, "alpha": 0.0})
    b = run("fedpin", {"lambda_": 0.0, "gamma": 0.0, "alpha": 5.0})
    same_clients(a, b)
    assert not torch.equal(a.result.server["aux.weight"], b.result.server["aux.weight"])
    # ... while with λ > 0 it depends on the global anchor
    c = run("fedpin", {"lambda_": 1.0, "gamma": 0.0, "alpha": 0.0})
    d = run("fedpin", {"lambda_": 1.0, "gamma": 0.0, "alpha": 5.0})
    assert c.metrics["per_client"] != pytest.approx(d.metrics["per_client"], abs=1e-6)


def test_fedpin_k_counts_local_steps_unless_epochs_are_asked_for():
    # Alg. 5: Ψ_u and the personal model take K local *steps* per round
    def personal(options):
        exp = build_experiment(
            make_config(algorithm="fedpin", algorithm_options=options, **SETTINGS), env_toy()
        )
        exp.runner.run()
        return {k: v.clone() for k, v in flatten(exp.runner.store.state["pm"]).items()}

    one, four = personal({"personal_steps": 1}), personal({"personal_steps": 4})
    assert any(not torch.equal(one[k], four[k]) for k in one)
    # personal_epochs > 0 counts K in epochs and makes personal_steps irrelevant
    e1, e4 = (personal({"personal_epochs": 1, "personal_steps": k}) for k in (1, 4))
    for k in e1:
        torch.testing.assert_close(e1[k], e4[k])
    assert any(not torch.equal(e1[k], one[k]) for k in one)
    with pytest.raises(FedshiftError):
        run("fedpin", {"personal_steps": 0})


def test_fedpin_variants_and_validation():
    gm = run("fedpin", {"variant": "gm"})
    pm0 = run("fedpin", {"variant": "pm-lambda0", "gamma": 0.0})
    pm = run("fedpin", {"lambda_": 0.0, "gamma": 0.0})
    same_clients(pm0, pm)  # pm-lambda0 is pm with λ = 0
    # gm evaluates the global model; its accuracy per client differs from personal models
    assert gm.metrics["per_client"] != pytest.approx(pm.metrics["per_client"], abs=1e-6)
    with pytest.raises(FedshiftError):
        run("fedpin", {"variant": "nope"})
    with pytest.raises(FedshiftError):
        run("fedpin", {"tau": 0.0})


def test_fedpin_gm_ft_trains_like_gm_and_evaluates_fine_tuned_models():
    gm, ft = run("fedpin", {"variant": "gm"}), run("fedpin", {"variant": "gm-ft"})
    for k, v in gm.result.server.items():  # the same global anchor ...
        torch.testing.assert_close(ft.result.server[k], v)
    # ... evaluated after each client's K epochs of local fine-tuning
    assert ft.metrics["per_client"] != pytest.approx(gm.metrics["per_client"], abs=1e-6)


def test_fedpin_gm_l2_ties_the_personal_model_to_the_anchor():
    # μ = 0: the personal model is local ERM, the same as pm with λ = γ = 0
    free = run("fedpin", {"variant": "gm-l2", "l2_weight": 0.0})
    same_clients(free, run("fedpin", {"lambda_": 0.0, "gamma": 0.0}))

    def distance(options):
        exp = build_experiment(
            make_config(algorithm="fedpin", algorithm_options=options, **SETTINGS), env_toy()
        )
        exp.runner.run()
        server, state = exp.runner.server, exp.runner.store.state
        theta, theta_g = state["pm"]["p"], server["p"]
        return sum(float(((theta[k] - theta_g[k]) ** 2).sum()) for k in theta_g)

    # μ > 0 pulls it towards θ_g: the larger μ, the closer
    far = distance({"variant": "gm-l2", "l2_weight": 0.0})
    near = distance({"variant": "gm-l2", "l2_weight": 5.0})
    assert near < 0.5 * far


def test_fedpin_pm_gamma0_is_pm_without_the_variance_term():
    a = run("fedpin", {"variant": "pm-gamma0", "gamma": 0.5})
    same_clients(a, run("fedpin", {"gamma": 0.0}))
    assert a.metrics["per_client"] != pytest.approx(
        run("fedpin", {"gamma": 0.5}).metrics["per_client"], abs=1e-6
    )


def test_fit_linear_takes_the_gradient_steps_of_the_weighted_cross_entropy():
    """ω_a's fitting steps (aux_steps) are plain gradient descent on its own risk: one step
    equals autograd's, and many steps lower the risk below the starting point."""
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g)
    w = torch.tensor([1.0] * 10 + [0.0] * 2)  # two empty slots
    weight, bias = torch.randn(3, 5, generator=g), torch.randn(3, generator=g)
    assert fit_linear(z, y, w, weight, bias, 0, 0.5)[0] is weight  # 0 steps: unchanged
    wt, bt = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    cross_entropy(torch.nn.functional.linear(z, wt, bt), y, w).backward()
    w1, b1 = fit_linear(z, y, w, weight, bias, 1, 0.5)
    torch.testing.assert_close(w1, weight - 0.5 * wt.grad)
    torch.testing.assert_close(b1, bias - 0.5 * bt.grad)
    wn, bn = fit_linear(z, y, w, weight, bias, 50, 0.5)
    before = cross_entropy(torch.nn.functional.linear(z, weight, bias), y, w)
    after = cross_entropy(torch.nn.functional.linear(z, wn, bn), y, w)
    assert after < 0.5 * before


def test_fedpin_averages_the_global_models_uniformly():
    exp = experiment("fedpin")
    server = flatten(exp.runner.server)
    shared = [k for k in server if not k.startswith("aux.client")]
    keys = [k for k in shared if server[k].is_floating_point()]

    def aggregate(server, uploads, info):
        rows = {k: server[k][info.ids] for k in ("aux.client_weight", "aux.client_bias")}
        return exp.runner.alg.aggregate(server, {**uploads, **rows}, info)

    uniform_check(exp, keys, aggregate)


def fedpin_global_value(options, scale: float) -> tuple[float, float]:
    """FedPIN's global objective on client 0's first 16 rows (inputs × ``scale``) and the
    risk R_g of (Φ_g, ω_g) on them."""
    from fedshift.algorithms.common.global_model import split_state
    from fedshift.algorithms.common.losses import cross_entropy

    exp = experiment("fedpin", options)
    alg, server = exp.runner.alg, exp.runner.server
    params, buffers = split_state(server)
    aux = {k: server[k] for k in ("aux.weight", "aux.bias")}
    aux |= {k: server[k][0] for k in ("aux.client_weight", "aux.client_bias")}
    rows = slice(0, 16)
    x, y = exp.ctx.data.train.x[rows] * scale, exp.ctx.data.train.y[rows]
    w = torch.ones(len(y))
    value = alg.global_loss({**params, **aux}, buffers, {"alpha": torch.tensor(100.0)}, x, y, w)
    risk = cross_entropy(exp.ctx.forward(params, buffers, x), y, w)
    return float(value), float(risk)


def test_fedpin_aux_fit_from_the_head_never_rewards_raising_the_aux_risk():
    """The exact ω_a = argmin holds ω_g in its class, so (1+α)R_g − αR_a ≥ R_g. Fitted from
    ω_g's head in steps of 1/L the estimate keeps that property even on large features;
    fitted from ω_a's own weights with a fixed step it does not (the objective falls below
    the risk: Φ_g is paid to raise R_a, the blow-up seen on Arjovsky's CMNIST)."""
    head = {"aux_init": "head", "aux_steps": 10}
    for scale in (1.0, 50.0):
        value, risk = fedpin_global_value(head, scale)
        assert value >= risk - 1e-5, (scale, value, risk)
    value, risk = fedpin_global_value({"aux_steps": 10, "aux_lr": 1.0}, 50.0)
    assert value < risk - 1.0
    with pytest.raises(Exception, match="aux_steps >= 1"):
        experiment("fedpin", {"aux_init": "head"})


def test_contrastive_and_variance_gradients_are_autograds():
    """The cohort-at-once gradients of L_con and Var(Φ(X)) against autograd per client: a
    zero feature row (the normalisation's ε branch), a short batch, an empty batch."""
    from fedshift.algorithms.common.representation import (
        contrastive_loss,
        contrastive_loss_gradient,
        feature_variance,
        feature_variance_gradient,
    )

    g = torch.Generator().manual_seed(3)
    z, pos, neg = (torch.randn(3, 7, 5, generator=g) for _ in range(3))
    z[1, 2] = 0.0
    pos[0, 4] = 0.0
    w = torch.ones(3, 7)
    w[1, 5:] = 0
    w[2] = 0  # no real sample: both terms and their gradients vanish
    value, d_z = contrastive_loss_gradient(z, pos, neg, 0.5, w)
    dims = (0, 0, 0, None, 0)
    want = torch.func.vmap(torch.func.grad(contrastive_loss), in_dims=dims)(z, pos, neg, 0.5, w)
    torch.testing.assert_close(
        value, torch.func.vmap(contrastive_loss, in_dims=dims)(z, pos, neg, 0.5, w)
    )
    torch.testing.assert_close(d_z, want)
    assert d_z[1, 2].abs().sum() > 0  # the zero row moves, as autograd moves it
    value, d_z = feature_variance_gradient(z, w)
    torch.testing.assert_close(value, torch.func.vmap(feature_variance)(z, w))
    torch.testing.assert_close(d_z, torch.func.vmap(torch.func.grad(feature_variance))(z, w))


@pytest.mark.parametrize("hidden", [[8], [8, 6]])
def test_fedpin_written_personal_gradients_are_autograds(hidden):
    """L_loc (risk + λ·L_con against Φ_g and Ψ_u + γ·Var) and GM-L2's objective, written for
    the whole cohort at once, against autograd per client (shared Φ_g given the client axis
    as the engine's batched step gives it)."""
    from fedshift.engine import local

    cfg = make_config(
        algorithm="fedpin",
        algorithm_options={"lambda_": 2.0, "gamma": 0.7, "l2_weight": 0.3},
        **dict(SETTINGS, model_options={"hidden": hidden}),
    )
    alg = build_experiment(cfg, env_toy()).algorithm
    g = torch.Generator().manual_seed(1)
    base = alg.ctx.initial_params

    def perturbed(c):
        return {k: v + 0.3 * torch.randn(c, *v.shape, generator=g) for k, v in base.items()}

    params, psi, glob = perturbed(3), perturbed(3), perturbed(1)
    glob = {k: v[0] for k, v in glob.items()}
    x = torch.randn(3, 9, *alg.ctx.data.input_shape, generator=g)
    y = torch.randint(0, alg.ctx.data.num_classes, (3, 9), generator=g)
    w = torch.ones(3, 9)
    w[2, 6:] = 0
    extras = {"gp": glob, "sp": psi}
    dims = (0, None, {"gp": None, "sp": 0}, 0, 0, 0)
    cohort_extras = {"gp": {k: v.expand(3, *v.shape) for k, v in glob.items()}, "sp": psi}
    for loss in (alg.local_loss, alg.l2_loss):
        written = local.written_gradient(loss)
        assert written is not None
        grads, value = written(params, {}, cohort_extras, x, y, w)
        want = torch.func.vmap(torch.func.grad(loss), in_dims=dims)(params, {}, extras, x, y, w)
        torch.testing.assert_close(
            value, torch.func.vmap(loss, in_dims=dims)(params, {}, extras, x, y, w)
        )
        assert sorted(grads) == sorted(params)
        for name in params:
            torch.testing.assert_close(grads[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
