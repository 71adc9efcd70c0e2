"""IFCA — Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020 (Iterative Federated Clustering Algorithm, Algorithm 1).

Objective: min over K cluster models θ_1..θ_K and assignments of Σ_i min_j R_i(θ_j). Per round,
model-averaging option of Algorithm 1: the server broadcasts all K models; each sampled
client estimates its cluster ĵ = argmin_j R_i(θ_j) (mean loss on its whole training set),
runs local SGD from θ_ĵ (the run's local epochs) and uploads the result with ĵ; the server
sets each θ_j to the average of the models of the clients that chose j (a cluster nobody
chose keeps its model).

Defaults and choices: K = 4 (the paper's rotated-MNIST setting). The K models start from
independent random initialisations (θ_1 the run's own, the others seeded by the run
seed), so K = 1 is FedAvg (tested). The average within a cluster is
n_i-weighted (the paper's clients have equal n_i, where this is its plain mean). Each
round's assignments are logged (``cluster``, in the order of ``clients``). At evaluation
every client picks its cluster the same way (lowest training loss) and is evaluated with it.
Communication: all K models go down to every sampled client.

Server state: ``{"p": …, "b": …}`` of the K models stacked [K, …]; a client uploads
``{"m": {"p": …, "b": …}, "cluster": ĵ}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, flatten, leaves, take, tree_map, weighted_mean
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.client_loss import client_losses, fresh_init
from .common.global_model import model_state, split_state


@dataclass(frozen=True)
class IFCAHyper:
    num_clusters: int = opt(4, "number K of cluster models (K = 1 → FedAvg)")

    def __post_init__(self) -> None:
        require(self.num_clusters >= 1, "algorithm.num_clusters must be >= 1")


def cluster_model(server: Tree, j) -> Tree:
    """Model j of the stacked cluster models (``j`` an int, or a [C] index → stacked)."""
    return take(server, j)


@register_algorithm("ifca")
class IFCA(Algorithm):
    Hyper = IFCAHyper
    personalized = True

    def init(self) -> Tree:
        inits = [fresh_init(self.ctx, j, "ifca/init") for j in range(1, self.hp.num_clusters)]
        first = (self.ctx.initial_params, self.ctx.initial_buffers)  # θ_1: the run's init
        models = [model_state(p, b) for p, b in [first, *inits]]
        return tree_map(lambda *model: torch.stack(model), *models)  # [K, ...]

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=server)  # all K models

    def choose(self, server: Tree, cohort) -> torch.Tensor:
        """ĵ_i = argmin_j R_i(θ_j) on each client's training data (Algorithm 1, line 6)."""
        losses = []
        for j in range(self.hp.num_clusters):
            params, buffers = split_state(cluster_model(server, j))
            losses.append(
                client_losses(self.ctx, params, buffers, True, self.ctx.data.train, cohort.ids)
            )
        return torch.stack(losses, 1).argmin(1)  # ties → lowest index

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        chosen = self.choose(payload.broadcast, cohort)
        start = cluster_model(payload.broadcast, chosen.to(self.ctx.device))
        params, buffers = split_state(start)
        out = self.ctx.train(self.loss, params, buffers, cohort)
        upload = {"m": model_state(out.params, out.buffers), "cluster": chosen}
        return ClientResult(upload, {}, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        chosen = uploads["cluster"].cpu()
        models = uploads["m"]
        new = tree_map(torch.clone, server)
        rows = flatten(new)  # the same tensors, written in place
        for j in range(self.hp.num_clusters):
            members = (chosen == j).nonzero().flatten()
            if len(members):  # line 14: average of the models of cluster j
                idx = members.to(next(leaves(models)).device)
                mean = weighted_mean(take(models, idx), info.num_examples[members])
                for k, v in flatten(mean).items():
                    rows[k][j] = v
        info.log.update(clients=info.ids, cluster=chosen)
        return new

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        chosen = self.choose(server, cohort).to(self.ctx.device)
        params, buffers = split_state(cluster_model(server, chosen))
        return Prediction(params, buffers, shared=False)
