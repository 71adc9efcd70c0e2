"""Feature alignment pieces (src/fedshift/algorithms/common/alignment.py) by hand."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import baseline_experiment as experiment

from fedshift.algorithms.common.alignment import alignment_loss, classifier_gradient


def test_alignment_loss_by_hand():
    z = torch.tensor([[1.0, 2.0], [0.0, 0.0], [9.0, 9.0]])
    targets = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 1])
    w = torch.tensor([1.0, 1.0, 0.0])  # third slot is padding
    # ((1² + 2²) + (1² + 1²)) / (2 samples · 2 dims)
    torch.testing.assert_close(alignment_loss(z, y, w, targets), torch.tensor(7.0 / 4))


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
