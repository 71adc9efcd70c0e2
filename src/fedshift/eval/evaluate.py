"""Per-client × per-environment accuracy: every client is evaluated with the model its
algorithm assigns to it (``predictor``) on its own data of every test environment.

A shared (global) prediction is run once over the cohort's rows; personalised predictions
run vmapped over the cohort, each client on its own padded rows with a validity mask. On a
CPU a small CNN (``models/chain.conv_chain``: ``fedavg-cnn``, ``lenet5``, ``cmnist-cnn``)
is run instead by the fused CNN step's forward pass, channels-last, in batches of
``CHAIN_BATCH`` images, personalised models client after client: 4,096 MNIST-sized images
through the FedAvg CNN took 1.9 s as one module call against 0.66 s so (quiet, 2 threads,
2026-11-29), and a vmapped personalised CNN is grouped convolutions over padded rows
besides (W2's evaluation with Ditto's personal models: 20.6 → 2.3 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch
from torch import Tensor
from torch.func import vmap

from ..data.federated import FederatedData, Split
from ..models.chain import Op, chain_forward, conv_chain
from .metrics import SATURATION_GAP

Tree = Mapping[str, Tensor]


class Evaluable(Protocol):
    """What evaluation needs of a run: its model (put in eval mode), its data's class count
    and the model as a function of the parameters (the engine's ``Context`` is one)."""

    model: torch.nn.Module
    data: FederatedData

    def forward(self, params: Tree, buffers: Tree, x: Tensor) -> Tensor: ...


EVAL_BATCH = 4096  # samples per forward pass (summed over the cohort)
CHAIN_BATCH = 256  # images per forward pass of a CNN chain: activations that stay in cache


def _cpu_chain(ctx: Evaluable, buffers: Tree, device: torch.device) -> list[Op] | None:
    """The model's CNN chain where evaluation runs it by hand (a CPU, no buffers)."""
    if device.type != "cpu" or buffers:
        return None
    return conv_chain(ctx.model)


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
    ctx: Evaluable, params: Tree, buffers: Tree, shared: bool, split: Split, ids: Tensor
) -> tuple[Tensor, Tensor]:
    """Correct predictions and sample counts per client of ``ids`` on ``split`` ([C] each)."""
    correct, sizes, _, _ = prediction_counts(ctx, params, buffers, shared, split, ids)
    return correct, sizes


def _guess(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The predicted class, and whether the top logit exceeds the runner-up by more than
    ``SATURATION_GAP`` (eval/metrics.py: the model's logits have blown up)."""
    if logits.shape[-1] < 2:
        return logits.argmax(-1), torch.zeros(logits.shape[:-1], dtype=torch.bool)
    top = logits.topk(2, dim=-1)
    return top.indices[..., 0], (top.values[..., 0] - top.values[..., 1]) > SATURATION_GAP


@torch.no_grad()
def prediction_counts(
    ctx: Evaluable, params: Tree, buffers: Tree, shared: bool, split: Split, ids: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Correct predictions [C], sample counts [C], predicted-class counts [C, K] and rows
    with saturated logits [C] per client of ``ids`` on ``split``; the class counts let
    reports tell a model that reads the input from one that answers the same class
    everywhere (eval/metrics.constant_clients), the saturated rows a model whose logits
    have blown up (eval/metrics.flag_saturated_logits)."""
    k = ctx.data.num_classes
    rows, valid, sizes = _rows(split, ids)
    c, m = rows.shape
    correct = torch.zeros(c, dtype=torch.int64)
    predicted = torch.zeros(c, k, dtype=torch.int64)
    saturated = torch.zeros(c, dtype=torch.int64)
    if m == 0:
        return correct, sizes, predicted, saturated
    dev = split.x.device
    ctx.model.eval()
    chain = _cpu_chain(ctx, buffers, dev)
    if chain is not None:
        return _chain_counts(chain, params, shared, split, rows, valid, sizes, k)
    if shared:
        flat_rows, owner = rows[valid], torch.arange(c).unsqueeze(1).expand(c, m)[valid]
        for lo in range(0, flat_rows.numel(), EVAL_BATCH):
            r = flat_rows[lo : lo + EVAL_BATCH].to(dev)
            who = owner[lo : lo + EVAL_BATCH]
            guess, sat = (t.cpu() for t in _guess(ctx.forward(params, buffers, split.x[r])))
            hit = guess == split.y[r].cpu()
            correct += torch.bincount(who, hit.long(), c).long()
            predicted += torch.bincount(who * k + guess, minlength=c * k).view(c, k)
            saturated += torch.bincount(who, sat.long(), c).long()
        return correct, sizes, predicted, saturated

    def predict(p, b, x):
        return _guess(ctx.forward(p, b, x))

    batched = vmap(predict)
    step = max(1, EVAL_BATCH // c)
    owner = torch.arange(c).unsqueeze(1)
    for lo in range(0, m, step):
        r = rows[:, lo : lo + step].to(dev)
        ok = valid[:, lo : lo + step]
        guess, sat = (t.cpu() for t in batched(params, buffers, split.x[r]))
        hit = guess == split.y[r].cpu()
        correct += (hit & ok).sum(1)
        index = (owner * k + guess)[ok]
        predicted += torch.bincount(index, minlength=c * k).view(c, k)
        saturated += (sat & ok).sum(1)
    return correct, sizes, predicted, saturated


def label_counts(split: Split, ids: Tensor, num_classes: int) -> Tensor:
    """Per-class sample counts [C, K] of the clients ``ids`` on ``split``."""
    rows, valid, _ = _rows(split, ids)
    if rows.shape[1] == 0:
        return torch.zeros(len(ids), num_classes, dtype=torch.int64)
    owner = torch.arange(len(ids)).unsqueeze(1).expand_as(rows)[valid]
    y = split.y[rows[valid]].cpu().long()
    return torch.bincount(owner * num_classes + y, minlength=len(ids) * num_classes).view(
        len(ids), num_classes
    )


def _chain_counts(
    chain: list[Op],
    params: Tree,
    shared: bool,
    split: Split,
    rows: Tensor,
    valid: Tensor,
    sizes: Tensor,
    k: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``prediction_counts`` for a CNN chain on a CPU, ``CHAIN_BATCH`` images at a time:
    the cohort's rows pooled through a shared model, or each client's own rows (no padding)
    through its stacked slice."""
    c = rows.shape[0]
    correct = torch.zeros(c, dtype=torch.int64)
    predicted = torch.zeros(c * k, dtype=torch.int64)
    saturated = torch.zeros(c, dtype=torch.int64)
    owner = torch.arange(c).unsqueeze(1).expand_as(rows)
    parts = [(params, rows[valid], owner[valid])] if shared else []
    for j in range(0 if shared else c):
        model = {name: v[j] for name, v in params.items()}
        parts.append((model, rows[j, valid[j]], owner[j, valid[j]]))
    for model, mine, who in parts:
        for lo in range(0, mine.numel(), CHAIN_BATCH):
            r, w = mine[lo : lo + CHAIN_BATCH], who[lo : lo + CHAIN_BATCH]
            guess, sat = _guess(chain_forward(chain, model, split.x[r])[0])
            correct += torch.bincount(w, (guess == split.y[r]).long(), c).long()
            predicted += torch.bincount(w * k + guess, minlength=c * k)
            saturated += torch.bincount(w, sat.long(), c).long()
    return correct, sizes, predicted.view(c, k), saturated
