"""UCFL (src/fedshift/algorithms/ucfl.py): eq. (9)'s weights, the gradient statistics, the
silhouette choice and the homogeneous-users reduction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import SEED_SETTINGS as SETTINGS
from helpers import seed_experiment as experiment
from helpers import seed_run as run
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.ucfl import collaboration_weights


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


def test_ucfl_stat_batch_zero_is_a_third_of_each_users_data():
    """§V-F's n_k = N/3 (the covariate and concept-shift presets): three minibatches per
    user, so every user gets a spread to measure; a batch above n_i gives none."""
    _, thirds = experiment("ucfl", stat_batch=0).algorithm.gradient_statistics()
    _, whole = experiment("ucfl", stat_batch=10**6).algorithm.gradient_statistics()
    assert (thirds > 0).all()
    assert (whole == 0).all()


def test_ucfl_presets_use_the_papers_variance_minibatch():
    from fedshift.tables import load_table

    for table_id, n_k in [
        ("ucfl-label-shift", 100),
        ("ucfl-label-covariate", 0),
        ("ucfl-concept-shift", 0),
    ]:
        table = load_table(table_id)
        for method in (m for m in table.methods if m.algorithm == "ucfl"):
            assert method.options.get("stat_batch", 100) == n_k, (table_id, method.name)


def test_ucfl_silhouette_picks_two_clear_groups():
    exp = experiment("ucfl")
    pts = np.concatenate([np.zeros((4, 3)), np.ones((3, 3))]) + 0.01 * np.arange(21).reshape(7, 3)
    sil = torch.full((8,), -2.0, dtype=torch.float64)
    assert exp.algorithm.choose_streams(pts, sil) == 2
    assert sil[2] > 0.9 and -1 <= sil[6] <= 1


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
