"""Persistent personal models with an L2 pull towards the received global model, the
personalisation of Ditto (Li et al., ICML 2021, Algorithm 1) reused by IRM†-L2.

Each sampled client i updates its own model v_i (client state, initialised to the common
initial model) on  R_i(v) + (λ/2)·‖v − w^t‖², w^t the global model it received this round,
with the run's local epochs/steps and the same minibatch order as Local's training (purpose
"train"), so λ = 0 gives exactly Local's models. Clients are evaluated with v_i. On an MLP
the engine's fused step trains the personal objective (``proximal_cross_entropy``).
"""

from __future__ import annotations

from ...engine.contract import Algorithm, Tree, gradient_by, proximal_cross_entropy
from ..base import Payload, Prediction
from .global_model import model_state, split_state
from .losses import cross_entropy, squared_distance
from .proximal import proximal_gradient


class L2Personalization:
    """Mixin for a global-model algorithm; ``personal_weight`` is λ."""

    personalized = True
    personal_weight: float

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def personal_gradient(self, params: Tree, buffers: Tree, anchor: Tree, x, y, w):
        weight = self.personal_weight
        return proximal_gradient(self.risk_gradient(), weight, params, anchor, x, y, w)

    @proximal_cross_entropy(lambda self: self.personal_weight)
    @gradient_by(personal_gradient, when=Algorithm.has_risk_gradient, batched=True)
    def personal_loss(self, params: Tree, buffers: Tree, anchor: Tree, x, y, w):
        risk = cross_entropy(self.ctx.forward(params, buffers, x), y, w)
        return risk + 0.5 * self.personal_weight * squared_distance(params, anchor)

    def personal_update(self, payload: Payload, state: Tree, cohort) -> Tree:
        params, buffers = split_state(state)
        anchor, _ = split_state(payload.broadcast)
        out = self.ctx.train(self.personal_loss, params, buffers, cohort, shared=anchor)
        return model_state(out.params, out.buffers)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)
        return Prediction(params, buffers, shared=False)
