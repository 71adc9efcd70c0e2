"""FedBN — Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization", ICLR 2021.

Objective: FedAvg's, except that every client keeps its own BatchNorm layers: the BN affine
parameters (γ, β) and running statistics never leave the client and are never averaged;
all other parameters are averaged as in FedAvg (Algorithm 1 of the paper).

Choices: with a model without BatchNorm layers FedBN is exactly FedAvg (a warning says
so; tested); use e.g. ``dfl-cnn`` or ``resnet18``. Each client's BN layers start from the
model's initialisation.
Evaluation: the shared layers of the global model with the client's own BN layers.

``local = "statistics"`` keeps only the BN running statistics local and averages γ, β
with the other weights: "FedAvg + local BN statistics" (SiloBN's split, Andreux et al.,
MICCAI DCL 2020), the baseline that tells how much of a method's gain on feature-skewed
clients (DFL on bgcolor-MNIST) per-client normalisation alone gives. ``local = "all"``
(default) is FedBN.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..engine.contract import Tree, select, stack
from ..errors import FedshiftWarning
from ..models.layers import batchnorm_keys
from ..options import opt
from .base import ClientResult, Payload, Prediction, register_algorithm
from .common.global_model import GlobalModelAlgorithm, model_state, split_state


@dataclass(frozen=True)
class FedBNHyper:
    local: str = opt(
        "all",
        "BatchNorm state kept per client: all (γ, β, statistics: FedBN) or statistics only",
        choices=("all", "statistics"),
    )


@register_algorithm("fedbn")
class FedBN(GlobalModelAlgorithm):
    Hyper = FedBNHyper
    personalized = True

    def __init__(self, hyper, ctx) -> None:
        super().__init__(hyper, ctx)
        self.bn = batchnorm_keys(ctx.model)
        if hyper.local == "statistics":  # the buffers only: γ, β are averaged
            self.bn = {k for k in self.bn if k in ctx.initial_buffers}
        if not self.bn:
            warnings.warn(
                "fedbn: the model has no BatchNorm layers, so FedBN is FedAvg here; "
                "use a model with BatchNorm (e.g. model=dfl-cnn or resnet18)",
                FedshiftWarning,
                stacklevel=2,
            )

    def split(self, tree: Tree) -> tuple[Tree, Tree]:
        """(shared part, local BN part) of a model's parameters or buffers (its own names)."""
        return select(tree, lambda k: k not in self.bn), select(tree, lambda k: k in self.bn)

    def init(self) -> Tree:
        params, buffers = self.ctx.initial_params, self.ctx.initial_buffers
        return model_state(self.split(params)[0], self.split(buffers)[0])

    def init_client_state(self, server: Tree) -> Tree:
        params, buffers = self.ctx.initial_params, self.ctx.initial_buffers
        return model_state(self.split(params)[1], self.split(buffers)[1])

    def full_model(self, shared: Tree, local: Tree, n: int) -> tuple[Tree, Tree]:
        """Stacked client models: broadcast shared layers (read-only views: ``ctx.train``
        copies what it trains) + each client's BN layers."""
        gp, gb = split_state(shared)
        # a client state without BN parameters (local = "statistics") or without any BN
        # layer has empty parts, which a checkpoint does not keep
        lp, lb = local.get("p", {}), local.get("b", {})
        return {**stack(gp, n, copy=False), **lp}, {**stack(gb, n, copy=False), **lb}

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers = self.full_model(payload.broadcast, state, len(cohort))
        out = self.ctx.train(self.loss, params, buffers, cohort)
        (sp, lp), (sb, lb) = self.split(out.params), self.split(out.buffers)
        return ClientResult(model_state(sp, sb), model_state(lp, lb), cohort.num_examples, out.loss)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = self.full_model(server, state, len(cohort))
        return Prediction(params, buffers, shared=False)
