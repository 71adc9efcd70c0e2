"""Adam-family steps as pure functions over flat trees, and FedOpt's server optimiser.

* :func:`adam_step` — torch.optim.Adam's update without weight decay (Kingma & Ba, "Adam: A
  Method for Stochastic Optimization", ICLR 2015, Algorithm 1, with PyTorch's placement of ε
  outside the bias-corrected √v). PerInvFL's local steps and FedAdam use it.
* FedOpt — Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive
  Federated Optimization", ICLR 2021, Algorithm 2. The server treats the average client
  change as a pseudo-gradient: with Δ_t = Σ_i p_i (x_i − x_t) (p_i the aggregation weights),
  m_t = β1·m_{t−1} + (1 − β1)·Δ_t and
  v_t = v_{t−1} + Δ_t² (FedAdagrad) | v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²) (FedYogi) |
  β2·v_{t−1} + (1 − β2)·Δ_t² (FedAdam), then x_{t+1} = x_t + η·m_t / (√v_t + τ).
  ``sgd`` is x_{t+1} = x_t + η·Δ_t (FedAvg at η = 1, returned as the plain average).

Choices where the paper is silent or where we add to it: m and v start at 0 (Algorithm 2
allows v_{−1} ≥ τ²; τ in the denominator keeps the first step finite); ``server_bias_correction``
adds Adam's 1/(1 − β^t) corrections (FedAdam only), which makes FedAdam with one full-batch
local step of lr 1 exactly centralised full-batch ``torch.optim.Adam`` (ε = τ; tested).
Only parameters (the server state's ``p``) take the adaptive step; buffers (``b``) are
averaged. The optimiser's moments live under ``opt``: ``{"m": {"p": …}, "v": {"p": …}, "k"}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...engine.contract import Tree
from ...options import opt, require

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults
SERVER_OPTS = ("sgd", "adam", "yogi", "adagrad")
OPT = "opt"  # the server state's optimiser sub-tree (never broadcast)


def adaptive_step(
    p: Tree,
    g: Tree,
    m: Tree,
    v: Tree,
    k: Tensor,
    lr: float,
    *,
    betas=ADAM_BETAS,
    eps=ADAM_EPS,
    rule="adam",
    bias_correction=True,
):
    """One step of Adam / Yogi / Adagrad (``rule``) along ``g``; ``k`` = steps done."""
    b1, b2 = betas
    k = k + 1
    m = {n: b1 * m[n] + (1 - b1) * g[n] for n in p}
    if rule == "adam":
        v = {n: b2 * v[n] + (1 - b2) * g[n] ** 2 for n in p}
    elif rule == "yogi":
        v = {n: v[n] - (1 - b2) * g[n] ** 2 * torch.sign(v[n] - g[n] ** 2) for n in p}
    else:  # adagrad
        v = {n: v[n] + g[n] ** 2 for n in p}
    c1, c2 = (1 - b1**k, 1 - b2**k) if bias_correction else (1.0, 1.0)
    p = {n: p[n] - (lr / c1) * m[n] / ((v[n] / c2).sqrt() + eps) for n in p}
    return p, m, v, k


def adam_step(p: Tree, g: Tree, m: Tree, v: Tree, k: Tensor, lr: float):
    """torch.optim.Adam's update (no weight decay, default β and ε) as a pure function."""
    return adaptive_step(p, g, m, v, k, lr)


@dataclass(frozen=True)
class ServerOptHyper:
    """FedOpt's server optimiser (Reddi et al. 2021); the defaults are FedAvg."""

    server_opt: str = opt(
        "sgd", "server optimiser: sgd (η = 1: FedAvg), adam, yogi, adagrad (FedOpt)", SERVER_OPTS
    )
    server_lr: float = opt(1.0, "server learning rate η")
    server_beta1: float = opt(0.9, "β1: server momentum of the pseudo-gradient")
    server_beta2: float = opt(0.99, "β2: decay of the second moment (adam, yogi)")
    server_tau: float = opt(1e-3, "τ: adaptivity added to √v (Reddi et al. tune 1e-5 … 1e-1)")
    server_bias_correction: bool = opt(False, "Adam's bias correction (adam only)")

    def __post_init__(self) -> None:
        require(self.server_opt in SERVER_OPTS, f"algorithm.server_opt must be in {SERVER_OPTS}")
        require(self.server_lr > 0, f"algorithm.server_lr must be > 0, got {self.server_lr}")
        for name in ("server_beta1", "server_beta2"):
            val = getattr(self, name)
            require(0 <= val < 1, f"algorithm.{name} must lie in [0, 1), got {val}")
        require(self.server_tau > 0, f"algorithm.server_tau must be > 0, got {self.server_tau}")

    @property
    def scale_free(self) -> bool:
        """True when the server step ignores the pseudo-gradient's scale (up to τ)."""
        return self.server_opt != "sgd"


def server_opt_state(hp: ServerOptHyper, model: Tree) -> Tree:
    """Initial optimiser state for the parameters (``model["p"]``) of ``model`` ({} for
    sgd): ``{"opt": {"m": {"p": …}, "v": {"p": …}, "k": steps}}``."""
    if not hp.scale_free:
        return {}
    zeros = {k: torch.zeros_like(v) for k, v in model["p"].items()}
    return {OPT: {"m": {"p": zeros}, "v": {"p": dict(zeros)}, "k": torch.zeros(())}}


def model_entries(server: Tree) -> Tree:
    """The server state without the optimiser's entries (what clients receive)."""
    return {k: v for k, v in server.items() if k != OPT}


def server_update(hp: ServerOptHyper, server: Tree, average: Tree) -> Tree:
    """New model and optimiser entries from ``average``, the weighted mean of the uploads."""
    if hp.server_opt == "sgd":
        if hp.server_lr == 1.0:
            return average  # FedAvg exactly, without x + (avg − x) rounding
        x = server["p"]
        stepped = {n: x[n] + hp.server_lr * (a - x[n]) for n, a in average["p"].items()}
        return {k: stepped if k == "p" else a for k, a in average.items()}
    state = server[OPT]
    x = {n: server["p"][n] for n in average["p"]}
    g = {n: x[n] - average["p"][n] for n in x}  # pseudo-gradient −Δ_t
    x, m, v, k = adaptive_step(
        x,
        g,
        state["m"]["p"],
        state["v"]["p"],
        state["k"],
        hp.server_lr,
        betas=(hp.server_beta1, hp.server_beta2),
        eps=hp.server_tau,
        rule=hp.server_opt,
        bias_correction=hp.server_bias_correction and hp.server_opt == "adam",
    )
    return {**average, "p": x, OPT: {"m": {"p": m}, "v": {"p": v}, "k": k}}
