"""FedAvg — McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient
Learning of Deep Networks from Decentralized Data", AISTATS 2017.

Objective: min_w Σ_i (n_i / n) R_i(w), R_i the empirical risk of client i.
Each round (Algorithm 1 of the paper): the server sends w to the sampled clients; each runs
E epochs of minibatch SGD (batch B, lr η) from w; the server sets w to the n_i-weighted
average of the returned models. Hyper-parameters E, B, η are the run's ``local_epochs``,
``batch_size`` and ``lr``.

FedOpt (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2) is the
``server_opt`` option: the server steps along the pseudo-gradient w − Σ_i (n_i/n) w_i with
SGD (η = 1: the plain average above, the default), Adam, Yogi or Adagrad
(common/adaptive.py). With one full-batch local step of lr 1 the pseudo-gradient is the
clients' weighted mean gradient, so FedAdam is then centralised full-batch Adam (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contract import Tree, weighted_mean
from .base import ClientResult, Payload, RoundInfo, register_algorithm
from .common.adaptive import ServerOptHyper, model_entries, server_opt_state, server_update
from .common.global_model import GlobalModelAlgorithm, model_state


@dataclass(frozen=True)
class FedAvgHyper(ServerOptHyper):
    """FedAvg's only options are FedOpt's server optimiser (default: the plain average)."""


@register_algorithm("fedavg")
class FedAvg(GlobalModelAlgorithm):
    Hyper = FedAvgHyper

    @property
    def server_opt(self) -> ServerOptHyper | None:
        """The FedOpt settings, for subclasses whose options include them."""
        return self.hp if isinstance(self.hp, ServerOptHyper) else None

    def init(self) -> Tree:
        state = super().init()
        return {**state, **(server_opt_state(self.server_opt, state) if self.server_opt else {})}

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=model_entries(server))

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, received = self.start_from_broadcast(payload, len(cohort))
        out = self.ctx.train(self.loss, params, buffers, cohort, shared=received)
        return ClientResult(
            upload=model_state(out.params, out.buffers),
            state={},
            num_examples=cohort.num_examples,
            loss=out.loss,
        )

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        average = weighted_mean(uploads, info.num_examples)
        return server_update(self.server_opt, server, average) if self.server_opt else average
