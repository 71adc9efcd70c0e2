"""Per-client statistics over a client's whole local training set (no training): label
counts, feature sums for class centroids (FedPAC), full local gradients (FedIIR), losses,
per-minibatch gradients over a schedule (UCFL's statistics round).

``client_sums`` runs a function over each client's training rows in padded chunks, vmapped
over the cohort, and adds the results up; the function sees a validity mask so padding
never counts. ``client_rows`` keeps a per-sample function's value for every row instead
(a fixed representation's features, computed once rather than at every step). Everything
is per client, so results do not depend on the cohort size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.func import grad, vmap

from ...engine.contract import Cohort, Context, Tree, stack, take, tree_map

CHUNK = 4096  # samples per vmapped call, summed over the cohort
ROWS = 256  # rows per call of client_rows (one client at a time)


def label_counts(ctx: Context, ids: Tensor) -> Tensor:
    """[C, K] float: how many training samples of each class every client holds."""
    split, k = ctx.data.train, ctx.data.num_classes
    rows = [split.y[int(split.offsets[i]) : int(split.offsets[i + 1])] for i in ids.tolist()]
    counts = [torch.bincount(r.cpu(), minlength=k)[:k] for r in rows]
    return torch.stack(counts).float().to(ctx.device)


def client_sums(
    ctx: Context,
    fn: Callable[[Tree, Tree, Tensor, Tensor, Tensor], Tree],
    cohort: Cohort,
    per_client: Tree,
    shared: Tree | None = None,
    labels: Tensor | None = None,
) -> Tree:
    """Σ over chunks of ``fn(per_client_i, shared, x, y, mask)`` for every client i.

    ``labels`` (aligned with the training rows) replaces y, e.g. to group by environment.

    ``fn`` acts on ONE client's chunk (x [m, …], y [m], mask [m] with 1 for real samples)
    and returns a tree of sums; the result is that tree stacked over the cohort.
    """
    split = ctx.data.train
    y = split.y if labels is None else labels
    ids = cohort.ids
    sizes = split.sizes()[ids]
    m = int(sizes.max()) if sizes.numel() else 0
    step = max(1, CHUNK // max(len(cohort), 1))
    batched = vmap(fn, in_dims=(0, None, 0, 0, 0))
    total: Tree = {}
    ctx.model.eval()
    for lo in range(0, max(m, 1), step):
        ar = torch.arange(lo, min(lo + step, max(m, 1)))
        mask = (ar.unsqueeze(0) < sizes.unsqueeze(1)).float()
        rows = (split.offsets[ids].unsqueeze(1) + ar.unsqueeze(0)).clamp(
            max=max(split.x.shape[0] - 1, 0)
        )
        dev = ctx.device
        out = batched(
            per_client, shared or {}, split.x[rows.to(dev)], y[rows.to(dev)], mask.to(dev)
        )
        total = out if not total else tree_map(lambda v, t: t + v, out, total)
    return total


def client_rows(
    ctx: Context,
    fn: Callable[[Tree, Tree, Tensor], Tensor],
    cohort: Cohort,
    per_client: Tree,
    shared: Tree | None = None,
) -> Tensor:
    """``fn(per_client_i, shared, x)`` for every training row of every client i of the
    cohort, as one tensor [M, …] aligned with the training split (the rows of clients
    outside the cohort are zeros): a per-sample map such as a fixed representation's
    features, computed once and handed to ``ctx.train`` as ``inputs`` or ``row_extras``
    instead of recomputing it at every step that sees the row. ``fn`` acts on ONE client's
    chunk (x [m, …]: a view of the training split, which it must not change in place) and
    must treat every sample on its own (no batch statistics).

    Client after client, in chunks of exactly ``ROWS`` rows (the last one padded): every
    call has the same shapes whatever the cohort's width or the client's size, so the
    results are bit for bit the same (a matrix product's rounding may change with its
    shape).
    """
    split = ctx.data.train
    out: Tensor | None = None
    ctx.model.eval()
    last = max(split.x.shape[0] - 1, 0)
    for j, cid in enumerate(cohort.ids.tolist()):
        lo, hi = int(split.offsets[cid]), int(split.offsets[cid + 1])
        mine = take(per_client, j)
        for start in range(lo, hi, ROWS):
            if start + ROWS <= split.x.shape[0]:  # a view: no copy of the chunk's inputs
                chunk = split.x[start : start + ROWS]
            else:  # the split's last rows, padded by repeating the last one
                chunk = split.x[torch.arange(start, start + ROWS).clamp(max=last).to(ctx.device)]
            value = fn(mine, shared or {}, chunk)  # [ROWS, …]
            if out is None:
                out = value.new_zeros((split.y.shape[0], *value.shape[1:]))
            n = min(ROWS, hi - start)
            out[start : start + n] = value[:n]
    if out is None:  # the cohort holds no rows: the shape of one output
        value = fn(take(per_client, 0), shared or {}, split.x[:1])
        out = value.new_zeros((split.y.shape[0], *value.shape[1:]))
    return out


def step_gradients(
    ctx: Context,
    fn: Callable[[Tree, Tree, Tensor, Tensor, Tensor], Tensor],
    params: Tree,
    buffers: Tree,
    schedule,
) -> Tree:
    """∇_params ``fn(params, buffers, x, y, w)`` on every minibatch of ``schedule`` (from
    ``ctx.schedule``) for every client of its cohort, at one shared point ``params`` (a
    statistics pass, nothing is trained): per parameter a tensor [C, S, …]. Each step starts
    from ``buffers`` (batch-norm statistics are the point's, not the previous batch's);
    steps past a client's own count have zero weight. The model's mode is the caller's."""
    per_client = vmap(grad(fn), in_dims=(None, 0, 0, 0, 0))
    split = ctx.data.train
    index = schedule.index.to(split.x.device)
    weight = schedule.weight.to(split.x.device)
    c = index.shape[0]
    out = []
    for s in range(schedule.max_steps):
        rows = index[:, s]
        out.append(
            per_client(params, stack(buffers, c), split.x[rows], split.y[rows], weight[:, s])
        )
    return tree_map(lambda *steps: torch.stack(steps, 1), *out) if out else {}
