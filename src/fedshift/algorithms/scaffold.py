"""SCAFFOLD — Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", ICML 2020.

Objective: FedAvg's min_x Σ_i (n_i / n) R_i(x), with client drift corrected by control
variates. Algorithm 1 of the paper, per round with server model x and control variate c:
each sampled client starts from y_i = x and takes K_i steps y_i ← y_i − η_l (g_i(y_i) − c_i + c)
(here: the gradient of R_i(y) + ⟨c − c_i, y⟩, so the engine's autodiff gives exactly that
update; for an MLP the engine's fused step adds c − c_i to its in-place update,
``corrected_cross_entropy``, and elsewhere ``loss_gradient`` writes the gradient out);
then option II: c_i⁺ = c_i − c + (x − y_i) / (K_i η_l); it uploads Δy_i = y_i − x and
Δc_i = c_i⁺ − c_i. The server sets x ← x + η_g · mean_S Δy_i and c ← c + (1/N) Σ_S Δc_i.

Defaults and choices: η_g = 1 (the paper's experiments); c and every c_i start at 0; the
mean over S is uniform (the paper's 1/|S|), ``weighted = true`` uses FedAvg's n_i weights.
K_i is the number of steps client i actually took (clients of unequal size take different
numbers); η_l is the run's ``lr``. Option II assumes plain SGD: with momentum or weight decay
the correction is still applied, but c_i⁺ is no longer the paper's estimate. BatchNorm
buffers, which have no control variates, are averaged like FedAvg's.
Server state: ``{"p": x, "b": buffers, "c": c}``; client state ``{"c": c_i}``; upload
``{"dy": Δy_i, "dc": Δc_i, "b": buffers}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, corrected_cross_entropy, gradient_by, weighted_mean
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, RoundInfo, register_algorithm
from .common.global_model import GlobalModelAlgorithm, model_state, split_state
from .common.losses import cross_entropy
from .common.proximal import report_as


@dataclass(frozen=True)
class ScaffoldHyper:
    server_lr: float = opt(1.0, "global step size η_g (the paper's experiments use 1)")
    weighted: bool = opt(False, "average client deltas with n_i weights (paper: uniform)")

    def __post_init__(self) -> None:
        require(self.server_lr > 0, f"algorithm.server_lr must be > 0, got {self.server_lr}")


def linear_correction(params: Tree, correction: Tree) -> torch.Tensor:
    """⟨c − c_i, y⟩ summed over parameters: its gradient adds c − c_i to every step.
    ``correction`` may carry other extras (e.g. ``env``); only parameter names are used."""
    return sum((params[k] * correction[k]).sum() for k in params if k in correction)


@register_algorithm("scaffold")
class Scaffold(GlobalModelAlgorithm):
    Hyper = ScaffoldHyper

    def init(self) -> Tree:
        zeros = {k: torch.zeros_like(v) for k, v in self.ctx.initial_params.items()}
        return {**super().init(), "c": zeros}  # x and c = 0

    def init_client_state(self, server: Tree) -> Tree:
        return {"c": {k: torch.zeros_like(v) for k, v in server["c"].items()}}

    def loss_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """∇ of ``loss`` with the risk's gradient written out: ∇R + (c − c_i); the risk."""
        grads, risk = self.risk_gradient()(params, x, y, w)
        return {k: g + extras[k] if k in extras else g for k, g in grads.items()}, risk

    @corrected_cross_entropy
    @gradient_by(loss_gradient, when=Algorithm.has_risk_gradient, batched=True)
    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        risk = cross_entropy(self.ctx.forward(params, buffers, x), y, w)
        # Algorithm 1, line 10; the log shows the risk (the linear term has no floor)
        return report_as(risk + linear_correction(params, extras), risk)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, x = self.start_from_broadcast(payload, len(cohort))
        c, c_i = payload.broadcast["c"], state["c"]
        correction = {k: c[k].unsqueeze(0) - c_i[k] for k in c}
        out = self.ctx.train(self.loss, params, buffers, cohort, per_client=correction)
        # Option II (line 12): c_i⁺ = c_i − c + (x − y_i) / (K_i η_l); unchanged if K_i = 0.
        # Written as (Δy_i / −K_i η_l) − (c − c_i), the same floats in three passes over the
        # cohort (x − y_i = −Δy_i and c_i − c = −correction exactly)
        k_eta = (out.steps.to(torch.float32) * self.ctx.sgd.lr).to(params[next(iter(c))].device)
        took_steps = k_eta > 0
        every_client_stepped = bool(took_steps.all())
        delta_y, new_c, delta_c = {}, {}, {}
        for k in c:
            shape = (-1, *([1] * c[k].dim()))
            delta_y[k] = out.params[k] - x[k].unsqueeze(0)  # line 13
            plus = (delta_y[k] / -k_eta.clamp(min=1e-12).view(shape)).sub_(correction[k])
            new_c[k] = (
                plus if every_client_stepped else torch.where(took_steps.view(shape), plus, c_i[k])
            )
            delta_c[k] = new_c[k] - c_i[k]
        upload = {"dy": delta_y, "dc": delta_c, "b": out.buffers}
        return ClientResult(upload, {"c": new_c}, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        n = self.ctx.data.num_clients
        weights = info.num_examples if self.hp.weighted else torch.ones_like(info.num_examples)
        # Δc is averaged on its own below (over S, scaled by |S|/N): not in this mean
        mean = weighted_mean({k: v for k, v in uploads.items() if k != "dc"}, weights)
        params, _ = split_state(server)
        c, s = server["c"], len(info.ids)
        lr = self.hp.server_lr  # at 1 (the paper's) Δy is added as it is: same floats, a pass less
        new_x = {
            k: v + (mean["dy"][k] if lr == 1 else lr * mean["dy"][k]) for k, v in params.items()
        }
        new_c = {k: v + (s / n) * uploads["dc"][k].mean(0) for k, v in c.items()}
        return {**model_state(new_x, mean.get("b", {})), "c": new_c}
