"""CFL — Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2020.

Objective: FedAvg within clusters, the clusters found by recursive bi-partitioning. Per round
(Algorithm 2 of the paper): every client of cluster c trains from θ_c and uploads its update
Δθ_i; the cluster's update is Δθ_c = Σ_{i∈c} (|D_i|/|D_c|) Δθ_i. If the clients of c sit near
a stationary point of the joint objective, ‖Δθ_c‖ < ε₁, while some still move,
max_i ‖Δθ_i‖ > ε₂, c is split in two by the cosine similarities α_ij = ⟨Δθ_i, Δθ_j⟩ /
(‖Δθ_i‖‖Δθ_j‖), minimising the largest cross-cluster similarity (complete-linkage
agglomerative clustering of −α into 2 clusters, scikit-learn, as the authors' code does).
Each cluster then adds the weighted mean update of its members: θ_c ← θ_c + Δθ_c.

Defaults and choices (from the authors' reference code): ε₁ = 0.4, ε₂ = 1.6, no split in the
first 20 rounds, only clusters of more than 2 clients are split. A cluster is considered for
a split only when all its clients took part in the round (the paper assumes full
participation). Updates are compared as flat vectors of all parameters. Per-round log:
number of clusters, each participant's cluster, and the two norms of every cluster.

Server state: ``{"m": {"p": …, "b": …} (the cluster models, stacked [C, …]), "cluster": [N]}``;
a client uploads ``{"d": Δθ_i (by parameter), "b": its buffers}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sklearn.cluster import AgglomerativeClustering

from ..engine.contract import Tree, leaves, take, tree_map, weighted_mean
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state


@dataclass(frozen=True)
class CFLHyper:
    eps1: float = opt(0.4, "split only if the cluster's mean update norm is below ε₁")
    eps2: float = opt(1.6, "... and some client's update norm is above ε₂")
    warmup_rounds: int = opt(20, "rounds before the first split may happen")
    min_cluster: int = opt(3, "smallest cluster that may be split")

    def __post_init__(self) -> None:
        require(self.eps1 >= 0 and self.eps2 >= 0, "algorithm.eps1 and eps2 must be >= 0")
        require(self.warmup_rounds >= 0, "algorithm.warmup_rounds must be >= 0")
        require(self.min_cluster >= 2, "algorithm.min_cluster must be >= 2")


def bipartition(updates: torch.Tensor) -> torch.Tensor:
    """Labels 0/1 of the rows of ``updates`` [m, d]: two clusters minimising the largest
    cosine similarity between them (complete linkage on −similarity)."""
    u = updates.double()
    unit = u / u.norm(dim=1, keepdim=True).clamp(min=1e-12)
    similarity = (unit @ unit.T).cpu().numpy()
    model = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
    return torch.as_tensor(model.fit(-similarity).labels_, dtype=torch.int64)


def should_split(mean_norm: float, max_norm: float, eps1: float, eps2: float) -> bool:
    """The paper's criterion: near-stationary for the cluster, not for its clients."""
    return mean_norm < eps1 and max_norm > eps2


@register_algorithm("cfl")
class CFL(Algorithm):
    Hyper = CFLHyper
    personalized = True

    def init(self) -> Tree:
        model = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        n = self.ctx.data.num_clients
        clusters = tree_map(lambda v: v.unsqueeze(0).clone(), model)  # [1, ...]
        return {"m": clusters, "cluster": torch.zeros(n, dtype=torch.int64)}

    def models_of(self, server: Tree, ids: torch.Tensor) -> Tree:
        """The cluster model of each client of ``ids`` (stacked)."""
        idx = server["cluster"][ids.to(server["cluster"].device)]
        return take(server["m"], idx)

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(per_client=self.models_of(server, cohort.ids))

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers = split_state(payload.per_client)
        out = self.ctx.train(self.loss, params, buffers, cohort)
        delta = {k: out.params[k] - params[k] for k in params}  # Δθ_i
        upload = {"d": delta, "b": out.buffers}
        return ClientResult(upload, {}, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        hp = self.hp
        assign = server["cluster"].cpu().clone()
        mine = assign[info.ids]  # cluster of each participant
        flat = torch.cat([v.flatten(1) for v in uploads["d"].values()], 1)
        w = info.num_examples.to(flat.device)
        norms, groups = {}, int(assign.max()) + 1
        for c in range(groups):
            rows = (mine == c).nonzero().flatten()
            if not len(rows):
                continue
            wc = w[rows] / w[rows].sum()
            mean_norm = float((wc.unsqueeze(1) * flat[rows]).sum(0).norm())
            max_norm = float(flat[rows].norm(dim=1).max())
            norms[c] = (mean_norm, max_norm)
            whole = len(rows) == int((assign == c).sum())
            if (
                info.round >= hp.warmup_rounds
                and whole
                and len(rows) >= hp.min_cluster
                and should_split(mean_norm, max_norm, hp.eps1, hp.eps2)
            ):
                labels = bipartition(flat[rows])
                moved = info.ids[rows[labels.cpu() == 1]]
                assign[moved] = int(assign.max()) + 1
        old, models = server["cluster"].cpu(), server["m"]
        dev = next(leaves(models)).device
        new = range(groups, int(assign.max()) + 1)  # a new cluster starts from its parent
        parent = list(range(groups)) + [int(old[(assign == c).nonzero()[0, 0]]) for c in new]
        models = take(models, torch.tensor(parent, device=dev))
        mine = assign[info.ids]
        for c in range(len(parent)):
            rows = (mine == c).nonzero().flatten()
            if not len(rows):
                continue
            mean = weighted_mean(take(uploads, rows.to(dev)), info.num_examples[rows])
            for k, v in mean["d"].items():
                models["p"][k][c] += v  # θ_c ← θ_c + Δθ_c
            for k, v in mean.get("b", {}).items():
                models["b"][k][c] = v
        info.log.update(
            clusters=len(parent),
            clients=info.ids,
            cluster=assign[info.ids],
            mean_norm=[norms[c][0] for c in sorted(norms)],
            max_norm=[norms[c][1] for c in sorted(norms)],
        )
        return {"m": models, "cluster": assign}

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(self.models_of(server, cohort.ids))
        return Prediction(params, buffers, shared=False)
