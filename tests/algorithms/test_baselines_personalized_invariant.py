"""Personalized and invariant baselines: Ditto, FedRep, FedRoD, FedPAC, DRFA, FedSR, FedIIR,
IRM†-FT, IRM†-L2.

Per method: a small hand-computed case and reduction tests (cohort invariance is checked
for the whole registry in algorithms/test_all_algorithms.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import grad
from toy import toy_data

from fedshift.algorithms.base import RoundInfo
from fedshift.algorithms.common.alignment import alignment_loss, classifier_gradient
from fedshift.algorithms.common.global_model import split_state
from fedshift.algorithms.common.losses import squared_distance
from fedshift.algorithms.common.simplex import project_simplex, simplex_qp
from fedshift.algorithms.common.split import classify, features
from fedshift.algorithms.drfa import drfa_lambda_step
from fedshift.algorithms.fedpac import classifier_weights
from fedshift.algorithms.fedrod import balanced_softmax
from fedshift.algorithms.fedsr import cmi_bound
from fedshift.api import make_config
from fedshift.experiment import build_experiment

SETTINGS = dict(lr=0.1, batch_size=16, local_epochs=1, rounds=2, model_options={"hidden": [16]})


def experiment(algorithm, **kw):
    data = toy_data()
    cfg = make_config(algorithm=algorithm, scenario=data.name, **{**SETTINGS, **kw})
    exp = build_experiment(cfg, data=data)
    return exp, exp.runner.run()


def client_state(exp):
    return exp.runner.store.state or {}


def assert_trees_close(a, b, **tol):
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], **tol)


# ---------------------------------------------------------------- Ditto / IRM†-L2
def test_ditto_lambda_zero_personal_models_are_local_and_global_is_fedavg():
    ditto, d = experiment("ditto", algorithm_options={"lambda_": 0.0})
    local, loc = experiment("local")
    assert_trees_close(client_state(ditto), client_state(local))
    assert d.metrics["per_client"] == pytest.approx(loc.metrics["per_client"], abs=1e-9)
    _, fedavg = experiment("fedavg")
    assert_trees_close(d.server, fedavg.server)
    _, d1 = experiment("ditto")  # the global model never depends on λ
    assert_trees_close(d1.server, fedavg.server)
    assert d1.metrics["per_client"] != pytest.approx(loc.metrics["per_client"], abs=1e-9)


def test_personal_loss_gradient_is_risk_gradient_plus_lambda_pull():
    exp, _ = experiment("ditto", rounds=0, algorithm_options={"lambda_": 0.7})
    alg, ctx = exp.algorithm, exp.ctx
    v = {k: p + 0.1 for k, p in ctx.initial_params.items()}
    w = ctx.initial_params
    x, y = ctx.data.train.x[:8], ctx.data.train.y[:8]
    ones = torch.ones(8)
    got = grad(alg.personal_loss)(v, ctx.initial_buffers, w, x, y, ones)
    risk = grad(lambda p: F.cross_entropy(ctx.forward(p, ctx.initial_buffers, x), y))(v)
    for k in v:  # ∇ [R(v) + (λ/2)‖v − w‖²] = ∇R(v) + λ(v − w)
        torch.testing.assert_close(got[k], risk[k] + 0.7 * (v[k] - w[k]))
    extras = {"a": torch.tensor([1.0]), "env": None}  # keys the model lacks are skipped
    assert squared_distance({"a": torch.tensor([3.0])}, extras) == 4.0


def test_irm_l2_global_model_is_irm_and_zero_weight_is_local():
    opts = {"anneal_rounds": 1, "lambda_": 10.0}
    l2, res = experiment("irm-l2", algorithm_options={**opts, "l2": 0.0})
    _, irm = experiment("irm", algorithm_options=opts)
    assert_trees_close(res.server, irm.server)
    local, _ = experiment("local")
    assert_trees_close(client_state(l2), client_state(local))


def test_irm_ft_without_finetuning_predicts_as_irm():
    _, a = experiment("irm-ft", algorithm_options={"finetune_epochs": 0})
    _, b = experiment("irm")
    assert a.metrics["per_client"] == pytest.approx(b.metrics["per_client"], abs=1e-9)
    assert_trees_close(a.server, b.server)
    _, c = experiment("irm-ft", algorithm_options={"finetune_epochs": 3})
    assert c.metrics["per_client"] != pytest.approx(b.metrics["per_client"], abs=1e-9)


# ---------------------------------------------------------------- FedRep
def test_fedrep_zero_head_epochs_keeps_initial_heads_and_averages_uniformly():
    exp, _ = experiment("fedrep", algorithm_options={"head_epochs": 0})
    heads = client_state(exp)["p"]
    for k, v in heads.items():  # head.* of every client = the initial head
        init = exp.ctx.initial_params[k]
        torch.testing.assert_close(v, init.expand_as(v))
    trained, _ = experiment("fedrep")
    w = client_state(trained)["p"]["head.weight"]
    assert not torch.allclose(w[0], w[1])
    # one round by hand: the server's φ is the plain mean of the uploaded φ_i
    alg, ctx = trained.algorithm, trained.ctx
    ids = torch.tensor([0, 2, 5])
    cohort = ctx.cohort(ids, 7)
    out = alg.client_update(
        alg.configure(alg.init(), cohort), trained.runner.store.take(ids, "cpu"), cohort
    )
    new = alg.aggregate(alg.init(), out.upload, RoundInfo(ids, out.num_examples, 7))
    for part, tree in out.upload.items():
        for k, v in tree.items():
            torch.testing.assert_close(new[part][k], v.mean(0))
    assert not any(k.startswith("head.") for k in out.upload["p"])


# ---------------------------------------------------------------- FedRoD
def test_balanced_softmax_by_hand():
    logits = torch.tensor([[1.0, 2.0]])
    counts = torch.tensor([3.0, 1.0])
    e = torch.e
    hand = -torch.log(torch.tensor(3 * e / (3 * e + e**2)))
    torch.testing.assert_close(
        balanced_softmax(logits, torch.tensor([0]), torch.ones(1), counts), hand
    )


def test_fedrod_personal_term_trains_only_the_personal_head_and_prediction_sums_logits():
    exp, _ = experiment("fedrod")
    alg, ctx = exp.algorithm, exp.ctx
    params, buffers = split_state(exp.runner.server)
    personal = split_state(exp.runner.store.take(torch.tensor([1]), "cpu"))[0]
    tree = {**params, "personal": {k: v[0] for k, v in personal.items()}}
    x, y, w = ctx.data.train.x[:6], ctx.data.train.y[:6], torch.ones(6)
    counts = torch.tensor([2.0, 5.0, 1.0])
    g = grad(alg.loss)(tree, buffers, {"counts": counts}, x, y, w)

    def bsm_only(p):
        return balanced_softmax(ctx.forward(p, buffers, x), y, w, counts)

    g_bsm = grad(bsm_only)(params)
    for k in params:  # Φ and the generic head see the balanced-softmax loss only
        torch.testing.assert_close(g[k], g_bsm[k])
    pred = alg.predictor(
        exp.runner.server,
        exp.runner.store.take(torch.tensor([1]), "cpu"),
        ctx.cohort(torch.tensor([1]), 0),
    )
    z = features(ctx, params, buffers, x)
    want = classify(ctx, {k: v for k, v in params.items() if k.startswith("head.")}, z) + classify(
        ctx, {k: v[0] for k, v in personal.items()}, z
    )
    got = ctx.forward({k: v[0] for k, v in pred.params.items()}, buffers, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- FedPAC
def brute_force_simplex_min(p, step=0.005):
    best = np.inf
    m = p.shape[0]
    grid = np.arange(0, 1 + 1e-9, step)
    for head in itertools.product(grid, repeat=m - 1):
        last = 1 - sum(head)
        if last < -1e-12:
            continue
        a = np.array([*head, max(last, 0.0)])
        best = min(best, a @ p @ a)
    return best


def test_simplex_qp_matches_brute_force_and_closed_form():
    rng = np.random.default_rng(0)
    for _ in range(3):
        b = rng.normal(size=(3, 3))
        p = b @ b.T + np.diag(rng.uniform(0, 1, 3))
        a = simplex_qp(p)
        assert a.min() >= 0 and a.sum() == pytest.approx(1.0)
        assert a @ p @ a <= brute_force_simplex_min(p) + 1e-9
    # two clients: a_1 = (P22 − P12) / (P11 + P22 − 2 P12), clipped to [0, 1]
    p = np.array([[2.0, 0.5], [0.5, 1.0]])
    a1 = (1.0 - 0.5) / (2.0 + 1.0 - 1.0)
    np.testing.assert_allclose(simplex_qp(p), [a1, 1 - a1], atol=1e-6)
    np.testing.assert_allclose(
        simplex_qp(np.array([[1.0, 3.0], [3.0, 10.0]])), [1.0, 0.0], atol=1e-6
    )


def test_fedpac_weights_are_inverse_variance_when_statistics_agree():
    v = np.array([1.0, 2.0, 4.0])
    h = np.ones((3, 6))  # equal h_j: the bias term vanishes, α_j ∝ 1 / V_j
    want = (1 / v) / (1 / v).sum()
    np.testing.assert_allclose(classifier_weights(v, h, 0), want, atol=1e-6)
    # a far-away client gets no weight; the own client always keeps some
    h2 = np.array([[0.0, 0.0], [0.1, 0.0], [50.0, 50.0]])
    a = classifier_weights(np.array([0.5, 0.5, 0.5]), h2, 0)
    assert a[2] == 0.0 and a[0] > 0 and a.sum() == pytest.approx(1.0)


def test_alignment_loss_by_hand():
    z = torch.tensor([[1.0, 2.0], [0.0, 0.0], [9.0, 9.0]])
    targets = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 1])
    w = torch.tensor([1.0, 1.0, 0.0])  # third slot is padding
    # ((1² + 2²) + (1² + 1²)) / (2 samples · 2 dims)
    torch.testing.assert_close(alignment_loss(z, y, w, targets), torch.tensor(7.0 / 4))


def test_fedpac_round_by_hand():
    exp, _ = experiment("fedpac", rounds=1)
    alg, ctx = exp.algorithm, exp.ctx
    server = exp.runner.server
    ids = torch.tensor([1, 2, 5])
    cohort = ctx.cohort(ids, 1)
    out = alg.client_update(alg.configure(server, cohort), {}, cohort)
    counts = torch.stack([torch.bincount(ctx.data.train.client(i)[1], minlength=3) for i in ids])
    torch.testing.assert_close(out.upload["centroid_count"], counts.float())
    info = RoundInfo(ids, out.num_examples, 1)
    new = alg.aggregate(server, out.upload, info)
    want = out.upload["centroid_sum"].sum(0) / counts.sum(0).unsqueeze(1)
    torch.testing.assert_close(new["centroids"], want)
    alpha = torch.tensor(np.array(info.log["alpha"]), dtype=torch.float32)
    assert torch.allclose(alpha.sum(1), torch.ones(3))
    combined = torch.einsum("ij,jkl->ikl", alpha, out.upload["heads"]["head.weight"])
    torch.testing.assert_close(new["heads"]["head.weight"][ids], combined)
    untouched = [i for i in range(ctx.data.num_clients) if i not in ids.tolist()]
    torch.testing.assert_close(
        new["heads"]["head.weight"][untouched], server["heads"]["head.weight"][untouched]
    )
    # extractor: n_i-weighted mean of the uploads
    k = "extractor.fc1.weight"
    w = out.num_examples / out.num_examples.sum()
    torch.testing.assert_close(new["p"][k], (out.upload["p"][k] * w.view(-1, 1, 1)).sum(0))


# ---------------------------------------------------------------- DRFA
def test_project_simplex_by_hand():
    torch.testing.assert_close(
        project_simplex(torch.tensor([1.0, 0.5, -1.0])), torch.tensor([0.75, 0.25, 0.0])
    )
    torch.testing.assert_close(project_simplex(torch.tensor([2.0, 0.0])), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(project_simplex(torch.tensor([0.2, 0.8])), torch.tensor([0.2, 0.8]))


def test_drfa_lambda_step_by_hand():
    lam = torch.tensor([0.5, 0.5], dtype=torch.float64)
    # v = [N/|U|·1, 0] = [2, 0]; λ + γτv = [0.9, 0.5]; projection: θ = 0.2 → [0.7, 0.3]
    out = drfa_lambda_step(lam, torch.tensor([0]), torch.tensor([1.0]), gamma=0.1, tau=2)
    torch.testing.assert_close(out, torch.tensor([0.7, 0.3], dtype=torch.float64))
    floored = drfa_lambda_step(lam, torch.tensor([0]), torch.tensor([10.0]), gamma=1.0, tau=1)
    assert floored.min() > 0 and floored.sum().item() == pytest.approx(1.0)


def test_drfa_gamma_zero_keeps_sample_weights():
    _, res = experiment("drfa", algorithm_options={"gamma": 0.0})
    sizes = toy_data().train.sizes().double()
    torch.testing.assert_close(res.server["lambda"], sizes / sizes.sum())
    _, res2 = experiment("drfa")
    assert res2.server["lambda"].sum().item() == pytest.approx(1.0)
    assert not torch.allclose(res2.server["lambda"], sizes / sizes.sum())


def test_drfa_checkpoint_names_are_the_flat_names_of_before():
    """DRFA's state is nested (``{"p", "b", "snap": {"p", "b"}, …}``); a checkpoint stores
    it flattened under exactly the names the flat state of older versions had (written out
    here), so their checkpoints load, and the names load back into the nested state."""
    data = toy_data(dim=16)
    bn = dict(model="dfl-cnn", model_options={"channels": [2], "feature_dim": 4})
    cfg = make_config(algorithm="drfa", scenario=data.name, **{**SETTINGS, "rounds": 1, **bn})
    exp = build_experiment(cfg, data=data)
    saved = exp.runner.state_dict(exp.runner.run(), 1)
    params, buffers = exp.ctx.initial_params, exp.ctx.initial_buffers
    model = [f"p/{k}" for k in params] + [f"b/{k}" for k in buffers]
    assert buffers and list(saved["server"]) == [
        *model,
        *(f"snap/{k}" for k in model),
        "lambda",
        "has_snap",
    ]
    exp.runner.load_state_dict(saved)
    server = exp.runner.server
    assert list(server) == ["p", "b", "snap", "lambda", "has_snap"]
    assert list(server["snap"]) == ["p", "b"] and list(server["snap"]["b"]) == list(buffers)


# ---------------------------------------------------------------- FedSR
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
    exp, _ = experiment("fedsr", rounds=1)
    alg, ctx = exp.algorithm, exp.ctx
    params, buffers = split_state(exp.runner.server)
    x = ctx.data.train.x[:5]
    mu, _ = alg.distribution(params, buffers, x)
    want = classify(ctx, {k: v for k, v in params.items() if k.startswith("head.")}, mu)
    pred = alg.predictor(exp.runner.server, {}, ctx.cohort(torch.arange(2), 0))
    torch.testing.assert_close(
        ctx.forward(pred.params, pred.buffers, x), want, rtol=1e-5, atol=1e-5
    )


# ---------------------------------------------------------------- FedIIR
def test_classifier_gradient_by_hand():
    exp, _ = experiment("fediir", rounds=0)
    ctx = exp.ctx
    head = {k: v for k, v in ctx.initial_params.items() if k.startswith("head.")}
    z = torch.randn(4, ctx.model.feature_dim, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 2, 1, 1])
    g = classifier_gradient(ctx, head, z, y, torch.ones(4))
    err = torch.softmax(z @ head["head.weight"].T + head["head.bias"], 1) - F.one_hot(y, 3)
    torch.testing.assert_close(g["head.weight"], err.T @ z / 4)
    torch.testing.assert_close(g["head.bias"], err.mean(0))


def test_fediir_zero_penalty_is_fedavg():
    _, a = experiment("fediir", algorithm_options={"penalty": 0.0})
    _, b = experiment("fedavg")
    for k, v in b.server.items():
        torch.testing.assert_close(a.server[k], v)
    assert a.server["has_gbar"].item() == 1.0
