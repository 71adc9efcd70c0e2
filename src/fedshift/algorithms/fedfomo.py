"""FedFomo — Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First
Order Model Optimization", ICLR 2021.

Objective: each client i finds the model that does best on its own validation data, by a
first-order step towards the models of other clients. Per round (Algorithm 1 of the paper):
the server sends client i the latest models θ_n of M other clients; the client weights them
by validation-loss improvement per unit distance,
w_n = (L_i(θ_i) − L_i(θ_n)) / ‖θ_n − θ_i‖ (eq. 5), and sets
θ_i ← θ_i + Σ_n [max(w_n, 0) / Σ_m max(w_m, 0)] (θ_n − θ_i) (eq. 6; unchanged if no w_n > 0);
then trains locally and uploads θ_i and its weights w_n. The server keeps every client's
latest model and an affinity matrix P (P_in += w_n) and picks the M models for client i
ε-greedily: with probability ε at random, otherwise the M largest P_in.

Defaults and choices (our reading of the paper's experiments): M = 5, ε = 0.3 decaying by
0.05 per round to 0. Validation data: the scenario's first validation split (held out from
training in the label-shift scenarios); ``validation = train`` uses the training data
instead. A client with no validation rows (``scenario.val_fraction = 0`` or a client too
small to hold one out) cannot score the downloaded models: all its w_n are 0, so by eq. 6
it keeps its own model and trains locally (the paper's clients always hold validation
data; tested in tests/algorithms/test_fedfomo.py). The draws are seeded per
(seed, round, client). Clients never sampled hold the initial model. Communication: M
models go down to each client (counted in the payload).

Server state: ``{"m": {"p": …, "b": …} (every client's latest model, stacked [N, …]),
"P": [N, N]}``; client state: its model ``{"p": …, "b": …}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, flatten, generator, leaves, put, take, tree_map
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.client_loss import client_losses
from .common.global_model import model_state, split_state


@dataclass(frozen=True)
class FedFomoHyper:
    num_models: int = opt(5, "models M each client downloads per round")
    epsilon: float = opt(0.3, "initial probability ε of downloading random models")
    epsilon_decay: float = opt(0.05, "ε decreases by this much per round (to 0)")
    validation: str = opt("val", "data that weights the models", choices=("val", "train"))

    def __post_init__(self) -> None:
        require(self.num_models >= 1, "algorithm.num_models must be >= 1")
        require(0 <= self.epsilon <= 1, "algorithm.epsilon must be in [0, 1]")
        require(self.epsilon_decay >= 0, "algorithm.epsilon_decay must be >= 0")


def fomo_weights(own_loss, other_loss, distance):
    """w_n of eq. 5 ([C, M]); 0 where a model coincides with the client's own, and 0 where
    a loss is not finite (a client with no validation rows scores every model +inf, and
    inf − inf would make the weights, then the model, NaN)."""
    w = (own_loss.unsqueeze(1) - other_loss) / distance.clamp(min=1e-12)
    scored = (distance > 0) & torch.isfinite(own_loss).unsqueeze(1) & torch.isfinite(other_loss)
    return torch.where(scored, w, torch.zeros_like(w))


@register_algorithm("fedfomo")
class FedFomo(Algorithm):
    Hyper = FedFomoHyper
    personalized = True

    def __init__(self, hyper, ctx) -> None:
        super().__init__(hyper, ctx)
        n = ctx.data.num_clients
        require(n >= 2, "fedfomo needs at least 2 clients")
        self.m = min(hyper.num_models, n - 1)
        if hyper.validation == "val":
            require(
                bool(ctx.data.val),
                "fedfomo: this scenario has no validation split; set algorithm.validation=train",
            )
            self.val = next(iter(ctx.data.val.values()))
        else:
            self.val = ctx.data.train

    def init(self) -> Tree:
        n = self.ctx.data.num_clients
        one = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        models = tree_map(lambda v: v.unsqueeze(0).repeat(n, *([1] * v.dim())), one)
        return {"m": models, "P": torch.zeros(n, n)}

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def select(self, server: Tree, cohort) -> torch.Tensor:
        """[C, M] clients whose models each client downloads (ε-greedy on P)."""
        n, eps = (
            self.ctx.data.num_clients,
            max(self.hp.epsilon - self.hp.epsilon_decay * cohort.round, 0.0),
        )
        rows = []
        for i in cohort.ids.tolist():
            rng = generator(self.ctx.seed, cohort.round, i, "fedfomo/select")
            others = torch.tensor([j for j in range(n) if j != i])
            if rng.random() < eps:
                pick = others[torch.as_tensor(rng.permutation(n - 1)[: self.m])]
            else:  # top-M affinity; random order first so that ties break at random
                shuffled = others[torch.as_tensor(rng.permutation(n - 1))]
                order = torch.argsort(server["P"][i, shuffled].cpu(), descending=True, stable=True)
                pick = shuffled[order[: self.m]]
            rows.append(pick)
        return torch.stack(rows)

    def configure(self, server: Tree, cohort) -> Payload:
        sel = self.select(server, cohort)
        models = server["m"]
        dev = next(leaves(models)).device
        return Payload(per_client={**take(models, sel.to(dev)), "sel": sel})  # [C, M, ...]

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        own_p, own_b = split_state(state)
        ids, ctx = cohort.ids, self.ctx
        own_loss = client_losses(ctx, own_p, own_b, False, self.val, ids)
        losses, dists = [], []
        downloaded = {k: v for k, v in payload.per_client.items() if k != "sel"}  # [C, M, …]
        for j in range(self.m):  # eq. 5 for each downloaded model
            p, b = split_state(tree_map(lambda v, j=j: v[:, j], downloaded))
            losses.append(client_losses(ctx, p, b, False, self.val, ids))
            sq = sum(((p[k] - own_p[k]) ** 2).flatten(1).sum(1) for k in own_p)
            dists.append(sq.sqrt().cpu())
        w = fomo_weights(own_loss, torch.stack(losses, 1), torch.stack(dists, 1))
        pos = w.clamp(min=0)
        coef = (pos / pos.sum(1, keepdim=True).clamp(min=1e-12)).to(ctx.device)  # eq. 6

        def step(v, others):
            if not v.is_floating_point():
                return v
            c = coef.view(*coef.shape, *([1] * (v.dim() - 1)))
            return v + (c * (others - v.unsqueeze(1))).sum(1)

        received = payload.per_client
        start = {
            part: {k: step(v, received[part][k]) for k, v in own.items()}
            for part, own in state.items()
        }
        params, buffers = split_state(start)
        out = ctx.train(self.loss, params, buffers, cohort)
        new = model_state(out.params, out.buffers)
        upload = {"m": new, "w": w, "sel": payload.per_client["sel"]}
        return ClientResult(upload, new, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        new = tree_map(torch.clone, server)
        # written through the flat views (the same tensors): an empty "b" of a model without
        # buffers may be missing on one side after a checkpoint round trip
        put(flatten(new["m"]), info.ids, flatten(uploads["m"]))
        rows = info.ids.unsqueeze(1).expand_as(uploads["sel"]).cpu()
        P = new["P"].cpu()
        P.index_put_((rows, uploads["sel"].cpu()), uploads["w"].cpu().float(), accumulate=True)
        new["P"] = P.to(server["P"].device)
        info.log.update(positive_weights=(uploads["w"] > 0).sum(1))
        return new

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)
        return Prediction(params, buffers, shared=False)
