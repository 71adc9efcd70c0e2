"""Seed methods of issue 6: CGPFL, CGPFL-Heur, UCFL, FedIPG, DFL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.base import RoundInfo
from fedshift.algorithms.common.invariance import gradient_alignment_penalty
from fedshift.algorithms.common.mi import critic_score, init_critic, jsd_bound, jsd_mi
from fedshift.algorithms.ucfl import collaboration_weights
from fedshift.api import make_config
from fedshift.engine.schedule import make_schedule
from fedshift.experiment import build_experiment

SETTINGS = dict(lr=0.05, batch_size=8, local_epochs=1, rounds=2, model_options={"hidden": [8]})
FAST = {
    "cgpfl": {"local_iterations": 2, "inner_steps": 2},
    "cgpfl-heur": {"local_iterations": 2, "inner_steps": 2},
    "ucfl": {},
    "fedipg": {"lambda_": 0.01},
    "dfl": {"donors": 2},
}


STEPS = {"dfl": 4, "fedipg": 4}  # fixed local steps keep the double back-prop tests quick


def run(algorithm, **kw):
    opts = {**FAST[algorithm], **kw.pop("algorithm_options", {})}
    if algorithm in STEPS and "local_steps" not in kw:
        kw["local_steps"] = STEPS[algorithm]
    return fs.run(
        algorithm=algorithm, data=toy_data(), algorithm_options=opts, **{**SETTINGS, **kw}
    )


def experiment(algorithm, cohort_size=0, **opts):
    cfg = make_config(
        algorithm=algorithm, algorithm_options=opts, cohort_size=cohort_size, **SETTINGS
    )
    return build_experiment(cfg, data=toy_data())


# ---- hand-computed pieces --------------------------------------------------------------


def test_ucfl_weights_eq9_by_hand():
    g = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    sigma2 = torch.tensor([0.5, 1.0, 2.0])
    n = torch.tensor([10.0, 20.0, 30.0])
    delta = [[0, 1, 4], [1, 0, 5], [4, 5, 0]]
    hand = torch.zeros(3, 3, dtype=torch.float64)
    for i in range(3):
        raw = [
            (n[j] / n[i]).item() * math.exp(-delta[i][j] / (2 * sigma2[i].item())) for j in range(3)
        ]
        hand[i] = torch.tensor(raw) / sum(raw)
    w = collaboration_weights(g, sigma2, n)
    torch.testing.assert_close(w, hand)
    assert hand[0, 1] == pytest.approx(
        20 * math.exp(-1) / (10 + 20 * math.exp(-1) + 30 * math.exp(-4))
    )


def test_ucfl_gradient_statistics_match_autograd():
    """Over cohorts of the run's cohort_size (3 of the 7 users here), equal to one cohort."""
    exp = experiment("ucfl", cohort_size=3, stat_batch=16)
    alg, ctx = exp.algorithm, exp.ctx
    grads, sigma2 = alg.gradient_statistics()
    whole = experiment("ucfl", stat_batch=16).algorithm.gradient_statistics()
    torch.testing.assert_close(grads, whole[0])
    torch.testing.assert_close(sigma2, whole[1])
    model = ctx.model
    for i in (0, 2, 5):
        x, y = ctx.data.train.client(i)
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        full = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        torch.testing.assert_close(grads[i], full, rtol=1e-4, atol=1e-6)
    sizes = ctx.data.train.sizes()
    assert (sigma2[sizes >= 32] > 0).all()  # two or more full minibatches of 16
    assert (sigma2[sizes < 16] == 0).all()  # one batch = all data: no spread to measure


def test_ucfl_silhouette_picks_two_clear_groups():
    exp = experiment("ucfl")
    pts = np.concatenate([np.zeros((4, 3)), np.ones((3, 3))]) + 0.01 * np.arange(21).reshape(7, 3)
    sil = torch.full((8,), -2.0, dtype=torch.float64)
    assert exp.algorithm.choose_streams(pts, sil) == 2
    assert sil[2] > 0.9 and -1 <= sil[6] <= 1


