"""Local training — each client trains only on its own data and never communicates.

Objective: min_{w_i} R_i(w_i) for every client separately. The lower anchor of every
personalized-FL comparison (Ditto with λ = 0 reduces to it). Each client's model is
persistent client state; all start from the same seeded initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contract import Tree
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state


@dataclass(frozen=True)
class LocalHyper:
    """Local training has no hyper-parameters beyond the run's local-training settings."""


@register_algorithm("local")
class Local(Algorithm):
    Hyper = LocalHyper
    personalized = True

    def init(self) -> Tree:
        return {}

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload()  # nothing is sent

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers = split_state(state)
        out = self.ctx.train(self.loss, params, buffers, cohort)
        return ClientResult({}, model_state(out.params, out.buffers), cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        return server

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)
        return Prediction(params, buffers, shared=False)
