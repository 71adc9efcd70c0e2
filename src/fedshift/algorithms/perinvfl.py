"""PerInvFL — X. Tang, S. Guo, J. Zhang, "Exploiting Personalized Invariance for Better
Out-of-distribution Generalization in Federated Learning", arXiv 2022 (Algorithm 1).

Client objective (eqs. 2–3): min_θ_i L_INV(θ_i; E_i) + β‖θ_i − ν*‖², ν* = argmin_ν L_INV(ν; {D_i})
with every client one environment of the global problem; L_INV ∈ {IRMv1, GroupDRO}.
Algorithm 1, per local iteration r: S steps θ_i ← θ_i − η(∇L_INV(θ_i; E_train^i) + 2β(θ_i −
ν_{i,r})), then ν_{i,r+1} ← ν_{i,r} − γ∇L_INV(ν_{i,r}; D_i). Both gradients are on the client's
whole training set (``batch = "client"``, the default: one local iteration = one full-batch
step, R = the run's local_epochs or local_steps); ``batch = "minibatch"`` uses the run's
batch size instead (the IRMv1 penalty of a minibatch is a biased estimate: the square of a
minibatch mean). γ = the run's lr. Server: ν ← ν − α(ν − mean_i ν_i).

Choices (the paper's implementation section is empty; its RC-MNIST model, two hidden
layers of 390, is the tuned MLP of the IRMv1 reference code, so we take that recipe):
* IRM: penalty weight 1 for ``anneal_rounds`` rounds, then λ = 91257, the loss divided by
  the weight when it exceeds 1 (as ``irm``), one penalty per local environment when the data
  carry environment ids (the whole client otherwise). The prox term is rescaled with it:
  θ_i descends (L_INV + β‖θ − ν‖²) / max(1, λ), so its weight relative to L_INV is β, as in
  eq. 3 and line 8 (adding it to the rescaled L_INV would weigh it λβ ≈ 9e4·β).
* ``optimizer = "adam"`` (default): lines 8 and 9 are Adam steps (torch defaults β = (0.9,
  0.999), ε = 1e-8) along the gradients Alg. 1 names, with lrs η and γ. Dividing the loss by
  λ only keeps the step size under a scale-invariant optimiser; under plain SGD the ERM term
  vanishes after annealing and ν stops moving (measured: rcmnist stayed the colour model).
  Each client keeps its Adam moments for θ_i and ν_i across rounds (a client's optimiser
  persists, as in pFedMe-style code); ν_{i,0} = ν^t still restarts every round. The local
  iteration is an update rule (``update_rule``): it computes every new value (θ, ν, moments,
  step counts) and the engine stores them. ``"sgd"`` keeps plain steps (lrs η, γ as
  written; the run's momentum and weight decay are not used).
* ``anneal_rounds`` counts rounds (default 1); the reference anneals for 190 full-batch
  steps of 501, so with ``batch = "client"`` and R local iterations per round the
  reference schedule is ``anneal_rounds = 190 / R`` and 501 / R rounds (the rcmnist and
  rcfmnist presets: R = 1, 190 and 501). With ``"minibatch"``, one local epoch at the
  paper's size (12,500 images, batch 64) is 196 steps, hence the default 1.
* GroupDRO: ν's client loss is N·q_i·R_i (q over clients, updated by the server from the
  uploaded losses, η_q), so uniform q is plain ERM; θ_i's local GroupDRO objective is the
  worst local-environment risk of the minibatch (= R_i with one local environment).
β → 0 leaves θ_i to local L_INV; α = 0 freezes ν.
Known limit: θ_i and ν share one set of normalisation buffers (none in the RC-MNIST MLPs;
the WaterBirds ResNet-18 would mix their running statistics; docs/methods/invariant.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import grad

from ..engine.contract import Tree, stack, tree_map, update_rule, weighted_mean
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.adaptive import ADAM_BETAS, ADAM_EPS, adam_step  # noqa: F401 (re-export)
from .common.global_model import model_state, split_state
from .common.invariance import groupdro_weights, irm_weight, irmv1_penalty
from .common.losses import cross_entropy, squared_distance
from .common.proximal import prox_solve
from .common.representation import one_hot

ADAM_KEYS = ("am", "av", "ak")  # Adam first / second moments and step counts
PERSONAL = "pm"  # θ_i beside ν_i in the trained tree, and θ_i's part of each Adam entry


@dataclass(frozen=True)
class PerInvFLHyper:
    inv: str = opt("irm", "invariance objective L_INV", ("irm", "groupdro"))
    beta: float = opt(1.0, "β: weight of ‖θ_i − ν‖² tying the personal model to the global one")
    personal_steps: int = opt(5, "S: personal steps per local iteration")
    personal_lr: float = opt(0.0, "η: learning rate of the personal steps (0 = the run's lr)")
    alpha: float = opt(1.0, "α: server step ν ← ν − α(ν − mean ν_i)")
    irm_lambda: float = opt(91257.0, "IRMv1 penalty weight after annealing (as for irm)")
    anneal_rounds: int = opt(1, "rounds with IRMv1 penalty weight 1 before switching to λ")
    eta_q: float = opt(0.01, "GroupDRO step size of the client weights q")
    batch: str = opt(
        "client",
        "data of one local iteration: client (the client's whole training set, Alg. 1 lines "
        "8-9) or minibatch (the run's batch_size)",
        ("client", "minibatch"),
    )
    optimizer: str = opt(
        "adam",
        "local optimiser of θ (line 8) and ν (line 9): adam (the IRM reference recipe's; each "
        "client keeps its Adam state across rounds) or sgd (plain steps, as Alg. 1 is written)",
        ("adam", "sgd"),
    )

    def __post_init__(self) -> None:
        require(self.inv in ("irm", "groupdro"), "algorithm.inv must be irm or groupdro")
        require(self.optimizer in ("sgd", "adam"), "algorithm.optimizer must be sgd or adam")
        require(self.batch in ("client", "minibatch"), "algorithm.batch: client or minibatch")
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
        """θ_i as ``{"p", "b"}``; under Adam also the moments of ν_i and θ_i, ``am`` and
        ``av`` (``{<ν's names>, "pm": {<θ's names>}}``), and their step counts
        ``ak = {"nu", "pm"}``."""
        state = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        if self.hp.optimizer == "adam":  # per-client Adam state of ν_i and of θ_i
            model = {**self.ctx.initial_params, PERSONAL: dict(self.ctx.initial_params)}
            m, v = (tree_map(torch.zeros_like, model) for _ in range(2))
            steps = {"nu": torch.zeros(()), PERSONAL: torch.zeros(())}
            state = {**state, "am": m, "av": v, "ak": steps}
        return state

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

    def prox_weight(self, extras: Tree):
        """β, divided by the IRMv1 weight when L_INV is (so β stays relative to L_INV)."""
        if self.hp.inv == "groupdro":
            return self.hp.beta
        return self.hp.beta / torch.clamp(extras["weight"], min=1.0)

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

    def global_gradient(self, nu: Tree, buffers: Tree, extras: Tree, x, y, w):
        """Line 9's gradient ∇_ν L_INV^i(ν; D_i), and the plain risk R_i(ν)."""
        return grad(lambda q: self.global_inv(q, buffers, extras, x, y, w), has_aux=True)(nu)

    @update_rule
    def local_step(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """One local iteration r (Alg. 1 lines 8–9): new θ_i, ν_i (and Adam state); logs
        the plain risk R_i(ν_{i,r})."""
        if self.hp.optimizer == "adam":
            return self.adam_iteration(params, buffers, extras, x, y, w)
        nu = {k: v for k, v in params.items() if k != PERSONAL}
        eta = self.hp.personal_lr or self.ctx.sgd.lr

        def personal(t: Tree):
            return self.local_inv(t, buffers, extras, x, y, w)

        # line 8: S steps on (L_INV(θ) + β‖θ − ν_{i,r}‖²) / max(1, λ)
        beta = self.prox_weight(extras)
        theta = prox_solve(personal, params[PERSONAL], nu, 2 * beta, eta, self.hp.personal_steps)
        g, risk = self.global_gradient(nu, buffers, extras, x, y, w)  # line 9, lr γ = run's lr
        gamma = self.ctx.sgd.lr
        return {**{k: v - gamma * g[k] for k, v in nu.items()}, PERSONAL: theta}, risk

    def adam_iteration(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """Lines 8–9 with Adam steps along Alg. 1's gradients: the new θ, ν and their Adam
        moments and step counts."""
        hp = self.hp
        nu = {k: v for k, v in params.items() if k not in (PERSONAL, *ADAM_KEYS)}
        m, v = params["am"], params["av"]

        beta = self.prox_weight(extras)

        def personal(t: Tree):  # line 8: ∇(L_INV(θ) + β‖θ − ν_{i,r}‖²) / max(1, λ)
            return self.local_inv(t, buffers, extras, x, y, w) + beta * squared_distance(t, nu)

        theta, mt, vt = (d[PERSONAL] for d in (params, m, v))
        kt = params["ak"][PERSONAL]
        for _ in range(hp.personal_steps):
            g = grad(personal)(theta)
            theta, mt, vt, kt = adam_step(theta, g, mt, vt, kt, hp.personal_lr or self.ctx.sgd.lr)

        g, risk = self.global_gradient(nu, buffers, extras, x, y, w)  # line 9, lr γ = run's lr
        mn, vn = ({k: d[k] for k in nu} for d in (m, v))
        nu, mn, vn, kn = adam_step(nu, g, mn, vn, params["ak"]["nu"], self.ctx.sgd.lr)
        new = {
            **nu,
            PERSONAL: theta,
            "am": {**mn, PERSONAL: mt},
            "av": {**vn, PERSONAL: vt},
            "ak": {"nu": kn, PERSONAL: kt},
        }
        return new, risk

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        n = len(cohort)
        nu, buffers = split_state(payload.broadcast)
        theta, _ = split_state(state)
        adam = {k: v for k, v in state.items() if k in ADAM_KEYS}
        weight = irm_weight(payload.broadcast["round"], self.hp.anneal_rounds, self.hp.irm_lambda)
        schedule = {}
        if self.hp.batch == "client":  # R full-batch iterations
            schedule = {"steps": self.ctx.local_epochs or self.ctx.local_steps, "batch_size": 0}
        out = self.ctx.train(
            self.local_step,
            {**stack(nu, n, copy=False), PERSONAL: theta, **adam},  # views: train copies
            stack(buffers, n, copy=False),
            cohort,
            shared={"weight": weight.to(self.ctx.device)},
            per_client={"q": payload.per_client["q"]},
            **schedule,
        )
        local = {k: v for k, v in out.params.items() if k not in (PERSONAL, *ADAM_KEYS)}
        upload = {**model_state(local, out.buffers), "loss": out.loss}
        new_state = model_state(out.params[PERSONAL], out.buffers)
        new_state.update({k: v for k, v in out.params.items() if k in ADAM_KEYS})
        return ClientResult(upload, new_state, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        models = {k: v for k, v in uploads.items() if k != "loss"}
        mean = weighted_mean(models, torch.ones(len(info.ids)))  # Alg. 1 line 10: 1/N Σ ν_i
        out = server_step(server, mean, self.hp.alpha)
        q = server["q"]
        if self.hp.inv == "groupdro":
            q = groupdro_weights(q, info.ids, uploads["loss"].to(q.device), self.hp.eta_q)
        return {**out, "round": server["round"] + 1, "q": q}

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)
        return Prediction(params, buffers, shared=False)


def server_step(server: Tree, mean: Tree, alpha: float) -> Tree:
    """ν ← ν − α(ν − mean ν_i) for every floating-point tensor of ``mean`` (nested trees
    walked), ``mean``'s value for the others (integer buffers)."""
    return tree_map(lambda m, v: v - alpha * (v - m) if v.is_floating_point() else m, mean, server)
