"""The bi-level local solver of pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, Alg. 1) that
CGPFL (thesis ch. 3, Alg. 1 lines 5–10) reuses: a personalized model θ is pulled towards a
local copy ω̃ of a server model by the Moreau-envelope objective

    F(θ; ω̃) = R(θ) + (λ/2)·‖θ − ω̃‖²,

For r = 1..R local iterations, one minibatch D_r is drawn; θ takes S gradient steps on
F(θ; ω̃) over D_r (lr η), then ω̃ ← ω̃ − β·c·(ω̃ − θ), a gradient step on a regulariser in
ω̃ with weight c = ``omega_weight``: pFedMe's Alg. 1 line 8 (and its code) use c = λ, the
gradient of (λ/2)‖θ − ω̃‖²; CGPFL's Alg. 1 line 10 uses ∇_ω G = (2/N)∇r, c = 2/N.
Runs for a whole cohort at once: the iteration is written for one client and vmapped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.func import grad, vmap

from ...engine.contract import Cohort, Context, Tree
from .losses import cross_entropy, squared_distance


@dataclass
class MoreauResult:
    theta: Tree  # stacked personalized models
    omega: Tree  # stacked local copies ω̃ after R iterations
    buffers: Tree
    loss: Tensor  # [C] mean of F over the R·S inner steps


def moreau_local_update(
    ctx: Context,
    cohort: Cohort,
    theta: Tree,
    omega: Tree,
    buffers: Tree,
    *,
    lambda_: float,
    inner_steps: int,
    inner_lr: float,
    omega_lr: float,
    iterations: int,
    omega_weight: float,
    purpose: str = "train",
) -> MoreauResult:
    """R = ``iterations`` local iterations of pFedMe/CGPFL for every client of ``cohort``.

    ``theta``/``omega``/``buffers`` are stacked over the cohort. A client with no training
    data keeps θ and ω̃ unchanged (its steps are masked out).
    """
    data = ctx.data.train
    sched = ctx.schedule(cohort, purpose, steps=iterations)
    dev = next(iter(theta.values())).device
    active = (sched.steps > 0).to(dev)

    def objective(th, om, bufs, x, y, w):
        risk = cross_entropy(ctx.forward(th, bufs, x), y, w)
        value = risk + 0.5 * lambda_ * squared_distance(th, om)
        return value, value

    def iteration(th, om, bufs, x, y, w):
        total = torch.zeros((), device=x.device)
        for _ in range(inner_steps):  # Alg. 1 lines 6–8: S steps on the same minibatch
            g, value = grad(objective, has_aux=True)(th, om, bufs, x, y, w)
            th = {k: th[k] - inner_lr * g[k] for k in th}
            total = total + value
        # ω̃ ← ω̃ − β·c·(ω̃ − θ) (pFedMe line 8: c = λ; CGPFL line 10: c = 2/N)
        om = {k: om[k] - omega_lr * omega_weight * (om[k] - th[k]) for k in om}
        return th, om, total / inner_steps

    step = vmap(iteration)
    loss = torch.zeros(len(cohort), device=dev)
    idx = sched.index.to(dev)
    wgt = sched.weight.to(dev)
    for r in range(sched.max_steps):
        rows = idx[:, r]
        new_th, new_om, value = step(theta, omega, buffers, data.x[rows], data.y[rows], wgt[:, r])
        keep = active.view(-1)
        theta = {k: _where(keep, new_th[k], theta[k]) for k in theta}
        omega = {k: _where(keep, new_om[k], omega[k]) for k in omega}
        loss = loss + torch.where(keep, value.detach(), torch.zeros_like(value))
    return MoreauResult(theta, omega, buffers, loss / max(sched.max_steps, 1))


def _where(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b)
