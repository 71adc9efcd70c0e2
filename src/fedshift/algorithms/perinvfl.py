"""PerInvFL — X. Tang, S. Guo, J. Zhang, "Exploiting Personalized Invariance for Better
Out-of-distribution Generalization in Federated Learning", arXiv 2022 (Algorithm 1).

Client objective (eqs. 2–3): min_θ_i L_INV(θ_i; E_i) + β‖θ_i − ν*‖², ν* = argmin_ν L_INV(ν; {D_i})
with every client one environment of the global problem; L_INV ∈ {IRMv1, GroupDRO}.
Algorithm 1, per local iteration r (one minibatch): S steps
θ_i ← θ_i − η(∇L_INV(θ_i) + 2β(θ_i − ν_{i,r})) on that minibatch, then
ν_{i,r+1} ← ν_{i,r} − γ∇L_INV(ν_{i,r}; D_i); R iterations = the run's local training,
γ = the run's lr. Server: ν ← ν − α(ν − mean_i ν_i).

Choices: IRM uses the IRM reference schedule of ``irm`` (penalty weight 1 for
``anneal_rounds`` rounds, then λ, loss divided by the weight when it exceeds 1), with one
penalty per local environment when the data carry environment ids (the whole client
otherwise). GroupDRO: ν's client loss is N·q_i·R_i (q over clients, updated by the server
from the uploaded losses, η_q), so uniform q is plain ERM; θ_i's local GroupDRO objective is
the worst local-environment risk of the minibatch (= R_i with one local environment).
The θ and ν updates reach the engine as one surrogate loss (common.proximal), so the run's
momentum and weight decay are not used. β → 0 leaves θ_i to local L_INV; α = 0 freezes ν.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.sgd import SGDConfig
from ..engine.tree import Tree, stack, strip_prefix, weighted_mean, with_prefix
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .common.invariance import groupdro_weights, irm_weight, irmv1_penalty
from .common.losses import cross_entropy
from .common.proximal import move_to, prox_solve, report_as
from .common.representation import one_hot


@dataclass(frozen=True)
class PerInvFLHyper:
    inv: str = opt("irm", "invariance objective L_INV", ("irm", "groupdro"))
    beta: float = opt(1.0, "β: weight of ‖θ_i − ν‖² tying the personal model to the global one")
    personal_steps: int = opt(5, "S: personal steps per local iteration")
    personal_lr: float = opt(0.0, "η: learning rate of the personal steps (0 = the run's lr)")
    alpha: float = opt(1.0, "α: server step ν ← ν − α(ν − mean ν_i)")
    irm_lambda: float = opt(91257.0, "IRMv1 penalty weight after annealing (as for irm)")
    anneal_rounds: int = opt(190, "rounds with IRMv1 penalty weight 1 before switching to λ")
    eta_q: float = opt(0.01, "GroupDRO step size of the client weights q")

    def __post_init__(self) -> None:
        require(self.inv in ("irm", "groupdro"), "algorithm.inv must be irm or groupdro")
        for name in ("beta", "personal_lr", "alpha", "irm_lambda", "eta_q"):
            require(getattr(self, name) >= 0, f"algorithm.{name} must be >= 0")
        require(self.personal_steps >= 0, "algorithm.personal_steps must be >= 0")
        require(self.anneal_rounds >= 0, "algorithm.anneal_rounds must be >= 0")


@register_algorithm("perinvfl")
class PerInvFL(Algorithm):
    Hyper = PerInvFLHyper
    personalized = True

    def init(self) -> Tree:
        n = self.ctx.data.num_clients
        state = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        return {**state, "round": torch.zeros(()), "q": torch.full((n,), 1.0 / n)}

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(
            broadcast={k: v for k, v in server.items() if k != "q"},
            per_client={"q": server["q"][cohort.ids.to(server["q"].device)]},
        )

    def env_masks(self, extras: Tree, w):
        """[G, B] sample weights of each local environment of the batch (one group if none)."""
        if "env" not in extras:
            return w[None]
        return one_hot(extras["env"], len(self.ctx.data.train_env_names), w.dtype).T * w

    def local_inv(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """L_INV(θ; local environments) for θ_i."""
        logits = self.ctx.forward(params, buffers, x)
        masks = self.env_masks(extras, w)
        risks = torch.stack([cross_entropy(logits, y, m) for m in masks])
        present = (masks.sum(1) > 0).to(w.dtype)
        if self.hp.inv == "groupdro":  # worst local environment of the batch
            return torch.where(present > 0, risks, torch.full_like(risks, -1e9)).max()
        weight = extras["weight"]
        pen = torch.stack([irmv1_penalty(logits, y, m) for m in masks])
        return ((risks + weight * pen) * present).sum() / torch.clamp(weight, min=1.0)

    def global_inv(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """L_INV^i(ν; D_i), the client as one environment of the global objective (eq. 5),
        and the plain risk R_i(ν) (uploaded: GroupDRO's server step needs it)."""
        logits = self.ctx.forward(params, buffers, x)
        risk = cross_entropy(logits, y, w)
        if self.hp.inv == "groupdro":
            return self.ctx.data.num_clients * extras["q"] * risk, risk
        weight = extras["weight"]
        pen = irmv1_penalty(logits, y, w)
        return (risk + weight * pen) / torch.clamp(weight, min=1.0), risk

    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        nu = {k: v for k, v in params.items() if not k.startswith("pm/")}
        theta = strip_prefix(params, "pm/")
        eta = self.hp.personal_lr or self.ctx.sgd.lr

        def personal(t: Tree):
            return self.local_inv(t, buffers, extras, x, y, w)

        # Alg. 1 line 8: S steps on L_INV(θ) + β‖θ − ν_{i,r}‖² (gradient 2β(θ − ν))
        solved = prox_solve(personal, theta, nu, 2 * self.hp.beta, eta, self.hp.personal_steps)
        g, risk = self.global_inv(nu, buffers, extras, x, y, w)  # line 9, lr γ = run's lr
        return report_as(move_to(theta, solved, self.ctx.sgd.lr) + g, risk)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        n = len(cohort)
        nu, buffers = split_state(payload.broadcast)
        theta, _ = split_state(state)
        weight = irm_weight(payload.broadcast["round"], self.hp.anneal_rounds, self.hp.irm_lambda)
        out = self.ctx.train(
            self.loss,
            {**stack(nu, n), **with_prefix(theta, "pm/")},
            stack(buffers, n),
            cohort,
            sgd=SGDConfig(self.ctx.sgd.lr),
            shared={"weight": weight.to(self.ctx.device)},
            per_client={"q": payload.per_client["q"]},
        )
        local = {k: v for k, v in out.params.items() if not k.startswith("pm/")}
        upload = {**model_state(local, out.buffers), "loss": out.loss}
        new_state = model_state(strip_prefix(out.params, "pm/"), out.buffers)
        return ClientResult(upload, new_state, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        models = {k: v for k, v in uploads.items() if k != "loss"}
        mean = weighted_mean(models, torch.ones(len(info.ids)))  # Alg. 1 line 10: 1/N Σ ν_i
        a = self.hp.alpha
        out = {
            k: server[k] - a * (server[k] - mean[k]) if server[k].is_floating_point() else mean[k]
            for k in mean
        }
        q = server["q"]
        if self.hp.inv == "groupdro":
            q = groupdro_weights(q, info.ids, uploads["loss"].to(q.device), self.hp.eta_q)
        return {**out, "round": server["round"] + 1, "q": q}

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)
        return Prediction(params, buffers, shared=False)
