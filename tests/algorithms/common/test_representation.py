"""Representation losses of the invariant personalized methods
(src/fedshift/algorithms/common/representation.py), against hand-computed values."""

from __future__ import annotations

import math

import torch

from fedshift.algorithms.common.representation import (
    conditional_correlation_l1,
    conditional_cross_moment_l1,
    contrastive_loss,
    environment_disagreement,
    feature_variance,
)

D = torch.float64


def test_feature_variance_by_hand():
    z = torch.tensor([[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]])
    w = torch.tensor([1.0, 1.0, 0.0])  # third row is an empty slot
    # per-dimension population variances over the two real rows: 1 and 4 → mean 2.5
    assert feature_variance(z, w).item() == 2.5


def test_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    pos = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    neg = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    tau = 0.5
    s = 1 / math.sqrt(2)
    # anchor 0: s(z0,pos0)=1/√2, negatives s=0 and −1; anchor 1: s=1, negatives 1 and 0
    l0 = -math.log(math.exp(s / tau) / (math.exp(s / tau) + math.exp(0) + math.exp(-1 / tau)))
    l1 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(1 / tau) + math.exp(0)))
    got = contrastive_loss(z, pos, neg, tau, torch.ones(2))
    assert abs(got.item() - (l0 + l1) / 2) < 1e-6
    # an empty slot is neither an anchor nor a negative
    z3, p3 = torch.cat([z, z[:1]]), torch.cat([pos, pos[:1]])
    n3 = torch.cat([neg, torch.tensor([[1.0, 0.0]])])
    got3 = contrastive_loss(z3, p3, n3, tau, torch.tensor([1.0, 1.0, 0.0]))
    assert abs(got3.item() - got.item()) < 1e-6


def test_conditional_cross_moment_by_hand():
    phi = torch.tensor([[1.0], [2.0], [3.0]])
    psi = torch.tensor([[1.0, 0.0], [3.0, 1.0], [5.0, 2.0]])
    y = torch.tensor([0, 0, 1])
    # class means of Ψ: y=0 → (2, 0.5), y=1 → (5, 2); centred: (−1,−.5), (1,.5), (0,0)
    # (1/3) Σ φ ⊗ centred = (1/3)·[(−1+2), (−.5+1)] = [1/3, 1/6] → L1 = 0.5
    got = conditional_cross_moment_l1(phi, psi, y, torch.ones(3), classes=2)
    assert abs(got.item() - 0.5) < 1e-6
    # Ψ constant within each class (a pure label function) carries nothing beyond Y
    flat = torch.tensor([[2.0, 0.0], [2.0, 0.0], [7.0, 1.0]])
    assert conditional_cross_moment_l1(phi, flat, y, torch.ones(3), 2).item() == 0.0


def test_conditional_correlation_by_hand():
    phi = torch.tensor([[1.0], [3.0], [0.0], [4.0]], dtype=D)
    psi = torch.tensor([[2.0, 1.0], [4.0, 1.0], [1.0, 0.0], [-1.0, 2.0]], dtype=D)
    y = torch.tensor([0, 0, 1, 1])
    # within-class deviations: φ (−1, 1, −2, 2); ψ₀ (−1, 1, 1, −1); ψ₁ (0, 0, −1, 1)
    # cov(φ, ψ₀) = (1 + 1 − 2 − 2)/4 = −0.5, var φ = 10/4, var ψ₀ = 1 → ρ = −0.5/√2.5
    # cov(φ, ψ₁) = (2 + 2)/4 = 1, var ψ₁ = 2/4 → ρ = 1/√(2.5·0.5) = 1/√1.25
    want = (0.5 / math.sqrt(2.5) + 1 / math.sqrt(1.25)) / 2
    got = conditional_correlation_l1(phi, psi, y, torch.ones(4, dtype=D), 2, eps=0.0)
    assert abs(got.item() - want) < 1e-9
    # scale-free: rescaling Φ leaves it unchanged (the cross-moment would shrink 100-fold)
    small = conditional_correlation_l1(phi / 100, psi, y, torch.ones(4, dtype=D), 2, eps=0.0)
    assert abs(small.item() - want) < 1e-9
    # a constant feature has no within-class variance and contributes nothing
    const = torch.ones(4, 1, dtype=D)
    assert conditional_correlation_l1(const, psi, y, torch.ones(4, dtype=D), 2).item() == 0.0


def test_environment_disagreement_by_hand():
    logits = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]])  # E=2, B=1, K=2
    # ½ Σ_{e,e'} ‖Δ‖² over both orderings = ½(5 + 5)
    assert environment_disagreement(logits, torch.ones(1)).item() == 5.0
    three = torch.zeros(3, 2, 2)
    three[2] = 1.0  # third classifier differs by (1,1) from the two others
    assert environment_disagreement(three, torch.ones(2)).item() == 4.0


def test_gradcheck_representation_losses():
    g = torch.Generator().manual_seed(0)
    z, p, n = (torch.randn(4, 3, dtype=D, generator=g, requires_grad=True) for _ in range(3))
    w = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=D)
    y = torch.tensor([0, 1, 0, 1])
    assert torch.autograd.gradcheck(lambda a, b, c: contrastive_loss(a, b, c, 0.3, w), (z, p, n))
    assert torch.autograd.gradcheck(lambda a: feature_variance(a, w), (z,))
    assert torch.autograd.gradcheck(lambda a, b: conditional_cross_moment_l1(a, b, y, w, 2), (z, p))
    assert torch.autograd.gradcheck(lambda a, b: conditional_correlation_l1(a, b, y, w, 2), (z, p))
    logits = torch.randn(3, 4, 2, dtype=D, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: environment_disagreement(a, w), (logits,))
