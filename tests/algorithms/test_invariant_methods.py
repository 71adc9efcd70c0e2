"""Invariant personalized methods: FedPIN, FedSDR (+FedAvg, +pFedMe), PerInvFL, pFedMe."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.common.losses import cross_entropy
from fedshift.algorithms.fedpin import fit_linear
from fedshift.algorithms.perinvfl import PerInvFL, PerInvFLHyper, adam_step
from fedshift.algorithms.pfedme import PFedMe, PFedMeHyper
from fedshift.api import make_config
from fedshift.data.federated import FederatedData, Split
from fedshift.engine.contract import flatten, leaves
from fedshift.engine.sgd import SGDConfig
from fedshift.errors import FedshiftError
from fedshift.experiment import build_experiment

SETTINGS = dict(lr=0.1, batch_size=8, local_steps=3, rounds=2, model_options={"hidden": [8]})
SIZES = (5, 17, 30, 9)


def env_toy() -> FederatedData:
    """toy data whose clients hold one of two training environments (even/odd client)."""
    d = toy_data(sizes=SIZES)
    sizes = d.train.sizes()
    env = torch.repeat_interleave(torch.arange(len(SIZES)) % 2, sizes)
    d.train = Split(d.train.x, d.train.y, d.train.offsets, env)
    d.train_env_names = ["even", "odd"]
    return d


def run(algorithm, options=None, **kw):
    return fs.run(
        algorithm=algorithm,
        data=env_toy(),
        algorithm_options=options or {},
        **{**SETTINGS, **kw},
    )


def same_clients(a, b):
    assert a.metrics["per_client"] == pytest.approx(b.metrics["per_client"], abs=1e-9)


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


def test_fedsdr_gamma_zero_personal_models_ignore_discovery():
    a = run("fedsdr", {"gamma": 0.0, "lambda_": 0.0, "personal_epochs": 1})
    b = run("fedsdr", {"gamma": 0.0, "lambda_": 0.5, "personal_epochs": 1})
    same_clients(a, b)
    sd_a, sd_b = a.result.server["sd"]["p"], b.result.server["sd"]["p"]
    assert any(not torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


@pytest.mark.parametrize("algorithm", ["fedsdr", "fedsdr-fedavg", "fedsdr-pfedme"])
@pytest.mark.parametrize("view", ["features", "disagreement"])
def test_fedsdr_features_computed_once_train_as_features_computed_per_step(
    monkeypatch, algorithm, view
):
    """Ψ is fixed in stage 2 and while the environment classifiers train, so its outputs
    are computed once per pass (client_rows); the models must be those of the per-step
    computation up to float rounding (a different matmul shape), and moved by training."""
    from fedshift.algorithms.fedsdr import ShortcutDiscovery

    options = {"gamma": 1.0, "personal_epochs": 2, "shortcut_view": view}
    once = run(algorithm, options)
    monkeypatch.setattr(ShortcutDiscovery, "per_sample", lambda self: False)
    per_step = run(algorithm, options)
    for k, v in per_step.result.server.items():
        torch.testing.assert_close(once.result.server[k], v, rtol=1e-4, atol=1e-5, msg=k)
    torch.testing.assert_close(once.result.accuracy, per_step.result.accuracy)  # personal models
    w0 = run(algorithm, options, rounds=0).result.server
    assert not torch.allclose(once.result.server["env.weight"], w0["env.weight"])


def test_fedsdr_environment_classifiers_average_over_holders_only():
    out = run("fedsdr", {"personal_epochs": 1, "gamma": 0.1}, rounds=1)
    w0 = run("fedsdr", {"personal_epochs": 1, "gamma": 0.1}, rounds=0).result.server
    # both environments are held by some client, so both classifiers moved
    for e in range(2):
        assert not torch.equal(out.result.server["env.weight"][e], w0["env.weight"][e])


def test_fedsdr_disagreement_view_is_the_centred_environment_outputs():
    out = run("fedsdr", {"personal_epochs": 1, "gamma": 0.1}, rounds=1)
    exp = build_experiment(
        make_config(
            algorithm="fedsdr",
            algorithm_options={"shortcut_view": "disagreement"},
            **{**SETTINGS, "rounds": 1},
        ),
        data=env_toy(),
    )
    alg, server = exp.runner.alg, out.result.server
    data = env_toy()
    x, k = data.train.x[:6], data.num_classes
    view = alg.shortcut(alg.psi_extras(server), x)  # [B, E·K]
    assert view.shape == (6, 2 * k)
    per_env = view.view(6, 2, k)
    torch.testing.assert_close(per_env.sum(1), torch.zeros(6, k), atol=1e-6, rtol=0)
    # the two environments' classifiers disagree, so the view is not zero
    assert per_env.abs().max() > 1e-4
    with pytest.raises(FedshiftError, match="shortcut_view"):
        run("fedsdr", {"shortcut_view": "logits"})


def test_fedsdr_estimator_choice_changes_the_personal_models():
    runs = {
        e: run("fedsdr", {"personal_epochs": 1, "gamma": 1.0, "mi_estimator": e}, rounds=1)
        for e in ("moment", "correlation", "prediction")
    }
    states = {e: r.result.server for e, r in runs.items()}
    # stage 1 does not depend on the estimator
    torch.testing.assert_close(states["moment"], states["prediction"])
    per_client = {e: r.metrics["per_client"] for e, r in runs.items()}
    assert per_client["moment"] != per_client["correlation"]
    assert per_client["correlation"] != per_client["prediction"]
    with pytest.raises(FedshiftError, match="mi_estimator"):
        run("fedsdr", {"mi_estimator": "kernel"})


def test_fedsdr_signature_view_keeps_its_tables_on_the_server():
    options = {"personal_epochs": 1, "gamma": 0.1, "shortcut_view": "signature"}
    exp = build_experiment(
        make_config(algorithm="fedsdr", algorithm_options=options, **{**SETTINGS, "rounds": 1}),
        data=env_toy(),
    )
    exp.runner.run(None)
    alg, server = exp.runner.alg, exp.runner.server
    # every client reported its (environment, class) groups: each holds one environment
    counts = server["sig"]["count"]
    held = counts.sum(2) > 0  # [N, E]
    assert held.tolist() == [[u % 2 == e for e in range(2)] for u in range(len(SIZES))]
    assert counts.sum((1, 2)).tolist() == [float(n) for n in env_toy().train.sizes()]
    payload = alg.configure(server, None)
    assert list(payload.broadcast["sig"]) == ["proj"]  # sum, count, within stay
    found = int((server["sig"]["proj"].abs().sum(0) > 0).sum())
    x = env_toy().train.x[:5]
    assert alg.shortcut(alg.psi_extras(server), x).shape == (5, found)


def test_fedsdr_needs_environment_ids():
    with pytest.raises(FedshiftError, match="environment ids"):
        fs.run(algorithm="fedsdr", data=toy_data(sizes=SIZES), **SETTINGS)


def test_perinvfl_beta_zero_personal_models_are_local_and_alpha_zero_freezes_nu():
    a = run("perinvfl", {"beta": 0.0, "alpha": 0.0, "personal_steps": 2})
    b = run("perinvfl", {"beta": 0.0, "alpha": 1.0, "personal_steps": 2})
    same_clients(a, b)
    init = run("perinvfl", {"personal_steps": 2}, rounds=0).result.server
    torch.testing.assert_close(a.result.server["p"], init["p"])


def test_perinvfl_adam_step_is_torch_adam():
    g = torch.Generator().manual_seed(0)
    p = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)}
    ref = [v.clone().requires_grad_(True) for v in p.values()]
    opt = torch.optim.Adam(ref, lr=0.01)
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v = {k: torch.zeros_like(t) for k, t in p.items()}
    k = torch.zeros(())
    for _ in range(4):
        grads = {n: torch.randn(t.shape, generator=g) for n, t in p.items()}
        for r, gr in zip(ref, grads.values(), strict=True):
            r.grad = gr.clone()
        opt.step()
        p, m, v, k = adam_step(p, grads, m, v, k, 0.01)
    assert float(k) == 4.0
    for r, t in zip(ref, p.values(), strict=True):
        torch.testing.assert_close(t, r.detach(), rtol=1e-5, atol=1e-6)


def test_perinvfl_adam_engine_step_matches_algorithm_by_hand():
    """One step of the Adam update rule = S Adam steps of θ on L_INV + β‖θ − ν‖², then one
    Adam step of ν on L_INV(ν) (IRMv1, weight w, loss divided by w > 1)."""
    exp = build_experiment(
        make_config(algorithm="perinvfl", **SETTINGS), data=toy_data(sizes=SIZES)
    )
    eta, gamma, beta, weight = 0.03, 0.01, 0.7, torch.tensor(50.0)
    ctx = dataclasses.replace(exp.ctx, sgd=SGDConfig(gamma))
    alg = PerInvFL(PerInvFLHyper(beta=beta, personal_steps=3, personal_lr=eta), ctx)
    g = torch.Generator().manual_seed(2)
    nu = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in ctx.initial_params.items()}
    theta = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in nu.items()}
    state = alg.init_client_state({})
    adam = {k: v for k, v in state.items() if k in ("am", "av", "ak")}
    assert len(adam) == 3 and all(float(v.abs().sum()) == 0 for v in leaves(adam))
    x, y, ones = ctx.data.train.x[:6], ctx.data.train.y[:6], torch.ones(6)
    params = {**nu, "pm": theta, **adam}
    extras = {"weight": weight}
    new, _ = alg.local_step(params, {}, extras, x, y, ones)
    new = flatten(new)

    def irm(t):
        logits = ctx.forward(t, {}, x)
        scale = torch.ones((), requires_grad=True)
        r = torch.nn.functional.cross_entropy(scale * logits, y)
        (gs,) = torch.autograd.grad(r, scale, create_graph=True)
        return (torch.nn.functional.cross_entropy(logits, y) + weight * gs**2) / weight

    def by_hand(start, objective, lr, steps):
        t = [v.clone().requires_grad_(True) for v in start.values()]
        opt = torch.optim.Adam(t, lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            objective(dict(zip(start, t, strict=True))).backward()
            opt.step()
        return dict(zip(start, (v.detach() for v in t), strict=True))

    def personal(t):
        # eq. 3 rescaled as a whole: (L_INV + β‖θ − ν‖²) / λ
        return irm(t) + beta / weight * sum(((t[k] - nu[k]) ** 2).sum() for k in nu)

    hand_theta = by_hand(theta, personal, eta, 3)
    hand_nu = by_hand(nu, irm, gamma, 1)
    for k in nu:
        torch.testing.assert_close(new[f"pm/{k}"], hand_theta[k], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(new[k], hand_nu[k], rtol=1e-4, atol=1e-6)
    assert float(new["ak/pm"]) == 3.0 and float(new["ak/nu"]) == 1.0


def test_perinvfl_adam_state_persists_per_client():
    """Each client's Adam step counts add up over rounds: 2 rounds × 3 local steps = 6 for ν,
    × S = 2 personal steps each = 12 for θ."""
    cfg = make_config(algorithm="perinvfl", algorithm_options={"personal_steps": 2}, **SETTINGS)
    exp = build_experiment(cfg, data=env_toy())
    exp.runner.run()
    state = exp.runner.store.state
    steps = state["ak"]
    torch.testing.assert_close(steps["nu"], torch.full_like(steps["nu"], 6.0))
    torch.testing.assert_close(steps["pm"], torch.full_like(steps["pm"], 12.0))
    assert all(float(v.abs().sum()) > 0 for v in leaves({k: state[k] for k in ("am", "av")}))


def test_pfedme_zero_inner_steps_keeps_the_global_model():
    init = run("pfedme", {"inner_steps": 2}, rounds=0).result.server
    out = run("pfedme", {"inner_steps": 0}).result.server
    for k, v in init.items():
        torch.testing.assert_close(out[k], v)


@pytest.mark.parametrize("written", [True, False])
def test_pfedme_step_matches_algorithm_by_hand(monkeypatch, written):
    """One step of pFedMe's update rule = K personal steps, then w ← w − ηλ(w − θ̃); with
    the MLP risk's gradient written out (the default for an MLP) and with autograd."""
    if not written:
        monkeypatch.setattr(PFedMe, "inner_gradient", lambda self: None)
    exp = build_experiment(
        make_config(algorithm="pfedme", **{**SETTINGS, "lr": 0.05}),
        data=toy_data(sizes=SIZES),
    )
    ctx = exp.ctx
    hp = PFedMeHyper(lambda_=4.0, inner_steps=3, personal_lr=0.2)
    alg = PFedMe(hp, ctx)
    assert (alg.inner_gradient() is not None) == written
    g = torch.Generator().manual_seed(1)
    w = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in ctx.initial_params.items()}
    theta = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    x, y = ctx.data.train.x[:6], ctx.data.train.y[:6]
    ones = torch.ones(6)
    params = {**w, "pm": theta}
    new, _ = alg.local_step(params, {}, {}, x, y, ones)
    new = flatten(new)
    # by hand
    t = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
    for _ in range(3):
        risk = torch.nn.functional.cross_entropy(ctx.forward(t, {}, x), y)
        prox = sum(((t[k] - w[k]) ** 2).sum() for k in w)
        gr = torch.autograd.grad(risk + 2.0 * prox, list(t.values()))
        steps = zip(t.items(), gr, strict=True)
        t = {k: (v - 0.2 * gk).detach().requires_grad_(True) for (k, v), gk in steps}
    for k in w:
        torch.testing.assert_close(new[f"pm/{k}"], t[k].detach(), rtol=1e-5, atol=1e-6)
        hand_w = w[k] - 0.05 * 4.0 * (w[k] - t[k].detach())
        torch.testing.assert_close(new[k], hand_w, rtol=1e-5, atol=1e-6)


