"""Loss terms shared by several methods (never copied between method modules).

All functions act on ONE client's tensors; the trainer vmaps them over the cohort.
``w`` is the per-sample weight of a minibatch (0 for an empty slot of a short batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ...engine.tree import Tree


def weighted_mean(values: Tensor, w: Tensor) -> Tensor:
    """Mean of per-sample ``values`` over the real samples of a minibatch."""
    return (values * w).sum() / w.sum().clamp(min=1.0)


def cross_entropy(logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    return weighted_mean(F.cross_entropy(logits, y, reduction="none"), w)


def squared_distance(a: Tree, b: Tree) -> Tensor:
    """‖a − b‖² summed over the keys of ``b`` (proximal terms: FedProx, Ditto, pFedMe …)."""
    return sum(((a[k] - b[k]) ** 2).sum() for k in b) if b else torch.zeros(())
