"""The local empirical risk every method starts from: the weighted cross-entropy of the
model's output over a minibatch's real samples (``w`` is 0 for the empty slots of a short
batch). The engine owns it so that it can recognise a method that trains nothing else
(``Algorithm.loss`` left as it is) and give it the fused step (``fused.py``) by itself."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def sample_mean(values: Tensor, w: Tensor) -> Tensor:
    """Mean of per-sample ``values`` over the real samples of a minibatch."""
    return (values * w).sum() / w.sum().clamp(min=1.0)


def cross_entropy(logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    return sample_mean(F.cross_entropy(logits, y, reduction="none"), w)
