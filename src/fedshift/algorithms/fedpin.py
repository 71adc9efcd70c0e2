"""FedPIN — X. Tang, S. Guo, J. Guo, J. Zhang, Y. Yu, "Causally Motivated Personalized
Federated Invariant Learning with Shortcut-Averse Information-Theoretic Regularization",
ICML 2024 (thesis ch. 5, Algorithm 5).

Global anchor (eq. 5.5, Prop. 5.4.1):
min_{Φ_g, ω_g} E_u[(1+α)·R(ω_g∘Φ_g; D_u) − α·R(ω_a(Φ_g, u); D_u)]
with ω_a = argmin R(ω_a(Φ_g, u)), an auxiliary classifier of Φ_g(x) and the client index u.
Local (eq. 5.11): an ERM model Ψ_u, and the personalized model ω_u∘Φ_u trained on
R + λ·L_con(Φ_u; Φ_g, Ψ_u) + γ·Var(Φ_u(X)). Per round (Alg. 5): K local steps of Ψ_u, then
K steps of the personalized model against the received Φ_g, then R epochs (the run's
local training) of the global sub-objective; the server averages Φ_g, ω_g, ω_a uniformly over
the participants (Alg. 5's aggregation, 1/|A_t| Σ_u; not weighted by n_u).

Choices: (1) the box's joint gradient step would make ω_a *maximise* its own risk; we follow
Prop. 5.4.1 instead: ω_a descends R_a with Φ_g held fixed while Φ_g receives −α∇R_a (a
gradient-reversal reading). (2) ω_a(z, u) = (W + W_u)z + b + b_u: a linear layer on
[z, one-hot(u), z ⊗ one-hot(u)]. A layer on [z, one-hot(u)] alone could only shift each client's
logits and never see how the z–y relation differs between clients, which is what
I(E,U;Y|Φ_g) measures; each client trains (and uploads) only its own row W_u, b_u.
(3) The thesis lists no values for α, λ, γ, τ, K; the defaults
below are ours (documented in docs/methods/invariant.md). The CMNIST/CFMNIST presets
choose α, λ, γ on validation and record the sweep in their ``tuned`` entries
(docs/results/thesis-5.1-cmnist8-fedpin-select); large γ or λ make the personal models
answer one class (degenerate points there).
(4) Ablations of Table 5.2 are ``variant``: gm (global model), gm-ft (global model
fine-tuned K steps at evaluation), gm-l2 (personal model trained with R + (μ/2)‖θ − θ_g‖²),
pm-lambda0, pm-gamma0, pm.
λ = γ = 0 leaves the personal model to plain local ERM.
On an MLP every objective's gradient is written out for the whole cohort (no autograd):
L_g^u (``global_gradient``), L_loc (``local_gradient``), GM-L2 (``l2_gradient``); Ψ_u's
ERM and GM-FT's fine-tuning are the engine's own risk (its fused step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..engine.contract import (
    Tree,
    cross_entropy_gradient,
    gradient_by,
    linear,
    linear_grads,
    stack,
    weighted_mean,
)
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.adaptive import ServerOptHyper, model_entries, server_opt_state, server_update
from .common.global_model import model_state, split_state
from .common.losses import cross_entropy, squared_distance
from .common.proximal import prox_solve, proximal_gradient, report_as
from .common.representation import (
    contrastive_loss,
    contrastive_loss_gradient,
    feature_variance,
    feature_variance_gradient,
    features,
    head,
)

SHARED_AUX = ("aux.weight", "aux.bias")
CLIENT_AUX = ("aux.client_weight", "aux.client_bias")  # row u belongs to client u
VARIANTS = ("gm", "gm-ft", "gm-l2", "pm-lambda0", "pm-gamma0", "pm")
AUX_INITS = ("aux", "head")


@dataclass(frozen=True)
class FedPINHyper(ServerOptHyper):
    alpha: float = opt(1.0, "α: weight of the I(E,U;Y|Φ_g) estimate in the global objective")
    anneal_rounds: int = opt(
        0,
        "rounds of the global step with α = 0 (ERM) before α applies, as the IRM reference "
        "switches its penalty on late; 0 = α from the first round",
    )
    lambda_: float = opt(1.0, "λ: weight of the contrastive term L_con in the local objective")
    gamma: float = opt(0.1, "γ: weight of the feature-variance (entropy bound) term")
    tau: float = opt(0.5, "τ: temperature of the contrastive loss")
    personal_steps: int = opt(
        10, "K: local minibatch steps of Ψ_u and of the personalized model per round (Alg. 5)"
    )
    personal_epochs: int = opt(
        0, "when > 0, K counts local epochs instead of personal_steps (the pre-fix reading)"
    )
    variant: str = opt("pm", "ablation of thesis Table 5.2 to run and evaluate", VARIANTS)
    l2_weight: float = opt(1.0, "μ of the gm-l2 ablation: (μ/2)‖θ_u − θ_g‖²")
    aux_steps: int = opt(
        0,
        "gradient steps fitting ω_a to the minibatch before Φ_g's reversed step (Prop. 5.4.1's "
        "argmin); 0 = one simultaneous step (the default until measured otherwise)",
    )
    aux_lr: float = opt(1.0, "step size of those ω_a fitting steps")
    aux_init: str = opt(
        "aux",
        "where the ω_a fit starts: aux (ω_a's own weights) or head (ω_g's head, which ω_a's "
        "class holds, so the fit only lowers R_a below R_g; steps aux_lr/L, L = ½E‖[z,1]‖², "
        "the bound on the linear cross-entropy's curvature)",
        AUX_INITS,
    )
    floor: bool = opt(
        False,
        "keep the estimate R_g − R_a of I(E,U;Y|Φ_g) at ≥ 0, as at the exact argmin ω_a "
        "(whose class holds ω_g); without it Φ_g can raise R_a without bound",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.anneal_rounds >= 0, "algorithm.anneal_rounds must be >= 0")
        for name in ("alpha", "lambda_", "gamma", "l2_weight"):
            require(getattr(self, name) >= 0, f"algorithm.{name} must be >= 0")
        require(self.tau > 0, f"algorithm.tau must be > 0, got {self.tau}")
        require(self.personal_steps >= 1, "algorithm.personal_steps must be >= 1")
        require(self.personal_epochs >= 0, "algorithm.personal_epochs must be >= 0 (0 = use steps)")
        require(self.variant in VARIANTS, f"algorithm.variant must be one of {VARIANTS}")
        require(self.aux_steps >= 0, "algorithm.aux_steps must be >= 0")
        require(self.aux_lr > 0, f"algorithm.aux_lr must be > 0, got {self.aux_lr}")
        require(self.aux_init in AUX_INITS, f"algorithm.aux_init must be one of {AUX_INITS}")
        require(
            self.aux_init == "aux" or self.aux_steps >= 1,
            "algorithm.aux_init = head needs aux_steps >= 1 (with 0 steps ω_a would be ω_g)",
        )


def fit_linear(z, y, w, weight, bias, steps: int, lr: float):
    """``steps`` of gradient descent on the w-weighted cross-entropy of a linear layer over
    fixed features z, from (weight, bias): ω_a moved towards its argmin for the current
    Φ_g, as Prop. 5.4.1 defines it (prox_solve with no proximal pull; no graph kept)."""
    if steps == 0:
        return weight, bias
    fitted = prox_solve(
        lambda t: cross_entropy(F.linear(z, t["weight"], t["bias"]), y, w),
        {"weight": weight, "bias": bias},
        {},
        0.0,
        lr,
        steps,
    )
    return fitted["weight"], fitted["bias"]


@register_algorithm("fedpin")
class FedPIN(Algorithm):
    Hyper = FedPINHyper
    personalized = True

    # ---- state -----------------------------------------------------------------------
    def init(self) -> Tree:
        n, k, d = self.ctx.data.num_clients, self.ctx.data.num_classes, self.ctx.model.feature_dim
        g = torch.Generator().manual_seed(self.ctx.seed)
        bound = d**-0.5  # nn.Linear's default initialisation range
        aux = {
            "aux.weight": (torch.rand(k, d, generator=g) * 2 - 1) * bound,
            "aux.bias": (torch.rand(k, generator=g) * 2 - 1) * bound,
            "aux.client_weight": torch.zeros(n, k, d),  # W_u, starts as the shared layer
            "aux.client_bias": torch.zeros(n, k),
        }
        dev = self.ctx.device
        model = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        # the round counter exists only when α is annealed (the default state is unchanged)
        rounds = {"round": torch.zeros(())} if self.hp.anneal_rounds else {}
        return {
            **model,
            **{k_: v.to(dev) for k_, v in aux.items()},
            **server_opt_state(self.hp, model),
            **rounds,
        }

    def init_client_state(self, server: Tree) -> Tree:
        """``{"psi": Ψ_u, "pm": the personalized model}``, each ``{"p", "b"}``."""
        params, buffers = self.ctx.initial_params, self.ctx.initial_buffers
        return {"psi": model_state(params, buffers), "pm": model_state(params, buffers)}

    def configure(self, server: Tree, cohort) -> Payload:
        own = {k: server[k][cohort.ids.to(server[k].device)] for k in CLIENT_AUX}
        return Payload({k: v for k, v in model_entries(server).items() if k not in CLIENT_AUX}, own)

    # ---- losses (one client; Ψ_u's ERM and gm-ft's fine-tuning are the engine's own risk,
    # ``self.loss``, which takes the fused step on an MLP) --------------------------------
    def local_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``local_loss`` and its gradient written out for the whole cohort at once (tensors
        [C, …], no ``vmap``) on an MLP: the head's risk δ, plus ∂/∂Φ_u(x) of λ·L_con
        (against the fixed Φ_g(x) and Ψ_u(x)) and γ·Var(Φ_u(X)), back through Φ_u."""
        ext = self.extractor()
        z, cache, risk, delta = self.head_risk(params, x, y, w)
        # Φ_g is the one broadcast model (the engine gives shared extras a client axis):
        # its features of the cohort's rows as one batch
        anchor_params = {k: v[0] for k, v in extras["gp"].items()}
        anchor = ext.forward(anchor_params, x.flatten(0, 1))[0].view_as(z)
        negatives = ext.forward(extras["sp"], x)[0]
        lam, gam = self.weights()
        con, d_con = contrastive_loss_gradient(z, anchor, negatives, self.hp.tau, w)
        var, d_var = feature_variance_gradient(z, w)
        grads = self.head_risk_backward(params, cache, z, delta, lam * d_con + gam * d_var)
        return grads, risk + lam * con + gam * var

    @gradient_by(local_gradient, when=lambda self: self.extractor() is not None, batched=True)
    def local_loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """L_loc (eq. 5.11) of the personalized model; extras carry Φ_g (g*) and Ψ_u (s*)."""
        m = self.ctx.model
        z = features(m, params, buffers, x)
        risk = cross_entropy(head(m, params, buffers, z), y, w)
        lam, gam = self.weights()
        anchor = features(m, extras["gp"], extras.get("gb", {}), x)
        negatives = features(m, extras["sp"], extras.get("sb", {}), x)
        con = contrastive_loss(z, anchor.detach(), negatives.detach(), self.hp.tau, w)
        return risk + lam * con + gam * feature_variance(z, w)

    def l2_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``l2_loss`` and its gradient for the whole cohort at once, from the MLP's written
        risk gradient."""
        risk = self.risk_gradient()
        return proximal_gradient(risk, self.hp.l2_weight, params, extras["gp"], x, y, w)

    @gradient_by(l2_gradient, when=Algorithm.has_risk_gradient, batched=True)
    def l2_loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """GM-L2 ablation: R(θ_u) + (μ/2)‖θ_u − θ_g‖²."""
        prox = squared_distance(params, extras["gp"])
        return self.loss(params, buffers, extras, x, y, w) + 0.5 * self.hp.l2_weight * prox

    def global_written(self) -> bool:
        """Whether ``global_gradient`` applies: an MLP, and L_g^u in its default form (ω_a's
        own weights, no fitting steps, no floor)."""
        hp = self.hp
        plain = hp.aux_steps == 0 and hp.aux_init == "aux" and not hp.floor
        return plain and self.extractor() is not None

    def global_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``global_loss`` and its gradient written out, for the whole cohort at once (every
        tensor with a leading client axis: ``gradient_by(batched=True)``, no ``vmap``): with
        δ_g, δ_a the scaled (softmax − one-hot) of ω_g and ω_a on z = Φ_g(x), ∇ω_g =
        (1+α)δ_gᵀz, ∇z = (1+α)δ_gW_g − αδ_aW_a (the reversed step of Φ_g), ∇ω_a = δ_aᵀz (its
        own risk on the detached features) for both of ω_a's parts."""
        ext = self.extractor()
        z, cache = ext.forward(params, x)  # [C, B, d]
        a = extras["alpha"]  # [C]
        a3 = a[:, None, None]

        def risk_and_delta(weight, bias):
            return cross_entropy_gradient(linear(z, weight, bias), y, w)[:2]

        head_w = params["head.weight"]
        risk_g, delta_g = risk_and_delta(head_w, params["head.bias"])
        wa = params["aux.weight"] + params["aux.client_weight"]
        risk_a, delta_a = risk_and_delta(wa, params["aux.bias"] + params["aux.client_bias"])
        grads = ext.backward(params, cache, (1 + a3) * (delta_g @ head_w) - a3 * (delta_a @ wa))
        head_gw, head_gb = linear_grads(delta_g, z)
        grads["head.weight"], grads["head.bias"] = (1 + a3) * head_gw, (1 + a[:, None]) * head_gb
        grads["aux.weight"], grads["aux.bias"] = linear_grads(delta_a, z)
        # own tensors: the engine's SGD update may consume a gradient in place
        grads["aux.client_weight"] = grads["aux.weight"].clone()
        grads["aux.client_bias"] = grads["aux.bias"].clone()
        return grads, (1 + a) * risk_g - a * risk_a

    @gradient_by(global_gradient, when=lambda self: self.global_written(), batched=True)
    def global_loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """L_g^u = (1+α)R(ω_g∘Φ_g) − αR(ω_a(Φ_g, u)), ω_a trained on its own risk."""
        m = self.ctx.model
        model_params = {k: v for k, v in params.items() if not k.startswith("aux.")}
        z = features(m, model_params, buffers, x)
        risk_g = cross_entropy(head(m, model_params, buffers, z), y, w)
        wa = params["aux.weight"] + params["aux.client_weight"]
        ba = params["aux.bias"] + params["aux.client_bias"]

        def risk_a(feat, weight, bias):
            return cross_entropy(F.linear(feat, weight, bias), y, w)

        a = extras["alpha"]
        zd, lr = z.detach(), self.hp.aux_lr
        if self.hp.aux_init == "head":  # from ω_g, in steps of 1/L (descent guaranteed)
            w0, b0 = model_params["head.weight"].detach(), model_params["head.bias"].detach()
            sq = (zd**2).sum(-1) + 1  # ‖[z, 1]‖² per sample, mean over the real rows
            lr = lr / (0.5 * (w * sq).sum() / w.sum().clamp(min=1e-12))
        else:
            w0, b0 = wa.detach(), ba.detach()
        wf, bf = fit_linear(zd, y, w, w0, b0, self.hp.aux_steps, lr)
        for_phi = risk_a(z, wf, bf)  # Φ_g sees −α∇R_a at ω_a ≈ argmin (Prop. 5.4.1)
        for_aux = risk_a(z.detach(), wa, ba)  # ω_a = argmin R_a
        if self.hp.floor:  # R_g + α·max(R_g − R_a, 0): a mutual information is ≥ 0
            objective = risk_g + a * torch.clamp(risk_g - for_phi, min=0)
        else:
            objective = (1 + a) * risk_g - a * for_phi
        return report_as(objective + for_aux, objective)

    def k_local(self) -> dict[str, int]:
        """K of Alg. 5 as ctx.train's schedule: K steps, or K epochs when personal_epochs > 0."""
        if self.hp.personal_epochs > 0:
            return {"epochs": self.hp.personal_epochs}
        return {"steps": self.hp.personal_steps}

    def alpha(self, broadcast: Tree) -> torch.Tensor:
        """α of this round: 0 during the first ``anneal_rounds`` rounds, then α."""
        alpha = torch.full((), self.hp.alpha)
        if not self.hp.anneal_rounds:
            return alpha
        return torch.where(broadcast["round"] < self.hp.anneal_rounds, torch.zeros(()), alpha)

    def weights(self) -> tuple[float, float]:
        v = self.hp.variant
        return (
            0.0 if v == "pm-lambda0" else self.hp.lambda_,
            0.0 if v == "pm-gamma0" else self.hp.gamma,
        )

    # ---- round -----------------------------------------------------------------------
    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        n, hp = len(cohort), self.hp
        g_params, g_buffers = split_state(payload.broadcast)
        shared = {"gp": g_params, "gb": g_buffers}
        new_state = dict(state)
        if hp.variant.startswith("pm"):
            # Alg. 5: Ψ_u for K local steps of ERM
            psi_p, psi_b = split_state(state["psi"])
            psi = self.ctx.train(self.loss, psi_p, psi_b, cohort, "fedpin/erm", **self.k_local())
            new_state["psi"] = model_state(psi.params, psi.buffers)
            # personalized model for K local steps with Φ_g^t and Ψ_u
            pm_p, pm_b = split_state(state["pm"])
            pm = self.ctx.train(
                self.local_loss,
                pm_p,
                pm_b,
                cohort,
                "fedpin/personal",
                **self.k_local(),
                shared=shared,
                per_client={"sp": psi.params, "sb": psi.buffers},
            )
            new_state["pm"] = model_state(pm.params, pm.buffers)
        elif hp.variant == "gm-l2":
            pm_p, pm_b = split_state(state["pm"])
            pm = self.ctx.train(
                self.l2_loss,
                pm_p,
                pm_b,
                cohort,
                "fedpin/personal",
                **self.k_local(),
                shared=shared,
            )
            new_state["pm"] = model_state(pm.params, pm.buffers)
        # R local epochs on the global sub-objective L_g^u
        aux = {k: payload.broadcast[k] for k in SHARED_AUX}
        out = self.ctx.train(
            self.global_loss,
            {**stack({**g_params, **aux}, n, copy=False), **payload.per_client},  # views
            stack(g_buffers, n, copy=False),
            cohort,
            "fedpin/global",
            shared={"alpha": self.alpha(payload.broadcast)},
        )
        model_p = {k: v for k, v in out.params.items() if not k.startswith("aux.")}
        upload = {
            **model_state(model_p, out.buffers),
            **{k: out.params[k] for k in SHARED_AUX + CLIENT_AUX},
        }
        return ClientResult(upload, new_state, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        shared = {k: v for k, v in uploads.items() if k not in CLIENT_AUX}
        # Φ_g, ω_g and the shared part of ω_a: Alg. 5's global aggregation, 1/|A_t| Σ_u
        out = weighted_mean(shared, torch.ones(len(info.ids)))
        # the model part may take a FedOpt server step (Adam, as the IRM reference trains)
        model = {k: out[k] for k in ("p", "b") if k in out}
        out.update(server_update(self.hp, server, model))
        if "round" in server:
            out["round"] = server["round"] + 1
        for k in CLIENT_AUX:  # each client's own row of ω_a comes back from that client
            rows = server[k].clone()
            rows[info.ids.to(rows.device)] = uploads[k].to(rows.dtype)
            out[k] = rows
        return out

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        g_params, g_buffers = split_state(server)
        variant = self.hp.variant
        if variant == "gm":
            return Prediction(g_params, g_buffers, shared=True)
        if variant == "gm-ft":
            n = len(cohort)
            out = self.ctx.train(
                self.loss,
                stack(g_params, n, copy=False),  # views: train copies
                stack(g_buffers, n, copy=False),
                cohort,
                "finetune",
                **self.k_local(),
            )
            return Prediction(out.params, out.buffers, shared=False)
        params, buffers = split_state(state["pm"])
        return Prediction(params, buffers, shared=False)
