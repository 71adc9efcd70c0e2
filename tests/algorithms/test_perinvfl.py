"""PerInvFL (src/fedshift/algorithms/perinvfl.py): reductions, its Adam steps against
torch's, the per-client Adam state, and L_INV on the client's whole training set."""

from __future__ import annotations

import dataclasses

import torch
from helpers import INVARIANT_SETTINGS as SETTINGS
from helpers import INVARIANT_SIZES as SIZES
from helpers import env_toy, record_training, same_clients
from helpers import invariant_experiment as experiment
from helpers import invariant_run as run
from toy import toy_data

from fedshift.algorithms.perinvfl import PerInvFL, PerInvFLHyper, adam_step
from fedshift.api import make_config
from fedshift.engine.contract import flatten, leaves
from fedshift.engine.sgd import SGDConfig
from fedshift.experiment import build_experiment


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


def test_perinvfl_penalty_sees_the_whole_client_training_set():
    options = {"anneal_rounds": 1, "irm_lambda": 10.0, "personal_steps": 2}
    a = run("perinvfl", options, batch_size=4)
    b = run("perinvfl", options, batch_size=64)
    for k, v in a.result.server.items():  # the run's batch size does not enter
        torch.testing.assert_close(b.result.server[k], v)
    c = flatten(run("perinvfl", {**options, "batch": "minibatch"}, batch_size=4).result.server)
    assert any(not torch.equal(c[k], v) for k, v in flatten(a.result.server).items())
    exp = experiment("perinvfl", options, rounds=1)
    calls = record_training(exp)
    exp.runner.run()
    assert len(calls) == 1  # one call: R = local_steps full-batch iterations
