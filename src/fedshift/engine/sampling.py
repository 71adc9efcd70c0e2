"""Which clients take part in a round: a seeded draw that depends only on (seed, round)."""

from __future__ import annotations

import torch
from torch import Tensor

from .rng import generator


def clients_per_round(num_clients: int, participation: float, count: int | None) -> int:
    if count:
        return min(count, num_clients)
    return max(1, min(num_clients, round(participation * num_clients)))


def sample_clients(num_clients: int, k: int, seed: int, round_: int) -> Tensor:
    """``k`` distinct client ids in increasing order (all clients when ``k == N``)."""
    if k >= num_clients:
        return torch.arange(num_clients)
    picked = generator(seed, round_, -1, "sample").choice(num_clients, size=k, replace=False)
    return torch.from_numpy(picked).sort().values
