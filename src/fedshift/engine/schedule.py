"""Per-client minibatch schedules for one local-training call.

Client ``i`` with ``n_i`` samples takes ``epochs * ceil(n_i / B)`` steps (or a fixed
``steps`` count); its sample order comes from its own generator. The schedule is a dense
``[C, S_max, B]`` index tensor plus a weight tensor: a short last batch of an epoch has
zero-weight slots (they never enter the loss), and steps past a client's own count are
never executed (the trainer drops finished clients from the active batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..data.federated import Split
from .rng import generator


@dataclass
class Schedule:
    index: Tensor  # [C, S_max, B] int64 rows of split.x
    weight: Tensor  # [C, S_max, B] float32, 1 for a real sample, 0 for an empty slot
    steps: Tensor  # [C] int64 steps each client takes

    @property
    def max_steps(self) -> int:
        return int(self.steps.max()) if self.steps.numel() else 0


def client_order(
    n: int, batch_size: int, rng: np.random.Generator, epochs: int | None, steps: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Local sample order of one client as ``(index [S, B], weight [S, B])``."""
    if n == 0:
        return np.zeros((0, batch_size), np.int64), np.zeros((0, batch_size), np.float32)
    if steps is not None:
        need = steps * batch_size
        perms = [rng.permutation(n) for _ in range(-(-need // n))]
        order = np.concatenate(perms)[:need]
        return order.reshape(steps, batch_size), np.ones((steps, batch_size), np.float32)
    per_epoch = -(-n // batch_size)
    idx = np.zeros((epochs, per_epoch * batch_size), np.int64)
    wgt = np.zeros((epochs, per_epoch * batch_size), np.float32)
    for e in range(epochs):
        idx[e, :n] = rng.permutation(n)
        wgt[e, :n] = 1.0
    return idx.reshape(-1, batch_size), wgt.reshape(-1, batch_size)


def make_schedule(
    split: Split,
    ids: Tensor,
    *,
    seed: int,
    round_: int,
    purpose: str,
    batch_size: int | list[int],
    epochs: int | None = None,
    steps: int | None = None,
) -> Schedule:
    """Schedule for clients ``ids`` over ``split`` (exactly one of ``epochs``/``steps``);
    ``batch_size`` is one for all, or one per client of ``ids`` (statistics passes whose
    batch follows the client's size)."""
    if (epochs is None) == (steps is None):
        raise ValueError("give exactly one of epochs or steps")
    sizes = split.sizes()
    batches = batch_size if isinstance(batch_size, list) else [batch_size] * len(ids)
    if len(batches) != len(ids):
        raise ValueError(f"{len(batches)} batch sizes for {len(ids)} clients")
    parts = []
    for cid, batch in zip(ids.tolist(), batches, strict=True):
        n = int(sizes[cid])
        b = batch if batch > 0 else max(n, 1)  # batch_size <= 0: full batch
        idx, wgt = client_order(n, b, generator(seed, round_, cid, purpose), epochs, steps)
        parts.append((idx + int(split.offsets[cid]), wgt))
    c = len(parts)
    s_max = max((p[0].shape[0] for p in parts), default=0)
    b_max = max((p[0].shape[1] for p in parts), default=1)
    index = np.zeros((c, s_max, b_max), np.int64)
    weight = np.zeros((c, s_max, b_max), np.float32)
    for i, (idx, wgt) in enumerate(parts):
        index[i, : idx.shape[0], : idx.shape[1]] = idx
        weight[i, : wgt.shape[0], : wgt.shape[1]] = wgt
    steps_t = torch.tensor([p[0].shape[0] for p in parts], dtype=torch.int64)
    return Schedule(torch.from_numpy(index), torch.from_numpy(weight), steps_t)
