"""FedRoD (src/fedshift/algorithms/fedrod.py): the balanced softmax by hand, the personal
term's gradients and the summed logits."""

from __future__ import annotations

import torch
from helpers import baseline_experiment as experiment
from torch.func import grad

from fedshift.algorithms.common.global_model import split_state
from fedshift.algorithms.common.split import classify, features
from fedshift.algorithms.fedrod import balanced_softmax


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
