"""DRFA — Deng, Kamani, Mahdavi, "Distributionally Robust Federated Averaging", NeurIPS 2020.

Objective (eq. 2): min_w max_{λ ∈ Δ_N} Σ_i λ_i f_i(w), λ mixture weights over the clients.
Algorithm 1 per round s: each participant runs τ local SGD steps from w^(s); the server
draws one snapshot index t' ∈ {0, …, τ−1}, every participant also returns its model after
t' steps, and the server forms w^(s+1) from the final models and the snapshot w^(t') as
their averages. A second, uniformly sampled set U of clients evaluates f_i(w^(t')) on one
minibatch and the server takes the projected ascent step
  λ ← Π_Δ(λ + γ·τ·v),  v_i = (N/|U|)·f_i(w^(t')) for i ∈ U, 0 otherwise.
Choices (from the authors' FedTorch code where the paper leaves room): participants are
sampled uniformly by the engine and their models averaged with weights λ_i (renormalised
over them); λ starts at n_i/n and is floored at 1e-3 after each step; U is the next
round's participants, which evaluate the previous round's snapshot (one exchange per
round), so λ lags one round. τ = ``tau``, else the run's local_steps, else the run's local
epochs × the mean number of minibatches per client. Default γ = 0.1 (authors' code; kept
constant as in Algorithm 1, where their code also decays it).

Server state: ``{"p": parameters, "b": buffers}`` (w^(s)), ``"snap"`` (the same form: the
round's averaged snapshot w^(t')), ``"lambda"`` (λ) and ``"has_snap"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contract import Tree, generator, weighted_mean
from ..options import opt, require
from .base import ClientResult, Payload, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .common.simplex import project_simplex
from .fedavg import FedAvg

FLOOR = 1e-3  # smallest mixture weight kept after a step (authors' code)


def drfa_lambda_step(lam, ids, losses, gamma: float, tau: int):
    """λ ← Π_Δ(λ + γτv) with v_i = (N/|U|)·loss_i on the evaluating clients U = ``ids``,
    then weights below 1e-3 raised to it and λ renormalised."""
    v = torch.zeros_like(lam)
    v[ids] = losses.to(lam.dtype) * (lam.numel() / len(ids))
    new = project_simplex(lam + gamma * tau * v)
    new = torch.where(new <= FLOOR, torch.full_like(new, FLOOR), new)
    return new / new.sum()


@dataclass(frozen=True)
class DRFAHyper:
    gamma: float = opt(0.1, "step size γ of the mixture weights λ (0 → λ stays at n_i/n)")
    tau: int = opt(0, "local SGD steps τ per round (0 = from the run's local steps/epochs)")

    def __post_init__(self) -> None:
        require(self.gamma >= 0, f"algorithm.gamma must be >= 0, got {self.gamma}")
        require(self.tau >= 0, f"algorithm.tau must be >= 0, got {self.tau}")


@register_algorithm("drfa")
class DRFA(FedAvg):
    Hyper = DRFAHyper

    def local_steps(self) -> int:
        ctx = self.ctx
        if self.hp.tau or ctx.local_steps:
            return self.hp.tau or ctx.local_steps
        sizes = ctx.data.train.sizes().float()
        per_epoch = (
            torch.ceil(sizes / ctx.batch_size) if ctx.batch_size > 0 else torch.ones_like(sizes)
        )
        return max(1, round(ctx.local_epochs * float(per_epoch.mean())))

    def init(self) -> Tree:
        sizes = self.ctx.data.train.sizes().double()
        model = super().init()
        return {
            **model,
            "snap": model_state(*split_state(model)),  # w^(t') of round 0: w^(0)
            "lambda": sizes / sizes.sum(),
            "has_snap": torch.zeros(()),
        }

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast={k: v for k, v in server.items() if k != "lambda"})

    def snapshot_step(self, round_: int, tau: int) -> int:
        return int(generator(self.ctx.seed, round_, -1, "drfa/snapshot").integers(0, tau))

    def snapshot_losses(self, snap: Tree, cohort) -> torch.Tensor:
        """f_i(w^(t')) of each client on one minibatch of its own data."""
        params, buffers = split_state(snap)
        sched = self.ctx.schedule(cohort, "drfa/loss", steps=1)
        rows, w = sched.index[:, 0].to(self.ctx.device), sched.weight[:, 0].to(self.ctx.device)
        x, y = self.ctx.data.train.x[rows], self.ctx.data.train.y[rows]
        self.ctx.model.eval()
        with torch.no_grad():
            logits = self.ctx.forward(params, buffers, x.flatten(0, 1)).unflatten(0, w.shape)
            ce = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), y.flatten(), reduction="none"
            )
        ce = ce.view(w.shape)
        return (ce * w).sum(1) / w.sum(1).clamp(min=1.0)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, received = self.start_from_broadcast(payload, len(cohort))
        tau = self.local_steps()
        t_snap = self.snapshot_step(cohort.round, tau)
        losses = torch.zeros(len(cohort), device=self.ctx.device)
        if t_snap > 0:
            first = self.ctx.train(
                self.loss, params, buffers, cohort, steps=t_snap, shared=received
            )
            params, buffers = first.params, first.buffers
            losses = first.loss * t_snap
        snapshot = model_state(params, buffers)
        out = self.ctx.train(
            self.loss,
            params,
            buffers,
            cohort,
            "train/after-snapshot",
            steps=tau - t_snap,
            shared=received,
        )
        upload = {**model_state(out.params, out.buffers), "snap": snapshot}
        previous = payload.broadcast["snap"]
        upload["snap_loss"] = self.snapshot_losses(previous, cohort)  # U = this round's clients
        mean_loss = (losses + out.loss * (tau - t_snap)) / tau
        return ClientResult(upload, {}, cohort.num_examples, mean_loss)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        lam = server["lambda"]
        if bool(server["has_snap"]):
            lam = drfa_lambda_step(
                lam, info.ids, uploads["snap_loss"], self.hp.gamma, self.local_steps()
            )
        model = {k: v for k, v in uploads.items() if k in ("p", "b")}
        new = weighted_mean(model, server["lambda"][info.ids])  # λ-weighted w^(s+1)
        new["snap"] = weighted_mean(uploads["snap"], torch.ones(len(info.ids)))
        info.log["lambda_max"] = float(lam.max())
        return {**new, "lambda": lam, "has_snap": torch.ones(())}
