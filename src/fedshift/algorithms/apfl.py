"""APFL — Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv 2020
(arXiv:2003.13461).

Objective: each client i is served the mixture v̄_i = α_i v_i + (1 − α_i) w, where the global
model w minimises Σ_i (n_i/n) f_i(w) (trained and averaged exactly as FedAvg) and the
personal model v_i minimises f_i(α_i v_i + (1 − α_i) w*). Algorithm 1, per local step on one
minibatch ξ: w_i ← w_i − η ∇f_i(w_i; ξ); v_i ← v_i − η ∇_v f_i(v̄_i; ξ) = v_i − η α_i ∇f_i(v̄_i; ξ);
with adaptive α (the paper's eq. for α): α_i ← Π_[0,1](α_i − η ⟨v_i − w_i, ∇f_i(v̄_i; ξ)⟩).
All three use the gradient at the same iterate, so they are one step on
f_i(w_i) + f_i(α_i v_i + (1 − α_i)·sg(w_i)) (sg = stop-gradient), which the engine
differentiates. The server averages w_i every round (the paper's τ = one round of local steps).

Defaults and choices: α = 0.25 (one of the paper's fixed values {0.25, 0.5, 0.75}), not
adaptive. α = 0 gives FedAvg's global model at evaluation, α = 1 local training (tested).
With ``adaptive``, α takes the run's lr and SGD settings, like v and w in the paper; the
projection onto [0, 1] is applied at the end of each round, and within a round the mixture
uses α clipped to [0, 1]. Evaluation uses v̄_i with the latest global model w. The mixed
model runs with v_i's BatchNorm buffers.
Client state: ``{"v": v_i's parameters, "vb": v_i's buffers, "alpha": α_i}``; server state
FedAvg's ``{"p", "b"}``. One local step trains ``{"w": w_i, "v": v_i, "alpha": α_i}`` with
buffers ``{"w": …, "v": …}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, stack
from ..options import opt, require
from .base import ClientResult, Payload, Prediction, register_algorithm
from .common.global_model import GlobalModelAlgorithm, model_state, split_state
from .common.losses import cross_entropy


@dataclass(frozen=True)
class APFLHyper:
    alpha: float = opt(0.25, "mixing weight α of the personal model (0 → FedAvg, 1 → Local)")
    adaptive: bool = opt(False, "learn α per client by gradient steps (adaptive APFL)")

    def __post_init__(self) -> None:
        require(0.0 <= self.alpha <= 1.0, f"algorithm.alpha must be in [0, 1], got {self.alpha}")


def mix(alpha: torch.Tensor, v: Tree, w: Tree) -> Tree:
    """α v + (1 − α) w over the keys of ``v``."""
    return {k: alpha * v[k] + (1 - alpha) * w[k] for k in v}


@register_algorithm("apfl")
class APFL(GlobalModelAlgorithm):
    Hyper = APFLHyper
    personalized = True

    def init_client_state(self, server: Tree) -> Tree:
        return {
            "v": dict(self.ctx.initial_params),  # v_i⁰ = w⁰
            "vb": dict(self.ctx.initial_buffers),
            "alpha": torch.tensor(self.hp.alpha),
        }

    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        gw, v = params["w"], params["v"]
        gb, vb = buffers.get("w", {}), buffers.get("v", {})  # a model without buffers: none
        alpha = params["alpha"].clamp(0.0, 1.0)
        global_risk = cross_entropy(self.ctx.forward(gw, gb, x), y, w)
        mixed = mix(alpha, v, {k: t.detach() for k, t in gw.items()})
        return global_risk + cross_entropy(self.ctx.forward(mixed, vb, x), y, w)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        gw, gb, _ = self.start_from_broadcast(payload, len(cohort))
        params = {"w": gw, "v": state["v"], "alpha": state["alpha"]}
        buffers = {"w": gb, "v": state.get("vb", {})}
        trainable = None if self.hp.adaptive else (lambda k: k != "alpha")
        out = self.ctx.train(self.loss, params, buffers, cohort, trainable=trainable)
        new_state = {
            "v": out.params["v"],
            "vb": out.buffers.get("v", {}),
            "alpha": out.params["alpha"].clamp(0.0, 1.0),  # projection onto [0, 1]
        }
        upload = model_state(out.params["w"], out.buffers.get("w", {}))
        return ClientResult(upload, new_state, cohort.num_examples, out.loss)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        gw, _ = split_state(server)
        v, w = state["v"], stack(gw, len(cohort))
        a = {k: state["alpha"].view(-1, *([1] * (t.dim() - 1))) for k, t in v.items()}
        params = {k: a[k] * v[k] + (1 - a[k]) * w[k] for k in v}
        return Prediction(params, dict(state.get("vb", {})), shared=False)
