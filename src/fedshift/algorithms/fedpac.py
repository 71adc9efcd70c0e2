"""FedPAC — Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration", ICLR 2023.

Client i (Algorithm 1): with the received global extractor θ, first ``head_epochs`` epochs
on its head φ_i alone (CE), then the run's local epochs on θ alone with
  CE + λ·(1/(B·d)) Σ_b ‖θ(x_b) − c_{y_b}‖²  (eq. 5; c_k the global centroid of class k).
It uploads θ_i, φ_i, its class centroids (after training) and, measured with the received
θ, the statistics h_i = (p_ik μ_ik)_k and V_i = (Σ_k p_ik E‖z‖²_k − Σ_k p_ik²‖μ_ik‖²)/n_i.
Server: θ ← Σ n_i θ_i / n; c_k ← sample-weighted mean of the local centroids; for every
participant i the classifier weights (eq. 8–10)
  α_i = argmin_{α ∈ Δ} Σ_j α_j² V_j + ‖Σ_j α_j (h_i − h_j)‖²_F
(a convex QP on the simplex, solved with SciPy: common/simplex.py) and φ̂_i = Σ_j α_ij φ_j,
which client i keeps as its head. Defaults: λ = 1, 1 head epoch (the authors' settings).
Choices: weights below 1e-3 are zeroed and the rest renormalised (the authors zero them);
as in the authors' code (``methods/fedpac.py``, ``local_training``: ``if round > 0``) the
alignment term is off in round 0, when no global centroid exists yet, and from round 1 on
a class without a global centroid is aligned to the client's own centroid measured with
the received θ;
the heads φ̂_i live in server state (``heads``, row i = client i's head; the server state is
``{"p": θ, "b": buffers, "heads": φ̂, "centroids": c, "has_centroid": …}``), since the
server computes them after the uploads; a client that never took part keeps the initial head.
For an MLP both local objectives' gradients are written out for the cohort (no autograd,
no vmap; tested against autograd).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..engine.contract import Tree, gradient_by, loss_scale, select, stack, weighted_mean
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.alignment import alignment_loss, class_feature_sums
from .common.global_model import model_state
from .common.local_stats import client_sums
from .common.losses import cross_entropy
from .common.representation import rows_by_label
from .common.simplex import simplex_qp
from .common.split import classify, features, is_extractor, is_head

EPS = 1e-3  # classifier weights below this are dropped (authors' threshold)


def representation(state: Tree) -> tuple[Tree, Tree]:
    """θ's parameters and buffers in ``state``; θ may have none (mlr: Φ = identity), and an
    empty part is neither sent nor saved."""
    return state.get("p", {}), state.get("b", {})


def classifier_weights(v: np.ndarray, h: np.ndarray, i: int) -> np.ndarray:
    """α_i of eq. 10 for participant i: v [m] variances, h [m, K·d] statistics."""
    delta = h[i][None, :] - h  # rows h_i − h_j
    alpha = simplex_qp(np.diag(v) + delta @ delta.T)
    alpha = np.where(alpha < EPS, 0.0, alpha)
    return alpha / alpha.sum()


@dataclass(frozen=True)
class FedPACHyper:
    lambda_: float = opt(1.0, "weight λ of the feature-alignment term (0 → no alignment)")
    head_epochs: int = opt(1, "local epochs on the head before the extractor's epochs")

    def __post_init__(self) -> None:
        require(self.lambda_ >= 0, f"algorithm.lambda_ must be >= 0, got {self.lambda_}")
        require(self.head_epochs >= 0, "algorithm.head_epochs must be >= 0")


@register_algorithm("fedpac")
class FedPAC(Algorithm):
    Hyper = FedPACHyper
    personalized = True

    def init(self) -> Tree:
        ctx, n = self.ctx, self.ctx.data.num_clients
        k, d = ctx.data.num_classes, ctx.model.feature_dim
        heads = stack(select(ctx.initial_params, is_head), n)
        rep = model_state(select(ctx.initial_params, is_extractor), ctx.initial_buffers)
        centroids = {"centroids": torch.zeros(k, d), "has_centroid": torch.zeros(k)}
        centroids = {name: v.to(ctx.device) for name, v in centroids.items()}
        return {**rep, "heads": heads, **centroids}

    def configure(self, server: Tree, cohort) -> Payload:
        shared = {k: v for k, v in server.items() if k != "heads"}
        heads = {k: v[cohort.ids] for k, v in server["heads"].items()}
        return Payload(broadcast=shared, per_client=heads)

    def ce_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``ce`` and its gradient, the MLP's written risk for the whole cohort at once."""
        return self.risk_gradient()(params, x, y, w)

    @gradient_by(ce_gradient, when=lambda self: self.has_risk_gradient(), batched=True)
    def ce(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        return cross_entropy(self.ctx.forward(params, buffers, x), y, w)

    def aligned_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``aligned`` and its gradient for an MLP, the whole cohort at once (tensors
        [C, …]): the risk's δ through the head to Φ(x), plus λ·a·2(Φ(x) − c_y)·w_b/(Σw·D)
        from the alignment's mean square."""
        z, cache, risk, delta = self.head_risk(params, x, y, w)  # z: [C, B, D]
        gap = z - rows_by_label(extras["targets"], y)  # Φ(x) − c_y
        scale = loss_scale(w) / z.shape[-1]  # [C, B]: the mean over samples and dimensions
        weight = self.hp.lambda_ * extras["align"]  # [C]
        align = ((gap**2).sum(-1) * scale).sum(-1)
        d_z = (2 * weight[:, None, None] * scale[..., None]) * gap
        return self.head_risk_backward(params, cache, z, delta, d_z), risk + weight * align

    @gradient_by(aligned_gradient, when=lambda self: self.extractor() is not None, batched=True)
    def aligned(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        z = features(self.ctx, params, buffers, x)
        risk = cross_entropy(classify(self.ctx, select(params, is_head), z), y, w)
        align = alignment_loss(z, y, w, extras["targets"])
        return risk + self.hp.lambda_ * extras["align"] * align  # align = 0 in round 0

    def stats(self, model: Tree, shared: Tree, x, y, mask) -> Tree:
        return class_feature_sums(self.ctx, {**shared, **model}, x, y, mask)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        ctx, n = self.ctx, len(cohort)
        rep, buffers = representation(payload.broadcast)
        before = client_sums(ctx, self.stats, cohort, {}, model_state(rep, buffers))
        cnt = before["count"].clamp(min=1.0)  # [C, K]
        mu = before["sum"] / cnt.unsqueeze(-1)  # local centroids with the received θ
        p = before["count"] / before["count"].sum(1, keepdim=True).clamp(min=1.0)
        h = p.unsqueeze(-1) * mu
        v = (
            (p * before["sq"] / cnt).sum(1) - (p**2 * (mu**2).sum(-1)).sum(1)
        ) / cohort.num_examples.to(ctx.device).clamp(min=1.0)
        has = payload.broadcast["has_centroid"].bool()[None, :, None]
        targets = torch.where(has, payload.broadcast["centroids"][None], mu)
        params, bufs = {**stack(rep, n), **payload.per_client}, stack(buffers, n)
        if self.hp.head_epochs > 0:  # classifier first, representation fixed
            out = ctx.train(
                self.ce, params, bufs, cohort, "head", epochs=self.hp.head_epochs, trainable=is_head
            )
            params, bufs = out.params, out.buffers
        out = ctx.train(
            self.aligned,
            params,
            bufs,
            cohort,
            trainable=is_extractor,
            per_client={
                "targets": targets,
                "align": torch.full((n,), float(cohort.round > 0), device=ctx.device),
            },
        )
        after = client_sums(ctx, self.stats, cohort, model_state(out.params, out.buffers))
        upload = {
            **model_state(select(out.params, is_extractor), out.buffers),
            "heads": select(out.params, is_head),
            "centroid_sum": after["sum"],
            "centroid_count": after["count"],
            "v": v,
            "h": h.flatten(1),
        }
        return ClientResult(upload, {}, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        model = {k: v for k, v in uploads.items() if k in ("p", "b")}
        new = {**server, **weighted_mean(model, info.num_examples)}
        count = uploads["centroid_count"].sum(0)
        new["centroids"] = uploads["centroid_sum"].sum(0) / count.clamp(min=1.0).unsqueeze(1)
        new["has_centroid"] = (count > 0).float()
        v, h = uploads["v"].double().cpu().numpy(), uploads["h"].double().cpu().numpy()
        alpha = np.stack([classifier_weights(v, h, i) for i in range(len(v))])  # [m, m]
        a = torch.as_tensor(alpha, dtype=torch.float32)
        new["heads"] = dict(server["heads"])  # the server's own dict stays as it was
        for k, heads in uploads["heads"].items():  # φ̂_i = Σ_j α_ij φ_j
            combined = torch.einsum("ij,j...->i...", a.to(heads.device), heads)
            new["heads"][k] = server["heads"][k].clone()
            new["heads"][k][info.ids.to(heads.device)] = combined
        info.log["alpha"] = alpha
        return new

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        rep, buffers = representation(server)
        heads = {k: v[cohort.ids] for k, v in server["heads"].items()}
        n = len(cohort)
        return Prediction({**stack(rep, n), **heads}, stack(buffers, n), shared=False)
