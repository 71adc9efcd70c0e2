"""Jensen–Shannon mutual-information estimator of Deep InfoMax (Hjelm et al., ICLR 2019;
the f-GAN bound of Nowozin et al. 2016), used by DFL (Luo et al., ICML 2022, eq. 5).

Î_JSD(A; B) = E_{P_AB}[−sp(−T(a, b))] − E_{P_A P_B}[sp(T(a, b'))], sp = softplus, T a critic
network. Its supremum over T is 2·JSD(P_AB ‖ P_A P_B) − 2 log 2. Samples of the product of
marginals pair a_i with b_{i+1} (the batch rolled by one): deterministic, so it runs under vmap.
The critic is a one-hidden-layer MLP on [a, b], held as a flat tensor mapping.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def init_critic(in_dim: int, hidden: int, generator: torch.Generator) -> dict[str, Tensor]:
    """A critic T: R^in_dim → R (PyTorch's default Linear initialisation, seeded)."""

    def uniform(shape, fan_in):
        bound = 1.0 / math.sqrt(fan_in)
        return (torch.rand(shape, generator=generator) * 2 - 1) * bound

    return {
        "w1": uniform((hidden, in_dim), in_dim),
        "b1": uniform((hidden,), in_dim),
        "w2": uniform((1, hidden), hidden),
        "b2": uniform((1,), hidden),
    }


def critic_score(critic: dict[str, Tensor], a: Tensor, b: Tensor) -> Tensor:
    """T(a, b) for paired rows of ``a`` [M, da] and ``b`` [M, db] → [M]."""
    h = F.relu(F.linear(torch.cat([a, b], -1), critic["w1"], critic["b1"]))
    return F.linear(h, critic["w2"], critic["b2"]).squeeze(-1)


def jsd_bound(positive: Tensor, negative: Tensor, w_pos: Tensor, w_neg: Tensor) -> Tensor:
    """E_P[−sp(−T)] − E_Q[sp(T)] from critic scores of joint (positive) and product-of-
    marginals (negative) samples, each averaged with its sample weights."""
    pos = (-F.softplus(-positive) * w_pos).sum() / w_pos.sum().clamp(min=1e-12)
    neg = (F.softplus(negative) * w_neg).sum() / w_neg.sum().clamp(min=1e-12)
    return pos - neg


def jsd_mi(critic: dict[str, Tensor], a: Tensor, b: Tensor, w: Tensor) -> Tensor:
    """Î_JSD(A; B) on a minibatch of pairs (a_i, b_i) with sample weights ``w`` [M]."""
    b_shuffled = torch.roll(b, 1, 0)
    w_neg = w * torch.roll(w, 1, 0)
    return jsd_bound(critic_score(critic, a, b), critic_score(critic, a, b_shuffled), w, w_neg)