def test_cgpfl_server_step_by_hand():
    exp = experiment("cgpfl", K=2, alpha=0.5)
    alg, server = exp.algorithm, exp.runner.server
    w0 = {k: v[0] for k, v in server["ctx"]["p"].items()}
    shift = torch.tensor([1.0, 1, 1, 1, -1, -1, -1])
    uploads = {"p": {k: v + shift.view(-1, *([1] * v.dim())) for k, v in w0.items()}}
    info = RoundInfo(torch.arange(7), torch.ones(7), 0)
    new = alg.aggregate(server, uploads, info)
    a, b = int(new["assign"][0]), int(new["assign"][4])
    assert a != b and (new["assign"][:4] == a).all() and (new["assign"][4:] == b).all()
    for k, v in w0.items():  # Ω_k ← Ω_k − α(Ω_k − mean of its uploads): w0 ± 0.5
        torch.testing.assert_close(new["ctx"]["p"][k][a], v + 0.5)
        torch.testing.assert_close(new["ctx"]["p"][k][b], v - 0.5)
    assert info.log["contexts"] == 2


def test_fedipg_penalty_by_hand_and_gradcheck():
    x, y = torch.tensor([1.0, 2.0]), torch.tensor(1.0)

    def risk(p):
        return 0.5 * ((p["a"] * x).sum() - y) ** 2

    # R = ½(a·x − y)², ∇R = (a·x − y)x; a = (1, 1): ∇R = (2, 4), ⟨∇R, a⟩ = 6, penalty 36
    penalty, value = gradient_alignment_penalty(risk, {"a": torch.tensor([1.0, 1.0])})
    assert penalty.item() == pytest.approx(36.0) and value.item() == pytest.approx(2.0)
    a = torch.randn(2, dtype=torch.float64, requires_grad=True)
    x64, y64 = x.double(), y.double()

    def pen(a):
        return gradient_alignment_penalty(
            lambda p: 0.5 * ((p["a"] * x64).sum() - y64) ** 2, {"a": a}
        )[0]

    assert torch.autograd.gradcheck(pen, (a,))


def test_jsd_estimator_known_case():
    # joint P over 4 cells vs product of marginals Q (uniform); optimal critic T* = log(P/Q)
    p = torch.tensor([0.4, 0.1, 0.1, 0.4], dtype=torch.float64)
    q = torch.full((4,), 0.25, dtype=torch.float64)
    t = torch.log(p / q)
    m = (p + q) / 2
    jsd = 0.5 * (p * torch.log(p / m)).sum() + 0.5 * (q * torch.log(q / m)).sum()
    torch.testing.assert_close(jsd_bound(t, t, p, q), 2 * jsd - 2 * math.log(2))
    # any other critic gives a lower value (the bound is a supremum over T)
    assert jsd_bound(t * 0.5, t * 0.5, p, q) < 2 * jsd - 2 * math.log(2)
    # jsd_mi pairs a_i with b_i (joint) and with b_{i+1} (product of marginals)
    g = torch.Generator().manual_seed(0)
    critic = init_critic(4, 5, g)
    a, b, w = torch.randn(6, 2), torch.randn(6, 2), torch.ones(6)
    hand = jsd_bound(critic_score(critic, a, b), critic_score(critic, a, b.roll(1, 0)), w, w)
    torch.testing.assert_close(jsd_mi(critic, a, b, w), hand)


# ---- reductions ------------------------------------------------------------------------


