"""Per-client × per-environment accuracy: every client is evaluated with the model its
algorithm assigns to it (``predictor``) on its own data of every test environment.

A shared (global) prediction is run once over the cohort's rows; personalised predictions
run vmapped over the cohort, each client on its own padded rows with a validity mask.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import vmap

from ..data.federated import Split
from ..engine.context import Context
from ..engine.tree import Tree

EVAL_BATCH = 4096  # samples per forward pass (summed over the cohort)


def _rows(split: Split, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Padded row index [C, m_max], validity mask [C, m_max] and sizes [C] of ``ids``."""
    sizes = split.sizes()[ids]
    m = int(sizes.max()) if sizes.numel() else 0
    ar = torch.arange(m)
    valid = ar.unsqueeze(0) < sizes.unsqueeze(1)
    rows = (split.offsets[ids].unsqueeze(1) + ar.unsqueeze(0)).clamp(
        max=max(split.x.shape[0] - 1, 0)
    )
    return rows, valid, sizes


@torch.no_grad()
def correct_counts(
    ctx: Context, params: Tree, buffers: Tree, shared: bool, split: Split, ids: Tensor
) -> tuple[Tensor, Tensor]:
    """Correct predictions and sample counts per client of ``ids`` on ``split`` ([C] each)."""
    rows, valid, sizes = _rows(split, ids)
    c, m = rows.shape
    correct = torch.zeros(c, dtype=torch.int64)
    if m == 0:
        return correct, sizes
    dev = split.x.device
    ctx.model.eval()
    if shared:
        flat_rows, owner = rows[valid], torch.arange(c).unsqueeze(1).expand(c, m)[valid]
        for lo in range(0, flat_rows.numel(), EVAL_BATCH):
            r = flat_rows[lo : lo + EVAL_BATCH].to(dev)
            hit = ctx.forward(params, buffers, split.x[r]).argmax(-1) == split.y[r]
            correct += torch.bincount(owner[lo : lo + EVAL_BATCH], hit.cpu().long(), c).long()
        return correct, sizes

    def predict(p, b, x):
        return ctx.forward(p, b, x).argmax(-1)

    batched = vmap(predict)
    step = max(1, EVAL_BATCH // c)
    for lo in range(0, m, step):
        r = rows[:, lo : lo + step].to(dev)
        hit = (batched(params, buffers, split.x[r]) == split.y[r]).cpu()
        correct += (hit & valid[:, lo : lo + step]).sum(1)
    return correct, sizes
