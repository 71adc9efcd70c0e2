"""Invariance penalties and weights (src/fedshift/algorithms/common/invariance.py): IRMv1,
its annealing, GroupDRO's weight step, the gradient-alignment penalty."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedshift.algorithms.common.invariance import (
    gradient_alignment_penalty,
    irm_weight,
    irmv1_penalty,
)


def test_irmv1_penalty_matches_hand_computation():
    # binary logistic model as 2-class logits [0, z]: d/ds CE(s·z) at s=1 = mean((σ(z) − y)·z)
    z = torch.tensor([1.0, -2.0, 0.5])
    y = torch.tensor([1, 0, 0])
    logits = torch.stack([torch.zeros(3), z], 1)
    hand = (((torch.sigmoid(z) - y.float()) * z).mean()) ** 2
    torch.testing.assert_close(irmv1_penalty(logits, y, torch.ones(3)), hand)
    # empty slots (w = 0) are ignored
    w = torch.tensor([1.0, 1.0, 0.0])
    hand2 = (((torch.sigmoid(z) - y.float()) * z)[:2].mean()) ** 2
    torch.testing.assert_close(irmv1_penalty(logits, y, w), hand2)


def test_irmv1_penalty_gradcheck():
    y = torch.tensor([0, 1, 2, 1])
    logits = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.ones(4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda z: irmv1_penalty(z, y, w), (logits,))
    assert F.cross_entropy(logits, y).dtype == torch.float64


def test_irm_weight_anneals():
    assert irm_weight(torch.tensor(2.0), 3, 1e4).item() == 1.0
    assert irm_weight(torch.tensor(3.0), 3, 1e4).item() == 1e4


def test_groupdro_weight_step_by_hand():
    from fedshift.algorithms.common.invariance import groupdro_weights

    q = torch.tensor([0.25, 0.25, 0.5])
    out = groupdro_weights(q, torch.tensor([0, 2]), torch.tensor([1.0, 2.0]), 0.5)
    raw = torch.tensor([0.25 * torch.e**0.5, 0.25, 0.5 * torch.e])
    torch.testing.assert_close(out, raw / raw.sum())


def test_groupdro_weight_step_stays_finite_at_large_step_sizes():
    """exp(η_q·ℓ) overflows float32 past 88: the step must give the max-loss limit, not NaN
    (η_q = 1000 with losses near 0.3 made a whole rcfmnist run diverge in round 1)."""
    from fedshift.algorithms.common.invariance import groupdro_weights

    q = torch.full((4,), 0.25)
    out = groupdro_weights(q, torch.tensor([0, 1, 3]), torch.tensor([0.30, 0.34, 0.31]), 1000.0)
    assert torch.isfinite(out).all() and out.sum().item() == pytest.approx(1.0)
    assert out.argmax().item() == 1 and out[1].item() > 0.999


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
