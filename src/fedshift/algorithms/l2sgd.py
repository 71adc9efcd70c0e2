"""L2SGD — Hanzely, Richtárik, "Federated Learning of a Mixture of Global and Local Models",
arXiv 2020 (arXiv:2002.05516), Algorithm 1 (L2GD) with stochastic local gradients.

Objective (eq. 2): min_{x_1..x_n} (1/n) Σ_i f_i(x_i) + λ (1/2n) Σ_i ‖x_i − x̄‖², x̄ = mean of x_i.
Loopless local GD: at every step a coin ξ ~ Bernoulli(p) decides. Tails (prob 1 − p): every
client takes a local step x_i ← x_i − η/(n(1−p)) ∇f_i(x_i); heads (prob p): an averaging step
x_i ← x_i − ηλ/(np) (x_i − x̄), the only step that communicates.

How it runs in the round-based engine (exact in distribution for full participation): the
coin sequence is cut into alternating runs; a round is one run of L ≥ 1 local steps
(L ~ Geometric(p)) followed by one run of A ≥ 1 averaging steps (A ~ Geometric(1 − p)), both
drawn from (seed, round). Consecutive averaging steps leave x̄ unchanged, so A of them are
x_i ← x̄ + (1 − θ)^A (x_i − x̄), θ = ηλ/(np). Clients upload x_i after their L local steps;
the server forms the uniform mean x̄ and (1 − θ)^A; each client applies that averaging at
the start of its next round (and at evaluation). The run's ``lr`` is the local step
η/(n(1−p)), so θ = lr·λ·(1 − p)/p, which must lie in (0, 1]; the run's local_epochs /
local_steps are not used. With partial participation, x̄ is the mean over the round's
participants and a client applies the latest x̄ when it is next sampled.

Defaults (our choice; the paper sweeps λ and p): λ = 1, p = 0.1 (10 local steps per round
on average). BatchNorm buffers are averaged like parameters.
Server state: x̄ as ``{"p": params, "b": buffers}`` and ``"keep"`` = (1 − θ)^A; client
state: x_i as ``{"p", "b"}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, generator, tree_map, weighted_mean
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state


@dataclass(frozen=True)
class L2SGDHyper:
    lambda_: float = opt(1.0, "weight λ of the penalty towards the mean (λ = 0 → Local)")
    p: float = opt(0.1, "probability p of an averaging step (1/p local steps per round)")

    def __post_init__(self) -> None:
        require(self.lambda_ >= 0, f"algorithm.lambda_ must be >= 0, got {self.lambda_}")
        require(0 < self.p < 1, f"algorithm.p must be in (0, 1), got {self.p}")


def pull(state: Tree, mean: Tree, keep: torch.Tensor) -> Tree:
    """x_i ← x̄ + keep·(x_i − x̄) for the floating-point entries (A averaging steps); nested
    trees (``{"p", "b"}``) are walked."""
    return tree_map(lambda v, m: m + keep * (v - m) if v.is_floating_point() else v, state, mean)


@register_algorithm("l2sgd")
class L2SGD(Algorithm):
    Hyper = L2SGDHyper
    personalized = True

    def __init__(self, hyper, ctx) -> None:
        super().__init__(hyper, ctx)
        self.theta = ctx.sgd.lr * hyper.lambda_ * (1 - hyper.p) / hyper.p
        require(
            self.theta <= 1,
            f"l2sgd averaging weight lr·λ·(1−p)/p = {self.theta:.4g} exceeds 1; "
            "lower lr or λ, or raise p",
        )

    def init(self) -> Tree:
        mean = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        return {**mean, "keep": torch.ones(())}  # no pending averaging before round 0

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=server)

    def draws(self, round_: int) -> tuple[int, int]:
        """(L, A): local steps and averaging steps of this round's run of coin flips."""
        rng = generator(self.ctx.seed, round_, 0, "l2sgd/coin")
        return int(rng.geometric(self.hp.p)), int(rng.geometric(1 - self.hp.p))

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        mean = {k: v for k, v in payload.broadcast.items() if k != "keep"}
        start = pull(state, mean, payload.broadcast["keep"])  # last round's averaging
        params, buffers = split_state(start)
        local_steps, _ = self.draws(cohort.round)
        out = self.ctx.train(self.loss, params, buffers, cohort, steps=local_steps)
        new = model_state(out.params, out.buffers)
        return ClientResult(new, new, cohort.num_examples, out.loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        mean = weighted_mean(uploads, torch.ones_like(info.num_examples))  # x̄, uniform
        local_steps, averaging_steps = self.draws(info.round)
        keep = torch.tensor((1 - self.theta) ** averaging_steps)
        info.log.update(local_steps=local_steps, averaging_steps=averaging_steps)
        return {**mean, "keep": keep}

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        mean = {k: v for k, v in server.items() if k != "keep"}
        params, buffers = split_state(pull(state, mean, server["keep"]))
        return Prediction(params, buffers, shared=False)
