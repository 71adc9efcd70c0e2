"""FedAvg — McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient
Learning of Deep Networks from Decentralized Data", AISTATS 2017.

Objective: min_w Σ_i (n_i / n) R_i(w), R_i the empirical risk of client i.
Each round (Algorithm 1 of the paper): the server sends w to the sampled clients; each runs
E epochs of minibatch SGD (batch B, lr η) from w; the server sets w to the n_i-weighted
average of the returned models. Hyper-parameters E, B, η are the run's ``local_epochs``,
``batch_size`` and ``lr``; FedAvg itself has none.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.fused import plain_cross_entropy
from ..engine.tree import Tree
from .base import ClientResult, Payload, register_algorithm
from .common.global_model import GlobalModelAlgorithm, model_state
from .common.losses import cross_entropy


@dataclass(frozen=True)
class FedAvgHyper:
    """FedAvg has no hyper-parameters beyond the run's local-training settings."""


@register_algorithm("fedavg")
class FedAvg(GlobalModelAlgorithm):
    Hyper = FedAvgHyper

    @plain_cross_entropy
    def loss(self, params: Tree, buffers: Tree, anchor: Tree, x, y, w):
        """Local empirical risk R_i(w); ``anchor`` (the received model) is unused here."""
        return cross_entropy(self.ctx.forward(params, buffers, x), y, w)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, received = self.start_from_broadcast(payload, len(cohort))
        out = self.ctx.train(self.loss, params, buffers, cohort, shared=received)
        return ClientResult(
            upload=model_state(out.params, out.buffers),
            state={},
            num_examples=cohort.num_examples,
            loss=out.loss,
        )
