"""IRM† — federated IRMv1 of Arjovsky, Bottou, Gulrajani, Lopez-Paz, "Invariant Risk
Minimization", arXiv 2019, with each client one environment (thesis baseline IRM†).

Client objective: R_i(w) + λ_t·‖∇_{s=1} R_i(s·f_w)‖² (IRMv1, eq. 3 of the paper), aggregated as
FedAvg. Choices (from the paper's Colored-MNIST reference code): λ_t = 1 for the first
``anneal_rounds`` rounds, then λ = 91257 (their tuned value, ≈1e5); when λ_t > 1 the loss is
divided by λ_t, as the reference code does to keep gradient scale. Annealing counts rounds
(the server keeps a ``round`` counter), since iterations are local here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.tree import Tree, weighted_mean
from ..options import opt, require
from .base import ClientResult, Payload, RoundInfo, register_algorithm
from .common.global_model import model_state
from .common.invariance import irm_weight, irmv1_penalty
from .common.losses import cross_entropy
from .fedavg import FedAvg


@dataclass(frozen=True)
class IRMHyper:
    lambda_: float = opt(91257.0, "IRMv1 penalty weight λ after annealing (λ = 0 → FedAvg)")
    anneal_rounds: int = opt(190, "rounds with penalty weight 1 before switching to λ")

    def __post_init__(self) -> None:
        require(self.lambda_ >= 0, f"algorithm.lambda_ must be >= 0, got {self.lambda_}")
        require(self.anneal_rounds >= 0, "algorithm.anneal_rounds must be >= 0")


@register_algorithm("irm")
class IRM(FedAvg):
    Hyper = IRMHyper

    def init(self) -> Tree:
        return {**super().init(), "round": torch.zeros(())}

    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        logits = self.ctx.forward(params, buffers, x)
        weight = extras["weight"]
        risk = cross_entropy(logits, y, w) + weight * irmv1_penalty(logits, y, w)
        return risk / torch.clamp(weight, min=1.0)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, _ = self.start_from_broadcast(payload, len(cohort))
        weight = irm_weight(payload.broadcast["round"], self.hp.anneal_rounds, self.hp.lambda_)
        out = self.ctx.train(self.loss, params, buffers, cohort, shared={"weight": weight})
        return ClientResult(
            upload=model_state(out.params, out.buffers),
            state={},
            num_examples=cohort.num_examples,
            loss=out.loss,
        )

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        return {**weighted_mean(uploads, info.num_examples), "round": server["round"] + 1}
