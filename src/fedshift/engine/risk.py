"""The local empirical risk every method starts from: the weighted cross-entropy of the
model's output over a minibatch's real samples (``w`` is 0 for the empty slots of a short
batch). The engine owns it so that it can recognise a method that trains nothing else
(``Algorithm.loss`` left as it is) and give it the fused step (``fused.py``) by itself."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def sample_mean(values: Tensor, w: Tensor) -> Tensor:
    """Mean of per-sample ``values`` over the real samples of a minibatch."""
    return (values * w).sum() / w.sum().clamp(min=1.0)


def cross_entropy(logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    return sample_mean(F.cross_entropy(logits, y, reduction="none"), w)


def loss_scale(w: Tensor) -> Tensor:
    """Per-sample weights of the weighted mean ``Σ_b w_b·ℓ_b / max(Σ_b w_b, 1)``."""
    return w / w.sum(-1, keepdim=True).clamp(min=1.0)


def cross_entropy_gradient(logits: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``cross_entropy`` of one client's minibatch written out with its gradient: (risk,
    δ = ∂risk/∂logits = (softmax − one-hot)·w_b / max(Σw, 1), log-softmax), for gradients
    written by hand (``gradient_by``; vmappable). With a leading client axis (logits
    [C, B, K]) it is every client's at once, the risk [C]."""
    logp = torch.log_softmax(logits, -1)
    scale = loss_scale(w)
    target = (y[..., None] == torch.arange(logits.shape[-1], device=y.device)).to(logits.dtype)
    risk = -(scale * (logp * target).sum(-1)).sum(-1)
    return risk, (logp.exp() - target) * scale[..., None], logp


def gradient_by(
    gradient: Callable, when: Callable | None = None, batched: bool = False
) -> Callable:
    """Mark a loss with its gradient written out: ``gradient(params, buffers, extras, x, y,
    w) -> (gradient of every params entry, loss)`` for one client's batch, which the engine
    calls in place of autograd of the loss. For small steps (a linear head on fixed
    features) autograd's and vmap's fixed cost per step is most of the step; a test must
    check the written gradient against autograd's. For a method's loss, ``when(self)`` says
    whether the written gradient applies (e.g. only for an MLP); otherwise autograd runs.
    ``batched=True``: ``gradient`` takes the whole cohort's stacked tensors (a leading
    client axis on every argument, shared extras included) and returns stacked gradients and
    a loss per client; the engine then calls it without ``vmap`` (whose per-operation cost
    is most of a tiny step: FedSDR's environment classifiers, 0.67 → 0.28 ms a step)."""

    def mark(loss: Callable) -> Callable:
        loss.gradient = gradient
        loss.gradient_when = when
        loss.gradient_batched = batched
        return loss

    return mark


def written_gradient(loss_fn: Callable) -> Callable | None:
    """The gradient a loss was marked with by ``gradient_by`` (bound like the loss), if it
    applies."""
    gradient = getattr(loss_fn, "gradient", None)
    owner = getattr(loss_fn, "__self__", None)
    if gradient is None or owner is None:
        return gradient
    when = getattr(loss_fn, "gradient_when", None)
    if when is not None and not when(owner):
        return None
    return gradient.__get__(owner)
