"""pFedMe — T. Dinh, N. H. Tran, T. D. Nguyen, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS 2020.

Objective: min_w (1/N) Σ_i F_i(w), F_i(w) = min_θ { R_i(θ) + (λ/2)‖θ − w‖² } (the Moreau
envelope of client i's risk). Algorithm 1 of the paper, per local step on a minibatch:
K gradient steps (lr ``personal_lr``) from the current θ_i approximately solve the inner
problem, giving θ̃_i; then w_i ← w_i − η·λ(w_i − θ̃_i) (η = the run's lr). After R local
steps (the run's local_epochs / local_steps) the server sets w ← (1 − β)w + β·mean_i w_i.
Each client is evaluated with its personalized model θ_i (pFedMe's "personalized model").

Engine mapping: θ_i and w_i are trained together (one tree: w_i under the model's names,
θ_i under ``"pm"``) by an update rule (``update_rule``: Alg. 1's two lines as written, per
minibatch): the inner problem is solved (``common.proximal.prox_solve``), then θ_i ← θ̃_i
and w_i ← w_i − ηλ(w_i − θ̃_i); the run's momentum and weight decay are not used (the
box has none). Server state: w as
``{"p": params, "b": buffers}``; client state: θ_i in the same form.
For an MLP the whole cohort's K inner steps run at once with the risk's gradient written
out and folded into each weight's update (``MLPChain.prox_descent``), not autograd's. For a
small CNN on a CPU under ``execution = auto`` (``fedavg-cnn``, ``lenet5``, ``cmnist-cnn``)
each client's K inner steps run client after client through the fused CNN step
(``FusedConvStep.prox_descent``, engine/fused_conv.py); a pinned ``execution`` keeps autograd.
θ_i restarts from w at each round (the authors' code). Every client trains every round
(the authors' server, ``serverpFedMe.train``: "do update for all users not only selected
users"); only the sampled clients upload w_i. Under partial participation the others
therefore still refresh their personalized θ_i from the latest w (``update_unsampled``),
at the cost of N clients' local work per round. Defaults (paper, MNIST): λ = 15,
K = 5, personal lr 0.1, β = 1 (β = 1 averages like FedAvg). K = 0 never moves θ̃ from
w, so w stays at the broadcast model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..engine.contract import (
    FusedConvStep,
    SGDConfig,
    Tree,
    batched_update_rule,
    client_by_client,
    stack,
    tree_map,
    update_rule,
    weighted_mean,
)
from ..errors import FedshiftWarning
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .common.losses import cross_entropy
from .common.proximal import prox_solve


@dataclass(frozen=True)
class PFedMeHyper:
    lambda_: float = opt(15.0, "Moreau-envelope weight λ between personal θ_i and local w_i")
    inner_steps: int = opt(5, "K: gradient steps solving the personal problem per minibatch")
    personal_lr: float = opt(0.1, "learning rate of the K personal steps")
    beta: float = opt(1.0, "server step β: w ← (1−β)w + β·mean w_i (β = 1 is plain averaging)")

    def __post_init__(self) -> None:
        require(self.lambda_ > 0, f"algorithm.lambda_ must be > 0, got {self.lambda_}")
        require(self.inner_steps >= 0, "algorithm.inner_steps must be >= 0")
        require(self.personal_lr > 0, "algorithm.personal_lr must be > 0")
        require(self.beta > 0, f"algorithm.beta must be > 0, got {self.beta}")


@register_algorithm("pfedme")
class PFedMe(Algorithm):
    Hyper = PFedMeHyper
    personalized = True
    reset_personal = True  # θ_i starts each round from the received w (authors' code)
    trains_unsampled = True  # the authors' server trains every user, sampled ones upload

    def __init__(self, hyper, ctx) -> None:
        super().__init__(hyper, ctx)
        step = ctx.sgd.lr * self.prox_weight()
        if step > 2:
            warnings.warn(
                f"{self.name}: lr × λ = {step:.3g} > 2, so the local step "
                "w ← w − lr·λ(w − θ̃) throws w past θ̃ by more than their distance and can "
                f"diverge; pFedMe's lr is not an SGD step on the risk (lr ≤ 1/λ = "
                f"{1 / self.prox_weight():.3g} never overshoots)",
                FedshiftWarning,
                stacklevel=2,
            )

    def init(self) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=server)

    def prox_weight(self) -> float:
        return self.hp.lambda_

    def personal_risk(self, theta: Tree, buffers: Tree, extras: Tree, x, y, w):
        """f_i(θ; minibatch), the risk inside the Moreau envelope (FedSDR+pFedMe overrides)."""
        return cross_entropy(self.ctx.forward(theta, buffers, x), y, w)

    def inner_gradient(self):
        """∇ of the inner problem's risk written out for an MLP (its K steps are most of
        pFedMe's work: autograd's fixed cost per step is saved); ``None`` for other models
        and where a subclass changes ``personal_risk`` (FedSDR+pFedMe)."""
        if type(self).personal_risk is not PFedMe.personal_risk:
            return None
        return self.risk_gradient()

    def conv_solver(self) -> FusedConvStep | None:
        """The inner problem's K steps through the fused CNN step, for a small CNN on a CPU
        under ``execution = auto`` and the plain risk (not FedSDR+pFedMe's), else ``None``."""
        if not hasattr(self, "_conv_solver"):
            plain = type(self).personal_risk is PFedMe.personal_risk
            chain = self.ctx.fused_cnn() if plain else None
            keys = tuple(self.ctx.initial_params)
            sgd = SGDConfig(self.hp.personal_lr)
            solver = FusedConvStep(chain, sgd, keys, mu=self.prox_weight()) if chain else None
            self._conv_solver = solver
        return self._conv_solver

    @client_by_client
    @update_rule
    def conv_step(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``local_step`` for one client of a small CNN, its K inner steps fused
        (``FusedConvStep.prox_descent``), equal to ``local_step`` to float rounding."""
        local = {k: v for k, v in params.items() if k != "pm"}
        solved, risk = self.conv_solver().prox_descent(
            params["pm"], local, x, y, w, self.hp.inner_steps
        )
        return {**self.move_towards(local, solved), "pm": solved}, risk

    @update_rule
    def local_step(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """Alg. 1 on one minibatch: K steps on f_i(θ) + λ/2‖θ − w_i‖² give θ̃; then θ ← θ̃,
        w_i ← w_i − ηλ(w_i − θ̃). Logs f_i(θ̃)."""

        def risk(t: Tree):
            return self.personal_risk(t, buffers, extras, x, y, w)

        written = self.inner_gradient()
        gradient = None if written is None else (lambda t: written(t, x, y, w)[0])
        return self.box_step(params, risk, gradient)

    @batched_update_rule
    def cohort_step(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """``local_step`` for the whole cohort at once (tensors [C, …], no ``vmap``), where
        the inner gradient is written out (an MLP): the same update, batched and fused
        (``MLPChain.prox_descent``), equal to ``local_step`` to float rounding."""
        local = {k: v for k, v in params.items() if k != "pm"}
        lam = self.prox_weight()
        solved, risk = self.inner_gradient().net.prox_descent(
            params["pm"], local, x, y, w, lam, self.hp.personal_lr, self.hp.inner_steps
        )
        return {**self.move_towards(local, solved), "pm": solved}, risk

    def box_step(self, params: Tree, risk, gradient):
        """Alg. 1's two lines given the minibatch's risk (and its written gradient, or
        ``None`` for autograd)."""
        local = {k: v for k, v in params.items() if k != "pm"}
        lam = self.prox_weight()
        solved = prox_solve(
            risk, params["pm"], local, lam, self.hp.personal_lr, self.hp.inner_steps, gradient
        )
        return {**self.move_towards(local, solved), "pm": solved}, risk(solved)

    def move_towards(self, local: Tree, solved: Tree) -> Tree:
        """Alg. 1's second line, w_i ← w_i − ηλ(w_i − θ̃), as one ``lerp`` per entry."""
        weight = self.ctx.sgd.lr * self.prox_weight()
        return {k: torch.lerp(v, solved[k], weight) for k, v in local.items()}

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        n = len(cohort)
        received, buffers = split_state(payload.broadcast)
        personal = stack(received, n, copy=False) if self.reset_personal else split_state(state)[0]
        params = {**stack(received, n, copy=False), "pm": personal}  # views: train copies
        step = self.local_step if self.inner_gradient() is None else self.cohort_step
        if self.conv_solver() is not None:
            step = self.conv_step
        out = self.ctx.train(
            step,
            params,
            stack(buffers, n, copy=False),
            cohort,
            **self.train_extras(payload, cohort),
        )
        local = {k: v for k, v in out.params.items() if k != "pm"}
        return ClientResult(
            upload=model_state(local, out.buffers),
            state=model_state(out.params["pm"], out.buffers),
            num_examples=cohort.num_examples,
            loss=out.loss,
        )

    def update_unsampled(self, server: Tree, state: Tree, cohort) -> Tree:
        """A client outside the round's sample trains too; its w_i is not uploaded."""
        return self.client_update(self.configure(server, cohort), state, cohort).state

    def train_extras(self, payload: Payload, cohort) -> dict:
        """Extra keyword arguments of the training call (``shared=`` tensors for subclasses)."""
        return {}

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        """w ← (1 − β)w + β·mean w_i over the entries of ``server`` (``{"p", "b"}``; a
        subclass passes just those of its larger state)."""
        return server_step(server, weighted_mean(uploads, info.num_examples), self.hp.beta)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)
        return Prediction(params, buffers, shared=False)


def server_step(server: Tree, mean: Tree, beta: float) -> Tree:
    """(1 − β)·server + β·mean for every floating-point tensor of ``server`` (nested trees
    walked), ``mean``'s value for the others (integer buffers)."""
    return tree_map(
        lambda v, m: (1 - beta) * v + beta * m if v.is_floating_point() else m, server, mean
    )