def _cmnist_available() -> bool:
    import os
    from pathlib import Path

    root = Path(os.environ.get("FEDSHIFT_DATA", ""))
    return (root / "mnist").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _cmnist_available(), reason="needs MNIST under $FEDSHIFT_DATA")
def test_fedsdr_worst_case_above_fedavg_on_small_cmnist():
    """Reduced-scale ordering of thesis Table 4.2 with a model that reads the digit: FedSDR's
    worst case ≫ FedAvg's (the colour model), its accuracy flat over p_te and above the
    50 % of a constant predictor (which this test must reject: on a binary task a constant
    scores ≈ 50 % everywhere, above any colour model's worst case). At this scale the thesis's
    moment estimator has no working γ (seed 0, 5 rounds: γ ≤ 0.03 keeps the colour, worst
    ≤ 11; 0.05 gives 35 / 53 still tilted; γ ≥ 0.1 is a constant), so this uses the
    ``prediction`` estimator (ours, docs/methods/invariant.md): 53.1 / 55.6 at seed 0."""
    common = dict(
        scenario="cmnist",
        scenario_options={"samples": 4000, "test_samples": 2000},
        rounds=5,
        lr=0.05,
        batch_size=128,
    )
    avg = fs.run(algorithm="fedavg", **common)
    options = {"gamma": 1.0, "personal_epochs": 2, "mi_estimator": "prediction"}
    sdr = fs.run(algorithm="fedsdr", algorithm_options=options, **common)
    m = sdr.metrics
    assert not m["degenerate"], m["degenerate_why"]
    assert m["worst"] >= avg.metrics["worst"] + 25
    assert m["average"] >= 54.0  # reads the digit, not a constant
    per_env = list(m["per_env"].values())
    assert max(per_env) - min(per_env) <= 10.0  # flat over p_te: not reading the colour


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