@pytest.mark.parametrize("omega_step", ["pfedme", "thesis"])
def test_cgpfl_k1_is_pfedme_local_solver(omega_step):
    """K = 1, α = 1: one round equals pFedMe's bi-level local solver written out by hand,
    with the ω̃ step β·λ(ω̃ − θ) (pFedMe, default) or β·(2/N)(ω̃ − θ) (thesis line 10)."""
    lam, s_steps, r_iters, lr = 2.0, 2, 3, 0.05
    c = lam if omega_step == "pfedme" else 2 / 7  # toy data: N = 7
    out = run(
        "cgpfl",
        rounds=1,
        algorithm_options={
            "K": 1,
            "lambda_": lam,
            "inner_steps": s_steps,
            "local_iterations": r_iters,
            "personal_lr": 0.03,
            "omega_step": omega_step,
        },
    )
    exp = experiment("cgpfl", K=1)
    ctx, data = exp.ctx, exp.ctx.data.train
    model = ctx.model
    w0 = {k: v.clone() for k, v in ctx.initial_params.items()}
    sched = make_schedule(
        data, torch.arange(7), seed=0, round_=0, purpose="train", batch_size=8, steps=r_iters
    )
    omegas = []
    for i in range(7):
        theta = {k: v.clone() for k, v in w0.items()}
        omega = {k: v.clone() for k, v in w0.items()}
        for r in range(r_iters):
            x, y = data.x[sched.index[i, r]], data.y[sched.index[i, r]]
            for _ in range(s_steps):
                th = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
                logits = torch.func.functional_call(model, th, (x,))
                f = F.cross_entropy(logits, y) + lam / 2 * sum(
                    ((th[k] - omega[k]) ** 2).sum() for k in th
                )
                grads = torch.autograd.grad(f, list(th.values()))
                theta = {k: (th[k] - 0.03 * g).detach() for (k, g) in zip(th, grads, strict=True)}
            omega = {k: omega[k] - lr * c * (omega[k] - theta[k]) for k in omega}
        omegas.append(omega)
    server = out.result.server
    for k in w0:
        ref = torch.stack([o[k] for o in omegas]).mean(0)
        torch.testing.assert_close(server["ctx"]["p"][k][0], ref, rtol=1e-4, atol=1e-5)


def test_fedipg_lambda_zero_is_fedavg():
    a = run("fedipg", algorithm_options={"lambda_": 0.0})
    b = fs.run(algorithm="fedavg", data=toy_data(), local_steps=4, **SETTINGS)
    for part, tree in b.result.server.items():  # {"p": …, "b": …}
        for k, v in tree.items():
            torch.testing.assert_close(a.result.server[part][k], v)
    assert len(a.result.rounds[0].extras["contribution"]) == 7


def test_fedipg_exit_strategy_ignores_exited_uploads():
    """Alg. 1 line 6 aggregates I_ID only: whatever the exited clients 1 and 3 hold, the
    global model is the same (it would change if their uploads were averaged in)."""

    def corrupt(data):  # clients 1 and 3: other features and labels, same sizes
        x, y, off, sizes = data.train.x, data.train.y, data.train.offsets, data.train.sizes()
        for i in (1, 3):
            rows = slice(int(off[i]), int(off[i] + sizes[i]))
            x[rows] = -5 * x[rows] + 3
            y[rows] = (y[rows] + 1) % data.num_classes
        return data

    opts = dict(algorithm="fedipg", local_steps=4, **SETTINGS)
    exit_ = {"lambda_": 0.01, "exit_clients": [1, 3]}
    a = fs.run(data=toy_data(), algorithm_options=exit_, **opts)
    b = fs.run(data=corrupt(toy_data()), algorithm_options=exit_, **opts)
    for k, v in a.result.server["p"].items():
        torch.testing.assert_close(b.result.server["p"][k], v)
    assert a.result.rounds[-1].extras["exited"] == [1, 3]
    kept = fs.run(data=corrupt(toy_data()), algorithm_options={"lambda_": 0.01}, **opts)
    assert any(
        not torch.allclose(kept.result.server["p"][k], v) for k, v in a.result.server["p"].items()
    )  # the corruption matters when 1 and 3 aggregate


