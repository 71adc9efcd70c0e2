"""Loss terms shared by several methods (never copied between method modules).

All functions act on ONE client's tensors; the trainer vmaps them over the cohort.
``w`` is the per-sample weight of a minibatch (0 for an empty slot of a short batch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...engine.contract import Tree, cross_entropy  # noqa: F401  (the engine's risk)
from ...engine.contract import sample_mean as weighted_mean  # noqa: F401  (per-sample mean)


def squared_distance(a: Tree, b: Tree) -> Tensor:
    """‖a − b‖² over the keys both trees have (proximal terms: FedProx, Ditto, pFedMe …).

    ``b`` is often a loss's ``extras``, which may carry more than the anchor model (the
    minibatch's ``env`` ids, noise draws), so keys of ``b`` that ``a`` lacks are skipped."""
    keys = [k for k in b if k in a]
    return sum(((a[k] - b[k]) ** 2).sum() for k in keys) if keys else torch.zeros(())
