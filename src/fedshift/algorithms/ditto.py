"""Ditto — Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021.

Objective (eq. 2): for every client k, min_{v_k} h_k(v_k; w*) = F_k(v_k) + (λ/2)·‖v_k − w*‖²,
s.t. w* ∈ argmin_w Σ_k (n_k/n) F_k(w) (the global objective G is FedAvg's).
Algorithm 1: each sampled client trains the global model as in FedAvg (uploaded, averaged
with weights n_k) and, from the same received w^t, its persistent personal model v_k with
the gradient ∇F_k(v_k) + λ(v_k − w^t) (common/personal.py); clients are evaluated with v_k.
Default λ = 1, from the paper's grid {0.05, 0.1, 0.2, 0.5, 1, 2}. λ = 0 → Local training of
v_k (tested), and the global model is always FedAvg's (tested). Choices: v_k starts from
the common initial model; its local epochs/steps are the run's (the paper uses the same
number of local iterations for both models).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contract import Tree
from ..options import opt, require
from .base import ClientResult, Payload, register_algorithm
from .common.personal import L2Personalization
from .fedavg import FedAvg


@dataclass(frozen=True)
class DittoHyper:
    lambda_: float = opt(
        1.0, "weight λ of the pull of personal models to the global one (0 → Local)"
    )

    def __post_init__(self) -> None:
        require(self.lambda_ >= 0, f"algorithm.lambda_ must be >= 0, got {self.lambda_}")


@register_algorithm("ditto")
class Ditto(L2Personalization, FedAvg):
    Hyper = DittoHyper

    @property
    def personal_weight(self) -> float:
        return self.hp.lambda_

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        result = super().client_update(payload, state, cohort)  # global w: FedAvg's step
        result.state = self.personal_update(payload, state, cohort)  # personal v_k
        return result
