"""FedSDR combined with FedAvg and with pFedMe — thesis §4.5.8, Algorithms 3 and 4 (Tang et
al., ICLR 2024). Shortcut discovery (stage 1) is FedSDR's (``fedsdr.ShortcutDiscovery``);
the shortcut-removal loss ℓ_SR = R(f) + γ·Î(Φ; Ψ | Y) replaces the risk of the host method.

``fedsdr-fedavg`` (Alg. 3): the server also keeps a global invariant model f_θ; each client
starts from f_θ^t, trains it on ℓ_SR for the run's local training, keeps the result as its
personalized model f_θu and uploads it; the server averages f_θu uniformly (line 17).
f_θ is the server state's ``g`` (``{"p", "b"}``), beside FedSDR's.
As in Alg. 2, every client trains its personalized model each round (line 4) and only the
sampled ones run stage 1 and upload.
Choice: the box interleaves f, Ψ and ω_e updates per iteration; we run f's epochs first,
against the received Ψ^t, then FedSDR's discovery iterations.

``fedsdr-pfedme`` (Alg. 4): pFedMe with ℓ_SR inside the Moreau envelope: per minibatch K
steps θ_u ← θ_u − η(∇ℓ_SR(θ_u) + μ(θ_u − w_u)), then w_u ← w_u − η_g·μ(w_u − θ_u); the box
reuses γ for the proximal weight, we call it μ (pFedMe's λ, default 15) to keep γ for Î.
θ_u is kept across rounds (the box never resets it) and trains every round on every client
(line 4; a client outside S^t discards its w_u). The server averages w_u uniformly
(line 21: 1/|S^t| Σ). Evaluated with θ_u.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..engine.contract import Tree, stack, weighted_mean
from ..options import opt, require
from .base import ClientResult, Payload, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .fedsdr import FedSDR, FedSDRHyper, ShortcutDiscovery
from .pfedme import PFedMe


@register_algorithm("fedsdr-fedavg")
class FedSDRFedAvg(FedSDR):
    Hyper = FedSDRHyper

    def init(self) -> Tree:
        state = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        return {**self.discovery_init(), "g": state}

    def personal_train(self, broadcast: Tree, state: Tree, cohort):
        """Alg. 3 line 7: f_θu from f_θ^t, the run's local training on ℓ_SR with Ψ^t."""
        n = len(cohort)
        params, buffers = split_state(broadcast["g"])
        return self.ctx.train(
            self.sr_risk,
            stack(params, n, copy=False),  # views: train copies
            stack(buffers, n, copy=False),
            cohort,
            "fedsdr/personal",
            **self.shortcut_rows(broadcast, cohort),
        )

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        f = self.personal_train(payload.broadcast, state, cohort)
        trained = model_state(f.params, f.buffers)
        upload = {**self.discovery_train(payload, cohort), "g": trained}
        return ClientResult(upload, trained, cohort.num_examples, f.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        out = self.discovery_aggregate(server, uploads, info)
        return {**out, "g": weighted_mean(uploads["g"], torch.ones(len(info.ids)))}


@dataclass(frozen=True)
class FedSDRPFedMeHyper(FedSDRHyper):
    mu: float = opt(15.0, "μ: Moreau-envelope weight between θ_u and the local global copy")
    inner_steps: int = opt(5, "K: personal steps per minibatch")
    personal_lr: float = opt(0.1, "η: learning rate of the personal steps")
    beta: float = opt(1.0, "server step β: w ← (1−β)w + β·mean w_u")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.mu > 0, f"algorithm.mu must be > 0, got {self.mu}")
        require(self.inner_steps >= 0, "algorithm.inner_steps must be >= 0")
        require(self.personal_lr > 0 and self.beta > 0, "personal_lr and beta must be > 0")


@register_algorithm("fedsdr-pfedme")
class FedSDRPFedMe(ShortcutDiscovery, PFedMe):
    Hyper = FedSDRPFedMeHyper
    reset_personal = False  # Alg. 4 keeps θ_u across rounds
    trains_unsampled = True  # Alg. 4 line 4: every client's θ_u trains each round

    def init(self) -> Tree:
        return {**PFedMe.init(self), **self.discovery_init()}

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=self.discovery_broadcast(server))

    def prox_weight(self) -> float:
        return self.hp.mu

    def personal_risk(self, theta: Tree, buffers: Tree, extras: Tree, x, y, w):
        return self.sr_risk(theta, buffers, extras, x, y, w)

    def train_extras(self, payload: Payload, cohort) -> dict:
        return self.shortcut_rows(payload.broadcast, cohort)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        result = PFedMe.client_update(self, payload, state, cohort)
        result.upload.update(self.discovery_train(payload, cohort))
        return result

    def update_unsampled(self, server: Tree, state: Tree, cohort) -> Tree:
        """Lines 6-11 for a client outside S^t: θ_u is kept, its w_u is not uploaded."""
        return PFedMe.client_update(self, self.configure(server, cohort), state, cohort).state

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        keys = [k for k in ("p", "b") if k in server and k in uploads]  # w_u's model
        uniform = replace(info, num_examples=torch.ones_like(info.num_examples))  # line 21
        w = PFedMe.aggregate(
            self, {k: server[k] for k in keys}, {k: uploads[k] for k in keys}, uniform
        )
        return self.discovery_aggregate({**server, **w}, uploads, info)
