"""FedRoD — Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022.

Two predictors on one shared extractor Φ: a generic head g (aggregated) trained with the
balanced-softmax loss, and a personal head p (client state) trained on top of it:
  L_i = BSM(g(Φ(x)), y; n_i) + CE(sg[g(Φ(x))] + p(sg[Φ(x)]), y),
BSM(z, y; n_i) = CE(z + log n_{i,·}, y) with n_{i,c} the client's class counts (their
"balanced risk minimisation" loss); sg = stop-gradient, so the second term trains p only.
Φ and g are averaged with weights n_i (FedAvg); client i is evaluated with the personal
predictor g(Φ(x)) + p(Φ(x)). Choices: the linear personal head (the paper's FedRoD
without hyper-network); p starts as a copy of the initial head; absent classes get
log n = log 1e-12 instead of −∞; since g and p are linear the evaluated model is Φ with
head g + p (exactly the sum of logits). For an MLP the loss's gradient is written out for
the cohort (no autograd, no vmap; tested against autograd).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import (
    Tree,
    cross_entropy_gradient,
    gradient_by,
    linear,
    linear_grads,
    select,
    stack,
)
from ..options import opt, require
from .base import ClientResult, Payload, Prediction, register_algorithm
from .common.global_model import model_state, split_state
from .common.local_stats import label_counts
from .common.losses import cross_entropy
from .common.split import classify, features, is_head, require_linear_head
from .fedavg import FedAvg

PERSONAL = "personal"  # the personal head's parameters inside the trained tree


def balanced_softmax(logits, y, w, counts, gamma: float = 1.0):
    """BSM loss: cross-entropy of logits shifted by γ·log of the client's class counts."""
    return cross_entropy(logits + gamma * torch.log(counts.clamp(min=1e-12)), y, w)


@dataclass(frozen=True)
class FedRoDHyper:
    gamma: float = opt(1.0, "exponent γ of the class counts in the balanced softmax (0 → plain CE)")

    def __post_init__(self) -> None:
        require(self.gamma >= 0, f"algorithm.gamma must be >= 0, got {self.gamma}")


@register_algorithm("fedrod")
class FedRoD(FedAvg):
    Hyper = FedRoDHyper
    personalized = True

    def __init__(self, hyper, ctx) -> None:
        super().__init__(hyper, ctx)
        require_linear_head(ctx, "fedrod")

    def init_client_state(self, server: Tree) -> Tree:
        return {"p": select(self.ctx.initial_params, is_head)}

    def loss_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``loss`` and its gradient for an MLP, the whole cohort at once (tensors [C, …]):
        the BSM term's δ = softmax(g + γ log n) − one-hot reaches g and, through it, Φ;
        the second term's δ (softmax(g + p) − one-hot) reaches p only (stop-gradients)."""
        own = params[PERSONAL]
        z, cache = self.extractor().forward(params, x)  # [C, B, D]
        generic = linear(z, params["head.weight"], params["head.bias"])
        shift = self.hp.gamma * torch.log(extras["counts"].clamp(min=1e-12))  # [C, K]
        bsm, d_generic, _ = cross_entropy_gradient(generic + shift[:, None], y, w)
        personal = linear(z, own["head.weight"], own["head.bias"])
        ce, d_personal, _ = cross_entropy_gradient(generic + personal, y, w)
        grads = self.head_risk_backward(params, cache, z, d_generic, None)
        personal_w, personal_b = linear_grads(d_personal, z)
        grads[PERSONAL] = {"head.weight": personal_w, "head.bias": personal_b}
        return grads, bsm + ce

    @gradient_by(loss_gradient, when=lambda self: self.extractor() is not None, batched=True)
    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        z = features(self.ctx, params, buffers, x)
        generic = classify(self.ctx, select(params, is_head), z)
        personal = classify(self.ctx, params[PERSONAL], z.detach())
        bsm = balanced_softmax(generic, y, w, extras["counts"], self.hp.gamma)
        return bsm + cross_entropy(generic.detach() + personal, y, w)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, _ = self.start_from_broadcast(payload, len(cohort))
        params[PERSONAL] = split_state(state)[0]
        counts = label_counts(self.ctx, cohort.ids)
        out = self.ctx.train(self.loss, params, buffers, cohort, per_client={"counts": counts})
        model = {k: v for k, v in out.params.items() if k != PERSONAL}
        return ClientResult(
            upload=model_state(model, out.buffers),
            state={"p": out.params[PERSONAL]},
            num_examples=cohort.num_examples,
            loss=out.loss,
        )

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(server)
        n = len(cohort)
        personal = split_state(state)[0]
        stacked = stack(params, n)
        for k, v in personal.items():  # g(z) + p(z) = (W_g + W_p) z + (b_g + b_p)
            stacked[k] = stacked[k] + v
        return Prediction(stacked, stack(buffers, n), shared=False)
