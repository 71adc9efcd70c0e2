"""FedSR — Nguyen, Torr, Lim, "FedSR: A Simple and Effective Domain Generalization Method
for Federated Learning", NeurIPS 2022.

Stochastic representation z ~ N(μ(x), diag σ²(x)) with [μ, σ_raw] = A·Φ(x) + a (a Linear
layer after the model's extractor; σ = softplus(σ_raw)), classifier ω(z). Client loss:
  CE(ω(z), y) + α_L2R·E‖z‖ + α_CMI·E[KL(N(Cμ, C²σ²) ‖ N(r_μ[y], r_σ[y]²))]
(L2R and the conditional-mutual-information bound, eqs. 6–8); r_μ, r_σ (class-wise
reference Gaussians, r_σ = softplus(r_σ_raw)) and the scale C are learned and stay on each
client (persistent client state): the authors' code (atuannguyen/FedSR, methods/FedSR.py)
keeps them outside the ``model`` whose state_dict ``communicate`` averages. The server
averages Φ, A and ω uniformly over the participants, as that ``communicate`` does
(sum / number of clients). Defaults α_L2R = 1e-2, α_CMI = 5e-4 (authors' code).
Choices: one sample z = μ + σ·ε per example (ε from the engine's per-client seeded noise);
L2R as the mean Euclidean norm of z (authors' code); for an MLP the loss's gradient is
written out (``loss_gradient``, tested against autograd); evaluation with z = μ, so the
evaluated model is Φ with head ω∘A_μ folded into one Linear layer; A initialised like
nn.Linear from the run seed, r_μ = 0, r_σ_raw = 1, C = 1 (authors' initialisation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..engine.contract import (
    Tree,
    cross_entropy_gradient,
    gradient_by,
    linear,
    linear_grads,
    loss_scale,
    stack,
    torch_seed,
    weighted_mean,
)
from ..options import opt, require
from .base import ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .common.losses import cross_entropy
from .common.representation import rows_by_label
from .common.split import classify, features, is_head, require_linear_head
from .fedavg import FedAvg


def cmi_bound(mu, sigma, ref_mu, ref_sigma, scale):
    """Σ_d KL(N(Cμ, (Cσ)²) ‖ N(r_μ, r_σ²)) per sample (closed form of two diagonal Gaussians)."""
    m, s = mu * scale, sigma * scale
    kl = torch.log(ref_sigma) - torch.log(s) + (s**2 + (m - ref_mu) ** 2) / (2 * ref_sigma**2) - 0.5
    return kl.sum(-1)


@dataclass(frozen=True)
class FedSRHyper:
    l2r: float = opt(1e-2, "weight α_L2R of the representation-norm regulariser")
    cmi: float = opt(5e-4, "weight α_CMI of the conditional mutual information bound")

    def __post_init__(self) -> None:
        require(self.l2r >= 0, f"algorithm.l2r must be >= 0, got {self.l2r}")
        require(self.cmi >= 0, f"algorithm.cmi must be >= 0, got {self.cmi}")


@register_algorithm("fedsr")
class FedSR(FedAvg):
    Hyper = FedSRHyper

    def __init__(self, hyper, ctx) -> None:
        super().__init__(hyper, ctx)
        require_linear_head(ctx, "fedsr")
        self.dim = ctx.model.feature_dim

    def init(self) -> Tree:
        d = self.dim
        g = torch.Generator().manual_seed(torch_seed(self.ctx.seed, 0, 0, "fedsr/init"))
        bound = d**-0.5  # nn.Linear's default initialisation, U(−1/√d, 1/√d)
        extra = {
            "fedsr.rep.weight": (torch.rand(2 * d, d, generator=g) * 2 - 1) * bound,
            "fedsr.rep.bias": (torch.rand(2 * d, generator=g) * 2 - 1) * bound,
        }
        server = super().init()  # A and a join the model's parameters
        server["p"].update({name: v.to(self.ctx.device) for name, v in extra.items()})
        return server

    def init_client_state(self, server: Tree) -> Tree:
        """Each client's own r_μ, r_σ_raw and C (authors' initialisation)."""
        d, k = self.dim, self.ctx.data.num_classes
        refs = {
            "fedsr.ref_mu": torch.zeros(k, d),
            "fedsr.ref_sigma": torch.ones(k, d),
            "fedsr.scale": torch.ones(()),
        }
        return {"p": {name: v.to(self.ctx.device) for name, v in refs.items()}}

    def distribution(self, params: Tree, buffers: Tree, x):
        out = F.linear(
            features(self.ctx, params, buffers, x),
            params["fedsr.rep.weight"],
            params["fedsr.rep.bias"],
        )
        return out[..., : self.dim], F.softplus(out[..., self.dim :])

    def loss_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``loss`` and its gradient written out for an MLP, for the whole cohort at once
        (a leading client axis on every tensor; the engine calls it without ``vmap``): ω(z)
        and the two regularisers back to z = μ + σ·ε, through σ = softplus and the rep
        layer A to Φ(x), then the extractor's backward. Returns every client's gradients
        and loss [C]. Its cost is mostly A's matrix products (390 → 780 on cmnist's MLP)."""
        ext, d, k = self.extractor(), self.dim, self.ctx.data.num_classes
        phi, cache = ext.forward(params, x)  # [C, B, F]
        rep_w, rep_b = params["fedsr.rep.weight"], params["fedsr.rep.bias"]
        out = linear(phi, rep_w, rep_b)
        mu, raw = out[..., :d], out[..., d:]
        sigma = F.softplus(raw)
        eps = extras["eps"][:, : x.shape[1]]
        z = mu + sigma * eps
        head_w = params["head.weight"]
        logits = linear(z, head_w, params["head.bias"])
        risk, delta, _ = cross_entropy_gradient(logits, y, w)  # δ = ∂risk/∂logits
        scale = loss_scale(w)  # per-sample weight of every mean below
        target = (y[..., None] == torch.arange(k, device=y.device)).to(logits.dtype)
        norm = z.norm(dim=-1)
        unit = torch.where(norm[..., None] > 0, z / norm.clamp(min=1e-30)[..., None], 0.0)
        dz = delta @ head_w + (self.hp.l2r * scale)[..., None] * unit
        # KL(N(Cμ, (Cσ)²) ‖ N(r_μ[y], r_σ[y]²)) per dimension, and its partial derivatives
        c = params["fedsr.scale"][:, None, None]
        ref_mu = rows_by_label(params["fedsr.ref_mu"], y)  # r_μ[y] [C, B, d]
        ref_raw = rows_by_label(params["fedsr.ref_sigma"], y)
        ref_sigma = F.softplus(ref_raw)
        m, s = mu * c, sigma * c
        gap = m - ref_mu
        var, spread = ref_sigma**2, s**2 + gap**2  # each used twice below: computed once
        kl = torch.log(ref_sigma) - torch.log(s) + spread / (2 * var) - 0.5
        weight = (self.hp.cmi * scale)[..., None]
        d_m = weight * gap / var
        d_s = weight * (s / var - 1 / s)
        d_ref_sigma = weight * (1 / ref_sigma - spread / ref_sigma**3)
        d_out = torch.cat([dz + d_m * c, (dz * eps + d_s * c) * torch.sigmoid(raw)], -1)
        grads = ext.backward(params, cache, d_out @ rep_w)
        by_class = target.transpose(-1, -2)  # [C, K, B]
        rep_gw, rep_gb = linear_grads(d_out, phi)
        head_gw, head_gb = linear_grads(delta, z)
        grads.update(
            {
                "fedsr.rep.weight": rep_gw,
                "fedsr.rep.bias": rep_gb,
                "head.weight": head_gw,
                "head.bias": head_gb,
                "fedsr.ref_mu": by_class @ -d_m,
                "fedsr.ref_sigma": by_class @ (d_ref_sigma * torch.sigmoid(ref_raw)),
                "fedsr.scale": (d_m * mu).sum((-2, -1)) + (d_s * sigma).sum((-2, -1)),
            }
        )
        cmi = (kl.sum(-1) * scale).sum(-1)
        return grads, risk + self.hp.l2r * (norm * scale).sum(-1) + self.hp.cmi * cmi

    @gradient_by(loss_gradient, when=lambda self: self.extractor() is not None, batched=True)
    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        mu, sigma = self.distribution(params, buffers, x)
        z = mu + sigma * extras["eps"][: x.shape[0]]
        risk = cross_entropy(
            classify(self.ctx, {k: v for k, v in params.items() if is_head(k)}, z), y, w
        )
        l2r = (z.norm(dim=-1) * w).sum() / w.sum().clamp(min=1.0)
        ref_sigma = F.softplus(params["fedsr.ref_sigma"])[y]
        kl = cmi_bound(mu, sigma, params["fedsr.ref_mu"][y], ref_sigma, params["fedsr.scale"])
        cmi = (kl * w).sum() / w.sum().clamp(min=1.0)
        return risk + self.hp.l2r * l2r + self.hp.cmi * cmi

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        n = len(cohort)
        params, buffers = split_state(payload.broadcast)
        refs, _ = split_state(state)  # this client's r_μ, r_σ, C
        sizes = self.ctx.data.train.sizes()
        batch = self.ctx.batch_size if self.ctx.batch_size > 0 else max(int(sizes.max()), 1)
        out = self.ctx.train(
            self.loss,
            {**stack(params, n, copy=False), **refs},  # views: train copies
            stack(buffers, n, copy=False),
            cohort,
            noise={"eps": (batch, self.dim)},
        )
        shared = {k: v for k, v in out.params.items() if k not in refs}
        kept = {"p": {k: out.params[k] for k in refs}}
        return ClientResult(model_state(shared, out.buffers), kept, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        """Uniform mean over the participants (the authors' ``communicate``)."""
        return weighted_mean(uploads, torch.ones(len(info.ids)))

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(server)
        weight, bias = params["fedsr.rep.weight"][: self.dim], params["fedsr.rep.bias"][: self.dim]
        model = {k: v for k, v in params.items() if not k.startswith("fedsr.")}
        model["head.weight"] = params["head.weight"] @ weight  # ω(A_μ z + a_μ), z = Φ(x)
        model["head.bias"] = params["head.weight"] @ bias + params["head.bias"]
        return Prediction(model, buffers, shared=True)
