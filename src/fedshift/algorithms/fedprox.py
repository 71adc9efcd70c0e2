"""FedProx — Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020.

Client objective (eq. 2): h_i(w; w^t) = R_i(w) + (μ/2)·‖w − w^t‖², w^t the received global
model; aggregation as FedAvg. μ = 0 is exactly FedAvg (tested). Default μ = 0.01, one of
the values the paper tunes over {0.001, 0.01, 0.1, 1}. On an MLP the engine's fused step
trains h_i with the pull folded into its in-place update (``proximal_cross_entropy``);
otherwise the written gradient (``loss_gradient``) or autograd does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contract import Tree, gradient_by, proximal_cross_entropy
from ..options import opt, require
from .base import Algorithm, register_algorithm
from .common.losses import cross_entropy, squared_distance
from .common.proximal import proximal_gradient
from .fedavg import FedAvg


@dataclass(frozen=True)
class FedProxHyper:
    mu: float = opt(0.01, "proximal weight μ (μ = 0 reduces FedProx to FedAvg)")

    def __post_init__(self) -> None:
        require(self.mu >= 0, f"algorithm.mu must be >= 0, got {self.mu}")


@register_algorithm("fedprox")
class FedProx(FedAvg):
    Hyper = FedProxHyper

    def loss_gradient(self, params: Tree, buffers: Tree, anchor: Tree, x, y, w):
        return proximal_gradient(self.risk_gradient(), self.hp.mu, params, anchor, x, y, w)

    @proximal_cross_entropy(lambda self: self.hp.mu)
    @gradient_by(loss_gradient, when=Algorithm.has_risk_gradient, batched=True)
    def loss(self, params: Tree, buffers: Tree, anchor: Tree, x, y, w):
        risk = cross_entropy(self.ctx.forward(params, buffers, x), y, w)
        return risk + 0.5 * self.hp.mu * squared_distance(params, anchor)
