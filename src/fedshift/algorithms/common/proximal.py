"""The Moreau-envelope (pFedMe-style) personal step, shared by pFedMe, FedSDR+pFedMe,
PerInvFL and FedPIN: an approximate solve of θ̃ = argmin_θ f(θ) + (λ/2)‖θ − w‖² on one
minibatch (the methods' update rules apply it); FedProx's and Ditto's proximal gradient;
``report_as`` for losses whose logged number is not their own value."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.func import grad

from ...engine.contract import Tree
from .losses import squared_distance


def prox_solve(
    loss: Callable[[Tree], Tensor],
    theta: Tree,
    anchor: Tree,
    lam: float,
    lr: float,
    steps: int,
    gradient: Callable[[Tree], Tree] | None = None,
    *,
    with_value: bool = False,
):
    """``steps`` gradient steps (lr ``lr``) on loss(θ) + (λ/2)‖θ − anchor‖², from ``theta``.
    Runs inside a (vmapped) client step; the result carries no gradient to ``theta`` or
    ``anchor``. ``gradient`` (θ → ∇loss(θ), written out) replaces autograd of ``loss``.
    ``with_value``: also the objective's mean over the steps, each value taken before its
    step, as ``(θ, mean)`` (autograd only: not with ``gradient``)."""
    theta = {k: v.detach() for k, v in theta.items()}
    anchor = {k: v.detach() for k, v in anchor.items()}

    def objective(t: Tree):
        value = loss(t) + 0.5 * lam * squared_distance(t, anchor)
        return value, value

    if gradient is not None:
        if with_value:
            raise ValueError("prox_solve: with_value needs autograd (gradient=None)")
        # θ ← θ − lr·(∇f(θ) + λ(θ − anchor)) = (1 − lr·λ)·θ + lr·λ·anchor − lr·∇f(θ): two
        # passes over θ a step instead of five (the pull's term computed once)
        pull = {k: (lr * lam) * anchor[k] for k in theta}
        for _ in range(steps):
            g = gradient(theta)
            theta = {k: torch.add(pull[k], theta[k], alpha=1 - lr * lam).sub_(g[k], alpha=lr)
                     for k in theta}  # fmt: skip
        return theta
    total = torch.zeros(())
    for _ in range(steps):
        g, value = grad(objective, has_aux=True)(theta)
        if with_value:
            total = total + value
        theta = {k: theta[k] - lr * g[k] for k in theta}
    if with_value:
        return theta, total / steps
    return theta


def proximal_gradient(
    risk_gradient: Callable, weight: float, params: Tree, anchor: Tree, x, y, w
) -> tuple[Tree, Tensor]:
    """∇ and value of R(θ) + (weight/2)‖θ − anchor‖² (over the keys both trees have, as
    ``squared_distance``) from the risk's written gradient ``risk_gradient(θ, x, y, w)``:
    FedProx's and Ditto's local objectives without autograd, for the whole cohort at once
    (``gradient_by(batched=True)``: a leading client axis on every tensor, a value per
    client)."""
    grads, risk = risk_gradient(params, x, y, w)
    distance = torch.zeros_like(risk)
    for k in anchor:
        if k in params:
            gap = params[k] - anchor[k]
            grads[k] = grads[k] + weight * gap
            distance = distance + (gap**2).flatten(1).sum(1)
    return grads, risk + 0.5 * weight * distance


def report_as(surrogate: Tensor, value: Tensor) -> Tensor:
    """``surrogate``'s gradient with ``value``'s number (so training logs show a real loss)."""
    return surrogate - surrogate.detach() + value.detach()