def test_ucfl_homogeneous_users_is_fedavg(monkeypatch):
    """Equal gradients (Δ = 0): w_ij = n_j / Σ n, the FedAvg rule (§IV-A remark)."""
    from fedshift.algorithms.ucfl import UCFL

    monkeypatch.setattr(
        UCFL, "gradient_statistics", lambda self: (torch.zeros(7, 3), torch.ones(7))
    )
    a = run("ucfl", algorithm_options={"streams": 1})
    b = fs.run(algorithm="fedavg", data=toy_data(), **SETTINGS)
    for part, tree in b.result.server.items():  # the one stream {"p": …, "b": …} [1, …]
        for k, v in tree.items():
            got = a.result.server["s"][part][k][0]
            torch.testing.assert_close(got, v, rtol=1e-5, atol=1e-6)
    ex = a.result.rounds[0].extras
    assert ex["streams"] == 1 and ex["sim_time"] == pytest.approx(
        1 + 4 + 1 + sum(1 / k for k in range(1, 8))
    )
    assert len(ex["silhouette"]) == 5  # k = 2..N−1


def test_dfl_counts_donor_traffic():
    with_t = run("dfl", rounds=2)
    without = run("dfl", rounds=2, algorithm_options={"lambda_": 0.0})
    assert with_t.result.rounds[1].bytes_down > without.result.rounds[1].bytes_down
    assert with_t.result.rounds[0].bytes_up > without.result.rounds[0].bytes_up


def test_dfl_only_the_specific_branch_minimises_i_s():
    """Algorithm 2: E_s descends ∇_{ω_s} I_s, E_c is updated by F_k − I_c alone, and the
    I_s critic ascends its estimate. So E_c's gradient must not depend on the I_s critic,
    while E_s's does (MI terms only: λ = 0 and a zero head isolate them)."""
    from fedshift.algorithms.common.global_model import split_state
    from fedshift.algorithms.dfl import HEAD, INV, SPEC

    exp = experiment("dfl", lambda_=0.0)
    alg = exp.algorithm
    server = alg.init()
    glob_p, glob_b = split_state(server)
    local_p, local_b = split_state(alg.init_client_state(server))
    extras = {"global": server}
    x, y = exp.data.train.x[:16], exp.data.train.y[:16]
    w = torch.ones(16)

    def grads(critic_seed):
        g = torch.Generator().manual_seed(critic_seed)
        fresh = init_critic(alg.net.feature_dim, alg.hp.critic_hidden, g)
        critic = {f"critic_s.{k}": v for k, v in fresh.items()}
        p = {**glob_p, **local_p, **critic}
        p = {k: (torch.zeros_like(v) if k.startswith(HEAD) else v) for k, v in p.items()}
        p = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        loss = alg.loss(p, {**glob_b, **local_b}, extras, x, y, w)
        keys = list(p)
        return dict(zip(keys, torch.autograd.grad(loss, [p[k] for k in keys]), strict=True))

    a, b = grads(1), grads(2)
    inv = [k for k in a if k.startswith(INV)]
    spec = [k for k in a if k.startswith(SPEC)]
    assert inv and spec
    for k in inv:  # I_c's gradient only, the same whatever the I_s critic
        torch.testing.assert_close(a[k], b[k])
    assert any(not torch.allclose(a[k], b[k]) for k in spec)  # E_s minimises I_s
    assert any(a[k].abs().sum() > 0 for k in a if k.startswith("critic_s."))  # critic ascends


