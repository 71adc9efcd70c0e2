"""FedIIR — Guo, Guo, Cao, Wu, Chang, "Out-of-Distribution Generalization of Federated
Learning via Implicit Invariant Relationships", ICML 2023.

Objective: min_{Φ,ω} Σ_i R_i(ω∘Φ) + γ·Σ_i ‖∇_ω R_i(ω∘Φ) − ḡ‖², ḡ = mean_i ∇_ω R_i (eq. 7):
clients whose classifier gradients agree share an invariant relationship between the
features and the label. Each client trains with the penalty on its minibatch classifier
gradient (double back-prop) against the server's ḡ; the model is averaged as in FedAvg.
Defaults γ = 1e-3 and EMA momentum 0.95 for ḡ (the FedIIR settings as released in FL-bench;
the authors' code was not published). Choices: each client measures ∇_ω R_i at the model
it received, on all its training data, and uploads it with its model; the server sets
ḡ ← 0.95·ḡ + 0.05·(n-weighted mean), starting from the first mean, and sends ḡ next
round (one exchange per round, so ḡ lags one round); round 0 trains without the penalty.
γ = 0 → FedAvg (tested). For an MLP the objective's gradient is written out (the penalty's
second-order term through the softmax in closed form; tested against autograd's double
back-prop).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import (
    Tree,
    cross_entropy_gradient,
    gradient_by,
    linear,
    linear_grads,
    loss_scale,
    select,
    weighted_mean,
)
from ..options import opt, require
from .base import ClientResult, Payload, RoundInfo, register_algorithm
from .common.alignment import classifier_gradient, gradient_alignment_penalty
from .common.global_model import model_state, split_state
from .common.local_stats import client_sums
from .common.losses import cross_entropy
from .common.split import classify, features, is_head
from .fedavg import FedAvg


@dataclass(frozen=True)
class FedIIRHyper:
    penalty: float = opt(1e-3, "weight γ of the classifier-gradient alignment penalty (0 → FedAvg)")
    ema: float = opt(0.95, "momentum of the server's moving average ḡ of classifier gradients")

    def __post_init__(self) -> None:
        require(self.penalty >= 0, f"algorithm.penalty must be >= 0, got {self.penalty}")
        require(0 <= self.ema < 1, f"algorithm.ema must be in [0, 1), got {self.ema}")


@register_algorithm("fediir")
class FedIIR(FedAvg):
    Hyper = FedIIRHyper

    def init(self) -> Tree:
        head = select(self.ctx.initial_params, is_head)
        zeros = {k: torch.zeros_like(v) for k, v in head.items()}
        return {**super().init(), "gbar": zeros, "has_gbar": torch.zeros(())}

    def loss_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``loss`` and its gradient for an MLP. With s_b = w_b / Σw, p = softmax(ω(z)) and
        δ = s·(p − onehot) (so G = δᵀz, Σ_b δ_b is ∇_ω R), E = G − ḡ, the penalty ‖E‖²
        has ∂/∂z = 2δE_W and ∂/∂logits_b = s_b(p_b ⊙ M_b − p_b(p_b·M_b)) with
        M_b = 2(E_W z_b + e_b) (the softmax's Jacobian), then the usual chain to ω and z.
        Written for the whole cohort at once (a leading client axis on every tensor, the
        shared ḡ and weight given one by the engine): no ``vmap`` per step."""
        ext = self.extractor()
        z, cache = ext.forward(params, x)
        head_w, head_b = params["head.weight"], params["head.bias"]
        risk, delta, logp = cross_entropy_gradient(linear(z, head_w, head_b), y, w)
        p, scale = logp.exp(), loss_scale(w)
        gbar, weight = extras["gbar"], extras["weight"]
        g_w, g_b = linear_grads(delta, z)  # ∇_ω R
        e_w, e_b = g_w - gbar["head.weight"], g_b - gbar["head.bias"]
        penalty = (e_w**2).sum((-2, -1)) + (e_b**2).sum(-1)  # [C]
        m = 2 * linear(z, e_w, e_b)  # [C, B, K]
        jac = scale[..., None] * (p * m - p * (p * m).sum(-1, keepdim=True))
        per_row = weight[..., None, None]  # [C, 1, 1]
        d_logits = delta + per_row * jac
        d_z = d_logits @ head_w + per_row * 2 * (delta @ e_w)
        grads = ext.backward(params, cache, d_z)
        grads["head.weight"], grads["head.bias"] = linear_grads(d_logits, z)
        return grads, risk + weight * penalty

    @gradient_by(loss_gradient, when=lambda self: self.extractor() is not None, batched=True)
    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        z = features(self.ctx, params, buffers, x)
        head = select(params, is_head)
        risk = cross_entropy(classify(self.ctx, head, z), y, w)
        g = classifier_gradient(self.ctx, head, z, y, w)
        penalty = gradient_alignment_penalty(g, extras["gbar"])
        return risk + extras["weight"] * penalty

    def gradient_sum(self, per_client: Tree, model: Tree, x, y, mask) -> Tree:
        """∇_ω of the summed loss of one chunk (the chunk mean's gradient × its size)."""
        params, buffers = split_state(model)
        z = features(self.ctx, params, buffers, x)
        g = classifier_gradient(self.ctx, select(params, is_head), z, y, mask)
        return {k: v * mask.sum() for k, v in g.items()}

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, _ = self.start_from_broadcast(payload, len(cohort))
        received = {k: v for k, v in payload.broadcast.items() if k in ("p", "b")}
        sums = client_sums(self.ctx, self.gradient_sum, cohort, {}, received)
        n = cohort.num_examples.to(self.ctx.device).clamp(min=1.0)
        grads = {k: v / n.view(-1, *([1] * (v.dim() - 1))) for k, v in sums.items()}
        weight = payload.broadcast["has_gbar"] * self.hp.penalty
        shared = {"gbar": payload.broadcast["gbar"], "weight": weight}
        out = self.ctx.train(self.loss, params, buffers, cohort, shared=shared)
        upload = {**model_state(out.params, out.buffers), "grad": grads}
        return ClientResult(upload, {}, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        model = {k: v for k, v in uploads.items() if k in ("p", "b")}
        new = weighted_mean(model, info.num_examples)
        mean = weighted_mean(uploads["grad"], info.num_examples)
        first = not bool(server["has_gbar"])
        gbar = {}
        for k, g in mean.items():  # ḡ ← ema·ḡ + (1 − ema)·mean, from the first mean
            old = server["gbar"][k]
            gbar[k] = g if first else self.hp.ema * old + (1 - self.hp.ema) * g
        return {**new, "gbar": gbar, "has_gbar": torch.ones(())}
