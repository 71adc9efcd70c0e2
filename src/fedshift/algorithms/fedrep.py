"""FedRep — Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021.

Objective (eq. 2): min_φ (1/n) Σ_i min_{h_i} R_i(h_i ∘ φ) — a global representation φ (the
model's extractor) and one local head h_i per client (persistent client state).
Algorithm 1, per sampled client: τ_h epochs of SGD on h_i with φ fixed, then τ_φ epochs on
φ with h_i fixed; the client uploads φ and the server takes the plain mean
φ ← (1/|S|) Σ_{i∈S} φ_i (uniform weights, as in Algorithm 1). Clients are evaluated with
h_i ∘ φ. Defaults: τ_h = 10 head epochs (the paper's experiments); τ_φ is the run's local
epochs/steps (the paper uses 1 epoch). ``head_epochs = 0`` keeps every head at its
initialisation (tested). Choices: heads start from the common initial head; BN buffers, if
any, are averaged with φ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, select, stack, weighted_mean
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .common.split import is_extractor, is_head


@dataclass(frozen=True)
class FedRepHyper:
    head_epochs: int = opt(10, "local epochs τ_h of the head with the representation fixed")

    def __post_init__(self) -> None:
        require(
            self.head_epochs >= 0, f"algorithm.head_epochs must be >= 0, got {self.head_epochs}"
        )


@register_algorithm("fedrep")
class FedRep(Algorithm):
    Hyper = FedRepHyper
    personalized = True

    def init(self) -> Tree:
        return model_state(select(self.ctx.initial_params, is_extractor), self.ctx.initial_buffers)

    def init_client_state(self, server: Tree) -> Tree:
        return {"p": select(self.ctx.initial_params, is_head)}

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=server)

    def personal_model(self, shared: Tree, state: Tree, n: int) -> tuple[Tree, Tree]:
        """Stacked h_i ∘ φ for ``n`` clients: the shared φ with each client's head (φ as
        read-only views: ``ctx.train`` copies what it trains)."""
        # φ may have no parameters (mlr: Φ = identity): an empty part is not sent or saved
        rep, buffers = shared.get("p", {}), shared.get("b", {})
        heads, _ = split_state(state)
        return {**stack(rep, n, copy=False), **heads}, stack(buffers, n, copy=False)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers = self.personal_model(payload.broadcast, state, len(cohort))
        if self.hp.head_epochs > 0:  # line 5: update the head, φ fixed
            out = self.ctx.train(
                self.loss,
                params,
                buffers,
                cohort,
                "head",
                epochs=self.hp.head_epochs,
                trainable=is_head,
            )
            params, buffers = out.params, out.buffers
        out = self.ctx.train(self.loss, params, buffers, cohort, trainable=is_extractor)  # line 6
        return ClientResult(
            upload=model_state(select(out.params, is_extractor), out.buffers),
            state={"p": select(out.params, is_head)},
            num_examples=torch.ones(len(cohort)),  # Algorithm 1 averages uniformly
            loss=out.loss,
        )

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        return weighted_mean(uploads, info.num_examples)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = self.personal_model(server, state, len(cohort))
        return Prediction(params, buffers, shared=False)
