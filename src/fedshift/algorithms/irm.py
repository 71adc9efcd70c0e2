"""IRM† — federated IRMv1 of Arjovsky, Bottou, Gulrajani, Lopez-Paz, "Invariant Risk
Minimization", arXiv 2019, with each client one environment (thesis baseline IRM†).

Client objective: R_i(w) + λ_t·‖∇_{s=1} R_i(s·f_w)‖² + c·‖w‖² (IRMv1, eq. 3 of the paper;
c = ``l2_regularizer``, the reference code's L2 over all parameters, 0 by default), aggregated
as FedAvg or by a FedOpt server optimiser (``server_opt``, fedavg.py). Choices from the
paper's Colored-MNIST reference code: λ_t = 1 for the first ``anneal_rounds`` rounds, then
λ = 91257 (their tuned value); annealing counts rounds (the server keeps a ``round`` counter).

Rescaling. The reference divides the whole objective by λ_t once λ_t > 1 "to keep gradients
in a reasonable range" — harmless under its Adam, whose step ignores the gradient's scale.
Under plain SGD it divides the ERM gradient by 91,257 and the model stops moving (issue 18:
6× less parameter change after the switch, still reading the colour). ``rescale = "auto"``
(default) therefore divides only when the server step is scale-free (``server_opt`` adam,
yogi or adagrad, with one full-batch local step: the reference's training exactly);
``always`` is the reference's line whatever the optimiser, ``never`` keeps R_i + λ_t·P_i.
The logged training loss is always the risk R_i, never the rescaled objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree
from ..options import opt, require
from .base import ClientResult, Payload, RoundInfo, register_algorithm
from .common.adaptive import ServerOptHyper
from .common.global_model import model_state
from .common.invariance import irm_weight, irmv1_penalty
from .common.losses import cross_entropy
from .common.proximal import report_as
from .fedavg import FedAvg

RESCALE = ("auto", "always", "never")


@dataclass(frozen=True)
class IRMHyper(ServerOptHyper):
    lambda_: float = opt(91257.0, "IRMv1 penalty weight λ after annealing (λ = 0 → FedAvg)")
    anneal_rounds: int = opt(190, "rounds with penalty weight 1 before switching to λ")
    l2_regularizer: float = opt(0.0, "c: weight of ‖w‖² (all parameters) in the objective")
    rescale: str = opt(
        "auto", "divide the objective by λ_t > 1: auto (under a scale-free server step)", RESCALE
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.lambda_ >= 0, f"algorithm.lambda_ must be >= 0, got {self.lambda_}")
        require(self.anneal_rounds >= 0, "algorithm.anneal_rounds must be >= 0")
        require(self.l2_regularizer >= 0, "algorithm.l2_regularizer must be >= 0")
        require(self.rescale in RESCALE, f"algorithm.rescale must be one of {RESCALE}")

    @property
    def divides(self) -> bool:
        return self.rescale == "always" or (self.rescale == "auto" and self.scale_free)


@register_algorithm("irm")
class IRM(FedAvg):
    Hyper = IRMHyper

    def init(self) -> Tree:
        return {**super().init(), "round": torch.zeros(())}

    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        logits = self.ctx.forward(params, buffers, x)
        risk = cross_entropy(logits, y, w)
        objective = risk + extras["weight"] * irmv1_penalty(logits, y, w)
        if self.hp.l2_regularizer:
            objective = objective + self.hp.l2_regularizer * sum(
                (p**2).sum() for p in params.values()
            )
        return report_as(objective / extras["divisor"], risk)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, _ = self.start_from_broadcast(payload, len(cohort))
        weight = irm_weight(payload.broadcast["round"], self.hp.anneal_rounds, self.hp.lambda_)
        divisor = torch.clamp(weight, min=1.0) if self.hp.divides else torch.ones(())
        shared = {"weight": weight, "divisor": divisor}
        out = self.ctx.train(self.loss, params, buffers, cohort, shared=shared)
        return ClientResult(
            upload=model_state(out.params, out.buffers),
            state={},
            num_examples=cohort.num_examples,
            loss=out.loss,
        )

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        return {**super().aggregate(server, uploads, info), "round": server["round"] + 1}
