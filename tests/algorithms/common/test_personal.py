"""The L2-personalization loss (src/fedshift/algorithms/common/personal.py), seen through
Ditto: its gradient is the risk's plus the λ pull."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import baseline_experiment as experiment
from torch.func import grad

from fedshift.algorithms.common.losses import squared_distance


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