def test_fedsdr_written_environment_gradient_is_autograds():
    from fedshift.algorithms.fedsdr import ShortcutDiscovery as SD

    class Heads:
        env_logits = SD.env_logits
        env_risk = SD.env_risk
        env_risk_gradient = SD.env_risk_gradient

    g = torch.Generator().manual_seed(0)
    c, e, k, d, b = 2, 3, 4, 5, 11  # a cohort of two clients: the gradient is batched
    params = {
        "env.weight": torch.randn(c, e, k, d, generator=g),
        "env.bias": torch.randn(c, e, k, generator=g),
    }
    z, y = torch.randn(c, b, d, generator=g), torch.randint(0, k, (c, b), generator=g)
    w = torch.ones(c, b)
    w[0, -2:] = 0  # empty slots of a short batch
    env = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 1, 2, 2])  # client 0: env 2 only in padding
    extras = {"env": torch.stack([env, env.flip(0)])}
    heads = Heads()
    grads, loss = heads.env_risk_gradient(params, {}, extras, z, y, w)
    per_client = (0, None, 0, 0, 0, 0)
    want = torch.func.vmap(torch.func.grad(heads.env_risk), in_dims=per_client)(
        params, {}, extras, z, y, w
    )
    risk = torch.func.vmap(heads.env_risk, in_dims=per_client)(params, {}, extras, z, y, w)
    torch.testing.assert_close(loss, risk)
    for key in params:
        torch.testing.assert_close(grads[key], want[key])
    assert grads["env.weight"][0, 2].abs().max() == 0  # no real sample of environment 2
    assert grads["env.weight"][1, 2].abs().max() > 0
