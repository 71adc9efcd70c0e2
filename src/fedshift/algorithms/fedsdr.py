"""FedSDR — X. Tang, S. Guo, J. Zhang, J. Guo, "Learning Personalized Causally Invariant
Representations for Heterogeneous Federated Clients", ICLR 2024 (thesis ch. 4, Algorithm 2).

Stage 1, shortcut discovery (eqs. 4.5–4.6): a global shortcut model ω∘Ψ minimises
ℓ_SD = R(ω∘Ψ) − min(α_th, λ·ℓ_dis), ℓ_dis = E_x[½ Σ_{e,e'} ‖ω_e(Ψ(x)) − ω_e'(Ψ(x))‖²], while
each environment classifier ω_e (linear on Ψ(x)) is fitted by ERM on environment e's data.
Stage 2, shortcut removal (eq. 4.8): each client's personalized model f_u = ω_u∘Φ_u minimises
ℓ_SR = R(f_u) + γ·Î(Φ_u; Ψ | Y), Î the class-centred cross-moment L1 estimator of §4.4.2.

Schedule (Alg. 2, every round from the first): EVERY client trains f_u for K epochs on ℓ_SR
against Ψ^t (line 4: all N devices; the engine's ``update_unsampled`` runs the clients that
are not sampled); the sampled clients S^t then run R local iterations (R = the run's
local_epochs; with local_steps, one iteration of that many steps), each one epoch of ω∘Ψ on
ℓ_SD (environment classifiers fixed) followed by K epochs of the environment classifiers
(Ψ fixed; line 12, ``env_epochs`` = 0 → K), and upload. Alg. 2 has every device run the
discovery iterations too and only S^t upload; the others' Ψ_u, ω_u are discarded, so we skip
them. The server averages Ψ (and ω) uniformly over participants, and each ω_e over the
participants holding environment e (ρ_u^e).
Requires environment ids in the training split (the method's known limitation).
Defaults: λ = 0.5, γ = 1e4 (CMNIST/CFMNIST; 1.4 on WaterBirds), K = 10 (thesis §4.5.2).
Not given by the thesis, ours: α_th = 1.
γ = 0 makes f_u plain local ERM; λ = 0 makes Ψ an ERM model.
Recorded each round (a per-sample Ψ): ``lambda_dis``, the median over participants of
λ·ℓ_dis of their final Ψ and ω_e on their training rows, and ``clamp_open``, the % of
participants for which it ends below α_th. At or above α_th the clamp passes no gradient
and stage 1 trains Ψ as ERM — what happens on CMNIST at every α_th tried
(docs/results/fedsdr-cmnist8-stage1).
For an MLP, ℓ_SD's and ℓ_SR's (moment estimator) gradients are written out, as the
environment classifiers' are (tested against autograd; the same numbers to float rounding);
for a per-sample Ψ (features computed once per iteration) the environment classifiers' K
epochs run on the engine's fused step for grouped linear heads
(``grouped_linear_cross_entropy``; a subclass that changes ``env_logits`` must override
``env_risk``, which drops the mark).
Ours, off by default: other shortcut views and estimators of Î (``shortcut_view``,
``mi_estimator``), in fedsdr_views.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..engine.contract import (
    Tree,
    gradient_by,
    grouped_linear_cross_entropy,
    linear,
    loss_scale,
    stack,
    tree_map,
    weighted_mean,
)
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .common.local_stats import client_rows
from .common.losses import cross_entropy
from .common.representation import (
    class_centred,
    conditional_correlation_l1_gradient,
    conditional_cross_moment_l1,
    environment_disagreement,
    features,
    head,
    one_hot,
    per_sample_model,
)
from .fedsdr_views import ESTIMATORS, SERVER_ONLY, VIEWS, SignatureView, correlation_penalty

ENV = ("env.weight", "env.bias")


@dataclass(frozen=True)
class FedSDRHyper:
    lambda_: float = opt(0.5, "λ: weight of the environment disagreement ℓ_dis (λ = 0 → ERM Ψ)")
    gamma: float = opt(1e4, "γ: weight of Î(Φ_u; Ψ | Y) (1e4 CMNIST/CFMNIST, 1.4 WaterBirds)")
    alpha_th: float = opt(1.0, "α_th: clamp of λ·ℓ_dis in ℓ_SD (ours; the thesis gives none)")
    personal_epochs: int = opt(10, "K: epochs of the personalized model per round")
    env_epochs: int = opt(
        0, "epochs of the environment classifiers per local iteration (0 = K, Alg. 2 line 12)"
    )
    shortcut_view: str = opt(
        "features",
        "what stage 2 decorrelates Φ_u from: 'features' = Ψ(x) (the thesis), 'disagreement' = "
        "the environment classifiers' centred outputs ω_e(Ψ(x)) − mean_e' ω_e'(Ψ(x)) (ours), "
        "'signature' = Ψ(x) projected on the directions whose class means differ between "
        "environments more than between the clients of one environment (ours)",
        VIEWS,
    )
    signature_ridge: float = opt(
        0.1, "signature view: weight of the within-class covariance in the within mean square"
    )
    signature_threshold: float = opt(
        5.0, "signature view: keep the directions whose between/within ratio (F) exceeds this"
    )
    mi_estimator: str = opt(
        "moment",
        "estimator of I(Φ_u; Ψ | Y): 'moment' = L1 norm of the class-centred cross-moment "
        "(thesis §4.4.2), 'correlation' = mean |within-class correlation| (ours, scale-free), "
        "'prediction' = the same between f_u's centred logits and the view (ours)",
        ESTIMATORS,
    )

    def __post_init__(self) -> None:
        require(
            self.shortcut_view in VIEWS,
            f"algorithm.shortcut_view={self.shortcut_view!r}: use one of {', '.join(VIEWS)}",
        )
        require(self.signature_ridge > 0, "algorithm.signature_ridge must be > 0")
        require(self.signature_threshold >= 0, "algorithm.signature_threshold must be >= 0")
        require(
            self.mi_estimator in ESTIMATORS,
            f"algorithm.mi_estimator={self.mi_estimator!r}: use one of {', '.join(ESTIMATORS)}",
        )
        for name in ("lambda_", "gamma", "alpha_th"):
            require(getattr(self, name) >= 0, f"algorithm.{name} must be >= 0")
        require(self.personal_epochs >= 1, "algorithm.personal_epochs must be >= 1")
        require(self.env_epochs >= 0, "algorithm.env_epochs must be >= 0")


class ShortcutDiscovery(SignatureView):
    """Stage 1 and the ℓ_SR loss, shared by FedSDR and its +FedAvg / +pFedMe variants.
    Server state: ``{"sd": {"p", "b"}}`` (ω∘Ψ), ``env.weight`` [E, K, d], ``env.bias`` [E, K]
    and the signature view's ``sig`` tables. Ψ^t reaches stage 2's losses as the extras
    ``{"sp": Ψ's parameters, env.* (and the view's ``{"sig": {"proj"}}``), "sb": buffers}``."""

    def discovery_init(self) -> Tree:
        data = self.ctx.data
        require(
            data.train.env is not None and len(data.train_env_names) > 0,
            f"{self.name} needs a scenario whose training data carry environment ids "
            "(e.g. digits-shortcut, cmnist)",
        )
        e, k, d = len(data.train_env_names), data.num_classes, self.ctx.model.feature_dim
        g = torch.Generator().manual_seed(self.ctx.seed + 1)
        bound = d**-0.5
        env = {
            "env.weight": (torch.rand(e, k, d, generator=g) * 2 - 1) * bound,
            "env.bias": (torch.rand(e, k, generator=g) * 2 - 1) * bound,
        }
        env.update(self.signature_tables(e, k, d))
        state = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        return {"sd": state, **tree_map(lambda v: v.to(self.ctx.device), env)}

    def discovery_broadcast(self, server: Tree) -> Tree:
        """The server state minus the signature view's tables (they stay on the server)."""
        return {
            k: {n: t for n, t in v.items() if n not in SERVER_ONLY} if k == "sig" else v
            for k, v in server.items()
        }

    def env_logits(self, params: Tree, z):
        """ω_e(z) of every environment classifier: [E, B, K] (with a client axis [C, E, B, K])."""
        logits = torch.einsum("...bd,...ekd->...ebk", z, params["env.weight"])
        return logits + params["env.bias"].unsqueeze(-2)

    def sd_loss_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``sd_loss`` and its gradient (Ψ and ω only; the ω_e are fixed here) for an MLP,
        the whole cohort at once (tensors [C, …]). With l_e = ω_e(z) and l̄ their mean over
        environments, ½ Σ_{e,e'} ‖l_e − l_e'‖² has ∂/∂l_e = 2E(l_e − l̄); the clamp passes
        the gradient while λ·ℓ_dis ≤ α_th."""
        z, cache, risk, d_logits = self.head_risk(params, x, y, w)
        env = self.env_logits(params, z)  # [C, E, B, K]
        scaled = self.hp.lambda_ * environment_disagreement(env, w)  # [C]
        passes = (scaled <= self.hp.alpha_th).to(z.dtype)  # ∂(−λ·ℓ_dis)/∂z below
        centred = env - env.mean(-3, keepdim=True)
        d_env = (2 * env.shape[-3] * self.hp.lambda_) * passes[:, None, None, None] * centred
        d_env = d_env * loss_scale(w)[:, None, :, None]
        d_z = -torch.einsum("cebk,cekd->cbd", d_env, params["env.weight"])
        grads = self.head_risk_backward(params, cache, z, d_logits, d_z)
        return grads, risk - torch.clamp(scaled, max=self.hp.alpha_th)

    @gradient_by(sd_loss_gradient, when=lambda self: self.extractor() is not None, batched=True)
    def sd_loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """ℓ_SD = R(ω∘Ψ) − min(α_th, λ·ℓ_dis) (eq. 4.5, practical clamp)."""
        m = self.ctx.model
        z = features(m, params, buffers, x)
        risk = cross_entropy(head(m, params, buffers, z), y, w)
        dis = environment_disagreement(self.env_logits(params, z), w)
        return risk - torch.clamp(self.hp.lambda_ * dis, max=self.hp.alpha_th)

    def env_loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """Σ_e R(ω_e(Ψ); samples of environment e in the batch) (eq. 4.6), Ψ held fixed."""
        z = features(self.ctx.model, params, buffers, x).detach()
        return self.env_risk(params, buffers, extras, z, y, w)

    def env_risk_gradient(self, params: Tree, buffers: Tree, extras: Tree, z, y, w):
        """∇ of ``env_risk`` written out for the whole cohort at once (softmax − one-hot,
        weighted per environment; tensors [C, …]): the step is a linear head on fixed
        features, where autograd's and vmap's fixed costs are most of it. The logits are
        formed transposed, [C, E·K, B] = W·zᵀ, the layout in which both products are one
        plain batched matrix product (3× faster than [C, B, E·K] at E·K = 4, d = 390)."""
        weight, bias = params["env.weight"], params["env.bias"]  # [C, E, K, d], [C, E, K]
        c, e, k, d = weight.shape
        logits = torch.baddbmm(bias.view(c, e * k, 1), weight.view(c, e * k, d), z.mT)
        logp = torch.log_softmax(logits.view(c, e, k, -1), 2)  # [C, E, K, B]
        env = extras["env"]  # [C, B]
        mask = (env[:, None, :] == torch.arange(e, device=env.device)[:, None]).to(w.dtype)
        mask = mask * w[:, None, :]  # [C, E, B]
        scale = mask / mask.sum(2, keepdim=True).clamp(min=1.0)
        target = (y[:, None, :] == torch.arange(k, device=y.device)[:, None]).to(logp.dtype)
        target = target[:, None]  # [C, 1, K, B]
        loss = -(scale * (logp * target).sum(2)).sum((1, 2))
        delta = (logp.exp() - target) * scale[:, :, None]  # ∂loss/∂logits [C, E, K, B]
        grad_w = torch.bmm(delta.view(c, e * k, -1), z).view(c, e, k, d)
        return {"env.weight": grad_w, "env.bias": delta.sum(3)}, loss

    @grouped_linear_cross_entropy("env.weight", "env.bias")
    @gradient_by(env_risk_gradient, batched=True)
    def env_risk(self, params: Tree, buffers: Tree, extras: Tree, z, y, w):
        """Eq. 4.6 on the features z = Ψ(x) (computed once per iteration: Ψ is fixed)."""
        logits = self.env_logits(params, z)  # [E, B, K]
        mask = one_hot(extras["env"], logits.shape[0], w.dtype).T * w  # [E, B]
        per = F.cross_entropy(
            logits.permute(1, 2, 0), y[:, None].expand(-1, logits.shape[0]), reduction="none"
        ).T  # [E, B]
        return ((per * mask).sum(1) / mask.sum(1).clamp(min=1.0)).sum()

    def sr_risk_gradient(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``sr_risk`` and its gradient for an MLP, the whole cohort at once (tensors [C, …];
        Ψ's view of each row precomputed, ``extras["psi"]``). Moment estimator: with C the
        class-centred Ψ (fixed) and M = Σ_b s_b Φ_b C_bᵀ, ∂‖M‖₁/∂Φ_b = s_b·sign(M) C_b; the
        correlation estimators: ``conditional_correlation_l1_gradient`` in Φ (correlation)
        or in the class-centred logits (prediction)."""
        phi, cache, risk, d_logits = self.head_risk(params, x, y, w)
        psi = extras["psi"]  # [C, B, d_Ψ]
        k, gamma = self.ctx.data.num_classes, self.hp.gamma
        value, d_phi = risk, torch.zeros_like(phi)
        if psi.shape[-1] > 0 and self.hp.mi_estimator == "moment":
            centred = class_centred(psi, y, w, k)
            scale = loss_scale(w)[..., None]
            moment = (phi * scale).transpose(-1, -2) @ centred  # [C, d_Φ, d_Ψ]
            value = risk + gamma * moment.abs().sum((-2, -1))
            d_phi = gamma * scale * (centred @ moment.sign().transpose(-1, -2))
        elif psi.shape[-1] > 0 and self.hp.mi_estimator == "correlation":
            penalty, d_signal = conditional_correlation_l1_gradient(phi, psi, y, w, k)
            value, d_phi = risk + gamma * penalty, gamma * d_signal
        elif psi.shape[-1] > 0:  # prediction: f_u's logits centred over the classes
            logits = linear(phi, params["head.weight"], params["head.bias"])
            signal = logits - logits.mean(-1, keepdim=True)
            penalty, d_signal = conditional_correlation_l1_gradient(signal, psi, y, w, k)
            value = risk + gamma * penalty
            d_logits = d_logits + gamma * (d_signal - d_signal.mean(-1, keepdim=True))
        return self.head_risk_backward(params, cache, phi, d_logits, d_phi), value

    @gradient_by(
        sr_risk_gradient,
        when=lambda self: self.extractor() is not None and self.per_sample(),
        batched=True,
    )
    def sr_risk(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """ℓ_SR = R(f_u) + γ·Î(Φ_u; Ψ | Y) (eq. 4.8; Î by ``mi_estimator``, the §4.4.2
        estimator by default); Ψ and the shortcut view's inputs in extras."""
        m = self.ctx.model
        phi = features(m, params, buffers, x)
        logits = head(m, params, buffers, phi)
        risk = cross_entropy(logits, y, w)
        psi = extras["psi"] if "psi" in extras else self.shortcut(extras, x).detach()
        k = self.ctx.data.num_classes
        if psi.shape[1] == 0:  # signature view before any direction was found
            return risk
        if self.hp.mi_estimator == "moment":
            return risk + self.hp.gamma * conditional_cross_moment_l1(phi, psi, y, w, k)
        penalty = correlation_penalty(self.hp.mi_estimator, phi, logits, psi, y, w, k)
        return risk + self.hp.gamma * penalty

    def shortcut(self, extras: Tree, x):
        """The discovered shortcut representation of ``x`` that stage 2 removes."""
        params = extras["sp"]
        psi = features(self.ctx.model, params, extras.get("sb", {}), x)
        if self.hp.shortcut_view == "features":
            return psi
        if self.hp.shortcut_view == "signature":
            return psi @ params["sig"]["proj"]
        logits = self.env_logits(params, psi)  # [E, B, K]
        return (logits - logits.mean(0)).transpose(0, 1).flatten(1)  # [B, E·K]

    def per_sample(self) -> bool:
        """Whether Ψ maps each sample on its own (no batch statistics, no dropout), so that
        its outputs can be computed once per pass instead of at every step."""
        return per_sample_model(self.ctx.model, self.ctx.initial_buffers)

    def shortcut_rows(self, broadcast: Tree, cohort) -> dict:
        """Stage 2's training keywords: Ψ^t and, for a per-sample Ψ, its shortcut view of
        every training row of the cohort, computed once (Ψ^t is fixed during stage 2)."""
        extras = self.psi_extras(broadcast)
        if not self.per_sample():
            return {"shared": extras}
        psi = client_rows(self.ctx, lambda _, e, x: self.shortcut(e, x), cohort, {}, extras)
        return {"shared": extras, "row_extras": {"psi": psi}}

    def psi_extras(self, server: Tree) -> Tree:
        params, buffers = split_state(server["sd"])
        env = {k: server[k] for k in ENV}
        if self.hp.shortcut_view == "signature":
            proj = server["sig"]["proj"]
            env["sig"] = {"proj": proj[:, proj.abs().sum(0) > 0]}  # the directions found so far
        return {"sp": {**params, **env}, "sb": buffers}

    def discovery_train(self, payload: Payload, cohort) -> Tree:
        """R local iterations of stage 1; returns the upload (sd, env.* and the signature
        view's sig)."""
        n, b = len(cohort), payload.broadcast
        stats = self.signature_upload(payload, cohort)
        sd_p, sd_b = split_state(b["sd"])
        params = stack({**sd_p, **{k: b[k] for k in ENV}}, n)
        buffers = stack(sd_b, n)
        iterations = self.ctx.local_epochs or 1
        per_iter = {"epochs": 1} if self.ctx.local_epochs else {"steps": self.ctx.local_steps}
        z = None
        for r in range(iterations):
            out = self.ctx.train(
                self.sd_loss,
                params,
                buffers,
                cohort,
                f"fedsdr/psi{r}",
                trainable=lambda k: k not in ENV,
                **per_iter,
            )
            params, buffers = out.params, out.buffers
            env, z = self.train_environments(params, buffers, cohort, r)
            params = {**params, **env}
        model_p = {k: v for k, v in params.items() if k not in ENV}
        upload = {"sd": model_state(model_p, buffers), **{k: params[k] for k in ENV}, **stats}
        if z is not None:  # a per-sample Ψ: its features of every row are at hand
            upload["lambda_dis"] = self.clamped_disagreement(params, z, cohort)
        return upload

    def clamped_disagreement(self, params: Tree, z, cohort):
        """[C] λ·ℓ_dis of each client's final Ψ and environment classifiers on its training
        rows, the quantity ℓ_SD clamps at α_th: at or above it, −min(α_th, λ·ℓ_dis) passes no
        gradient to Ψ and stage 1 is plain ERM (docs/results/fedsdr-cmnist8-stage1).
        Recorded per round, not used by the method."""
        split, out = self.ctx.data.train, []
        for j, cid in enumerate(cohort.ids.tolist()):
            rows = z[int(split.offsets[cid]) : int(split.offsets[cid + 1])]
            logits = self.env_logits({k: params[k][j] for k in ENV}, rows)
            out.append(environment_disagreement(logits, rows.new_ones(rows.shape[0])))
        return self.hp.lambda_ * torch.stack(out)

    def train_environments(self, params: Tree, buffers: Tree, cohort, r: int):
        """Alg. 2 line 12: the environment classifiers on Ψ's features, Ψ fixed; for a
        per-sample Ψ the features are computed once, not at each of the K epochs' steps.
        Returns the classifiers and those features ([M, d], None for a batch-norm Ψ)."""
        epochs = self.hp.env_epochs or self.hp.personal_epochs
        purpose = f"fedsdr/env{r}"
        if not self.per_sample():
            out = self.ctx.train(
                self.env_loss, params, buffers, cohort, purpose, epochs=epochs,
                trainable=lambda k: k in ENV,
            )  # fmt: skip
            return {k: out.params[k] for k in ENV}, None
        psi = {k: v for k, v in params.items() if k not in ENV}
        z = client_rows(self.ctx, lambda p, _, x: features(self.ctx.model, p, {}, x), cohort, psi)
        env = {k: params[k] for k in ENV}
        trained = self.ctx.train(self.env_risk, env, {}, cohort, purpose, epochs=epochs, inputs=z)
        return trained.params, z

    def discovery_aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        out = dict(server)
        sd = weighted_mean(uploads["sd"], torch.ones(len(info.ids)))  # Alg. 2 l. 18: uniform
        out["sd"] = sd
        envs = self.ctx.data.train.env.cpu()
        client = torch.repeat_interleave(
            torch.arange(self.ctx.data.num_clients), self.ctx.data.train.sizes()
        )
        e = len(self.ctx.data.train_env_names)
        rho = torch.zeros(self.ctx.data.num_clients, e)
        rho[client, envs] = 1.0
        rho = rho[info.ids.cpu()].to(uploads["env.weight"].dtype)  # [C, E] ρ_u^e
        for k in ENV:
            up = uploads[k]  # [C, E, ...]
            shape = rho.shape + (1,) * (up.dim() - 2)
            r = rho.to(up.device).view(shape)
            mean = (up * r).sum(0) / r.sum(0).clamp(min=1.0)
            seen = (rho.sum(0) > 0).to(up.device).view((e,) + (1,) * (up.dim() - 2))
            out[k] = torch.where(seen, mean, server[k])  # Alg. 2 line 19
        self.signature_aggregate(out, uploads, info)
        if "lambda_dis" in uploads:  # stage 1's clamp, as the participants ended it
            scaled = uploads["lambda_dis"].detach().double().cpu()
            info.log["lambda_dis"] = float(scaled.median())
            info.log["clamp_open"] = 100.0 * float((scaled < self.hp.alpha_th).double().mean())
        return out


@register_algorithm("fedsdr")
class FedSDR(ShortcutDiscovery, Algorithm):
    Hyper = FedSDRHyper
    personalized = True
    trains_unsampled = True  # Alg. 2 line 4: every client's f_u trains each round

    def init(self) -> Tree:
        return self.discovery_init()

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=self.discovery_broadcast(server))

    def personal_train(self, broadcast: Tree, state: Tree, cohort):
        """Alg. 2 lines 6-8: K epochs of the personalized model on ℓ_SR with Ψ^t."""
        params, buffers = split_state(state)
        return self.ctx.train(
            self.sr_risk,
            params,
            buffers,
            cohort,
            "fedsdr/personal",
            epochs=self.hp.personal_epochs,
            **self.shortcut_rows(broadcast, cohort),
        )

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        pm = self.personal_train(payload.broadcast, state, cohort)
        upload = self.discovery_train(payload, cohort)  # lines 10-13
        return ClientResult(
            upload, model_state(pm.params, pm.buffers), cohort.num_examples, pm.loss
        )

    def update_unsampled(self, server: Tree, state: Tree, cohort) -> Tree:
        """Line 4: a client outside S^t still trains f_u against Ψ^t (it uploads nothing)."""
        pm = self.personal_train(self.discovery_broadcast(server), state, cohort)
        return model_state(pm.params, pm.buffers)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        return self.discovery_aggregate(server, uploads, info)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)
        return Prediction(params, buffers, shared=False)
