"""Invariance terms shared by the OOD baselines (IRM†, GroupDRO†, …) and later methods
(PerInvFL). Each acts on ONE client's tensors; the trainer vmaps them over the cohort."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import grad

from .losses import cross_entropy


def irmv1_penalty(logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """IRMv1 penalty of Arjovsky et al. (2019, eq. 3): ‖∇_{s=1} R(s·f)‖², with a dummy scalar
    classifier s multiplying the logits; differentiable again (double back-prop)."""
    scale = torch.ones((), dtype=logits.dtype, device=logits.device)
    g = grad(lambda s: cross_entropy(s * logits, y, w))(scale)
    return g**2


def irm_weight(round_: Tensor, anneal_rounds: int, lambda_: float) -> Tensor:
    """Penalty weight of the IRM reference code: 1 for the first ``anneal_rounds``, then λ."""
    return torch.where(round_ < anneal_rounds, round_.new_ones(()), round_.new_full((), lambda_))


def groupdro_weights(q: Tensor, ids: Tensor, losses: Tensor, eta_q: float) -> Tensor:
    """GroupDRO's online weight step (Sagawa et al. 2020, Algorithm 1): q_g ← q_g·exp(η_q·ℓ_g)
    for the groups ``ids`` seen this round, then q normalised over all groups.

    Taken in log space (a softmax of log q + η_q·ℓ), the same weights without exp's overflow:
    a large η_q gives the max-loss limit, not NaN (float32 exp overflows past η_q·ℓ ≈ 88)."""
    logits = q.log()
    logits[ids] = logits[ids] + eta_q * losses.to(logits.dtype)
    return torch.softmax(logits, dim=0)


def gradient_alignment_penalty(risk_fn, params: dict[str, Tensor], *args) -> tuple[Tensor, Tensor]:
    """FedIPG's invariance penalty (eq. 8): (⟨∇R(w), w⟩)² over all parameters w, and R(w).

    ``risk_fn(params, *args) -> scalar``; the inner gradient is taken with
    ``torch.func.grad`` so the penalty is differentiable again (double back-prop); R(w) is
    evaluated once and returned. Tensors the risk updates in place (BatchNorm running
    statistics) must come in ``args``, not be captured by ``risk_fn``.
    """

    def risk_aux(p, *a):
        r = risk_fn(p, *a)
        return r, r

    g, risk = grad(risk_aux, has_aux=True)(params, *args)
    inner = sum((g[k] * params[k]).sum() for k in params)
    return inner**2, risk
