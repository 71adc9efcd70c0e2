"""Functional SGD over stacked state, with PyTorch's semantics (momentum without dampening,
L2 weight decay added to the gradient): ``buf ← μ·buf + (g + λ·p)``, ``p ← p − η·buf``.
Starting from ``buf = 0`` gives PyTorch's first step (``buf = g + λ·p``) without a branch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..options import require


@dataclass(frozen=True)
class SGDConfig:
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        require(self.lr > 0, f"lr must be positive, got {self.lr}")
        require(0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}")
        require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")


def sgd_step(
    params: dict[str, Tensor], grads: dict[str, Tensor], bufs: dict[str, Tensor], cfg: SGDConfig
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    new_p, new_b = {}, {}
    for k, g in grads.items():
        p = params[k]
        d = g + cfg.weight_decay * p if cfg.weight_decay else g
        b = cfg.momentum * bufs[k] + d if cfg.momentum else d
        new_p[k] = p - cfg.lr * b
        new_b[k] = b
    return new_p, new_b


def sgd_update_(
    params: dict[str, Tensor], grads: dict[str, Tensor], bufs: dict[str, Tensor], cfg: SGDConfig
) -> None:
    """:func:`sgd_step` in place on (views of) stacked ``params`` and ``bufs``: one pass over
    each parameter instead of fresh tensors plus a copy back (the gradients are consumed)."""
    for k, g in grads.items():
        p = params[k]
        if cfg.weight_decay:
            g = g.add_(p, alpha=cfg.weight_decay)
        if cfg.momentum:
            g = bufs[k].mul_(cfg.momentum).add_(g)
        p.add_(g, alpha=-cfg.lr)
