"""Mean loss of given models on each client's own data, and fresh model initialisations.

Shared by the methods that choose or weight models by local loss (IFCA's cluster choice,
FedFomo's validation weights) and by those that need several independently initialised
models (IFCA's K cluster models).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

from ...data.federated import Split
from ...engine.contract import Context, Tree, torch_seed

EVAL_BATCH = 4096  # samples per forward pass (summed over the cohort)


@torch.no_grad()
def client_losses(
    ctx: Context, params: Tree, buffers: Tree, shared: bool, split: Split, ids: Tensor
) -> Tensor:
    """[C] mean cross-entropy of each client's model (one shared model, or stacked per-client
    models when ``shared`` is False) on that client's rows of ``split``; +inf for a client
    with no rows. BatchNorm runs in eval mode (running statistics), as at test time."""
    sizes = split.sizes()[ids]
    c, m = len(ids), int(sizes.max()) if len(ids) else 0
    total = torch.zeros(c, dtype=torch.float64)
    if m > 0:
        ar = torch.arange(m)
        valid = ar.unsqueeze(0) < sizes.unsqueeze(1)
        rows = (split.offsets[ids].unsqueeze(1) + ar).clamp(max=split.x.shape[0] - 1)
        dev = split.x.device
        ctx.model.eval()

        def loss(p, b, x, y):
            return F.cross_entropy(ctx.forward(p, b, x), y, reduction="none")

        fn = loss if shared else vmap(loss)
        step = max(1, EVAL_BATCH // c)
        for lo in range(0, m, step):
            r = rows[:, lo : lo + step].to(dev)
            if shared:
                ce = loss(params, buffers, split.x[r.reshape(-1)], split.y[r.reshape(-1)])
                ce = ce.reshape(r.shape)
            else:
                ce = fn(params, buffers, split.x[r], split.y[r])
            total += (ce.cpu().double() * valid[:, lo : lo + step]).sum(1)
    out = total / sizes.clamp(min=1)
    return torch.where(sizes > 0, out, torch.full_like(out, float("inf"))).float()


def fresh_init(ctx: Context, index: int, purpose: str) -> tuple[Tree, Tree]:
    """A new random initialisation of the run's model, seeded by (run seed, ``index``,
    ``purpose``): every layer's ``reset_parameters`` under a private torch seed."""
    # drawn on the CPU whatever the run's device: CUDA's generator gives other numbers for
    # the same seed (a run on a GPU would start its extra models elsewhere than on a CPU)
    model = copy.deepcopy(ctx.model).cpu()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(ctx.seed, 0, index, purpose))
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    params = {k: v.detach().to(ctx.device, copy=True) for k, v in model.named_parameters()}
    buffers = {k: v.detach().to(ctx.device, copy=True) for k, v in model.named_buffers()}
    return params, buffers