@pytest.mark.parametrize("mode", ["local", "global"])
def test_dfl_invariant_bn_statistics(mode):
    """invariant_bn=local: a trained client is evaluated with E_c^G's weights and its own
    E_c BatchNorm statistics (which differ between clients of shifted inputs); global: with
    the server's averaged statistics."""
    from fedshift.data.federated import FederatedData, Split

    g = torch.Generator().manual_seed(0)

    def part(n, shift):
        x = torch.rand(n, 1, 8, 8, generator=g) + shift
        return x, torch.randint(0, 3, (n,), generator=g)

    shifts = (0.0, 1.0, 3.0)
    train = Split.from_clients([part(n, s) for n, s in zip((20, 30, 12), shifts, strict=True)])
    test = {"test": Split.from_clients([part(10, s) for s in shifts])}
    cfg = make_config(
        algorithm="dfl",
        rounds=1,
        lr=0.05,
        batch_size=8,
        local_steps=2,
        model="dfl-cnn",
        model_options={"channels": [4], "feature_dim": 8},
        algorithm_options={"invariant_bn": mode, "donors": 1},
    )
    exp = build_experiment(cfg, data=FederatedData("tiny", 3, (1, 8, 8), train, test))
    exp.runner.run()
    server, ids = exp.runner.server, torch.arange(3)
    state = exp.runner.store.take(ids, "cpu")
    pred = exp.algorithm.predictor(server, state, exp.ctx.cohort(ids, 0))
    key = "extractor.invariant.bn1.running_mean"
    got, avg = pred.buffers[key], server["b"][key]
    if mode == "local":
        torch.testing.assert_close(got, state["b"][key])
        assert not torch.allclose(got[0], got[2]) and not torch.allclose(got[0], avg)
    else:
        assert key not in state.get("b", {})
        for row in got:
            torch.testing.assert_close(row, avg)


@pytest.mark.parametrize("algorithm", ["fedipg", "ucfl"])
def test_batchnorm_models_run(algorithm):
    """BatchNorm running statistics are updated in place: the double back-prop of FedIPG and
    UCFL's per-user gradients must take them as inputs, not capture them."""
    from fedshift.data.federated import FederatedData, Split

    g = torch.Generator().manual_seed(0)

    def part(n):
        return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    train = Split.from_clients([part(n) for n in (20, 30, 12)])
    test = {"test": Split.from_clients([part(10) for _ in range(3)])}
    data = FederatedData("tiny", 3, (1, 8, 8), train, test)
    out = fs.run(
        algorithm=algorithm,
        data=data,
        rounds=1,
        lr=0.05,
        batch_size=8,
        model="dfl-cnn",
        model_options={"channels": [4], "feature_dim": 8},
        algorithm_options={"stat_batch": 8} if algorithm == "ucfl" else {},
    )
    assert out.metrics["average"] is not None


def test_fedipg_contribution_by_hand():
    """Eq. (12) with ĝ_{-i}: four clients, three pull one way and one the other (η = 1,
    one step each, so g_i = w^t − w_i)."""
    from types import SimpleNamespace

    from fedshift.algorithms.fedipg import FedIPG

    g = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    server = {"p": {"w": torch.zeros(2)}}
    models = {"p": {"w": -g}}
    ones = torch.ones(4)

    def contributions(smoothness, weights):
        fake = SimpleNamespace(
            ctx=SimpleNamespace(sgd=SimpleNamespace(lr=1.0)),
            hp=SimpleNamespace(smoothness=smoothness),
        )
        return FedIPG.contributions(fake, server, models, ones, weights, ones)

    # L = 0: C_0 = p⟨ĝ_{-0}, g_0⟩/‖ĝ_{-0}‖² = ¼·⅓/(1/9) = 0.75; C_3 = ¼·(−1)/1 = −0.25
    c = contributions(0.0, ones)
    torch.testing.assert_close(c, torch.tensor([0.75, 0.75, 0.75, -0.25]))
    # L = 1 adds −(L/2)η p²‖g_i‖² = −1/32 to the numerator
    c = contributions(1.0, ones)
    torch.testing.assert_close(c, torch.tensor([0.46875, 0.46875, 0.46875, -0.28125]))
    # client 3 exited (weight 0): the others are judged against the two remaining
    # regular clients, client 3 against all three
    c = contributions(0.0, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(c, torch.tensor([0.25, 0.25, 0.25, -0.25]))
