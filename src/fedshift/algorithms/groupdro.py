"""GroupDRO† — Sagawa, Koh, Hashimoto, Liang, "Distributionally Robust Neural Networks for
Group Shifts", ICLR 2020, federated with each client one group (thesis baseline GroupDRO†).

Objective: min_w max_{q ∈ Δ} Σ_i q_i R_i(w). Federated reading of Algorithm 1: the server
keeps q over all clients; each sampled client trains as in FedAvg and uploads its model and
mean training loss ℓ_i; the server sets q_i ← q_i·exp(η_q·ℓ_i) (participants only), normalises
q, and averages the participants' models with weights q_i (renormalised over the
participants). Default η_q = 0.01, Sagawa et al.'s step size, which they apply after every
minibatch; here (as in PerInvFL's federated GroupDRO, whose server updates q from the uploaded
risks) it is applied once a round, so q moves as far in a round as in one of their steps.
Tables choose η_q by validation (docs/methods/ood-baselines.md). η_q = 0 → uniform FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, weighted_mean
from ..options import opt, require
from .base import ClientResult, Payload, RoundInfo, register_algorithm
from .common.invariance import groupdro_weights
from .fedavg import FedAvg


@dataclass(frozen=True)
class GroupDROHyper:
    eta_q: float = opt(0.01, "step size η_q of the group weights (η_q = 0 → uniform FedAvg)")

    def __post_init__(self) -> None:
        require(self.eta_q >= 0, f"algorithm.eta_q must be >= 0, got {self.eta_q}")


@register_algorithm("groupdro")
class GroupDRO(FedAvg):
    Hyper = GroupDROHyper

    def init(self) -> Tree:
        n = self.ctx.data.num_clients
        return {**super().init(), "q": torch.full((n,), 1.0 / n)}

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        result = super().client_update(payload, state, cohort)
        result.upload["loss"] = result.loss  # ℓ_i, needed by the server's q step
        return result

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        models = {k: v for k, v in uploads.items() if k != "loss"}
        q = groupdro_weights(server["q"], info.ids, uploads["loss"], self.hp.eta_q)
        return {**weighted_mean(models, q[info.ids]), "q": q}
