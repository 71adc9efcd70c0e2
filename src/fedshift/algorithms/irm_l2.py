"""IRM†-L2 — the thesis' L2-personalised IRM† (ch. 4, §4.5.5 and Table 4.3): the global model
is trained by IRM† (federated IRMv1, each client one environment: irm.py) and every client
keeps a personal model pulled towards it by the L2 regulariser of personalised FL
(pFedMe, Ditto …).

Personal objective: min_{v_i} R_i(v_i) + (λ/2)·‖v_i − w^t‖², w^t the IRM† global model the
client received; w follows IRM† exactly (tested: same server state as `irm`).
Choices (the thesis names the regulariser only): Ditto's reading — persistent v_i updated
on the sampled clients every round with the run's local epochs (common/personal.py),
evaluated with v_i; default λ = 1, Ditto's default. λ = 0 → Local training (tested).
w inherits ``irm``'s server optimiser and rescaling rule (the objective divided by λ only
under a scale-free server step, irm.py); the personal models v_i always take plain SGD
steps on R_i + (λ/2)‖v_i − w‖², never rescaled.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contract import Tree
from ..options import opt, require
from .base import ClientResult, Payload, register_algorithm
from .common.personal import L2Personalization
from .irm import IRM, IRMHyper


@dataclass(frozen=True)
class IRML2Hyper(IRMHyper):
    l2: float = opt(1.0, "weight λ of the L2 pull of personal models to the IRM† model (0 → Local)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.l2 >= 0, f"algorithm.l2 must be >= 0, got {self.l2}")


@register_algorithm("irm-l2")
class IRML2(L2Personalization, IRM):
    Hyper = IRML2Hyper

    @property
    def personal_weight(self) -> float:
        return self.hp.l2

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        result = super().client_update(payload, state, cohort)  # IRM† global step
        result.state = self.personal_update(payload, state, cohort)
        return result
