"""Persistent per-client state for all N clients, stacked, created lazily from the
algorithm's single-client template. Only the rows of the current cohort are moved to the
compute device; the store itself can live on the CPU to bound device memory."""

from __future__ import annotations

import torch
from torch import Tensor

from .tree import Tree, leaves, put, stack, take, tree_map


class ClientStore:
    def __init__(self, template: Tree, num_clients: int, device: torch.device | str) -> None:
        self.template = template
        self.num_clients = num_clients
        self.device = torch.device(device)
        self.state: Tree | None = None

    def _ensure(self) -> Tree:
        if self.state is None:
            on_device = tree_map(lambda v: v.to(self.device), self.template)
            self.state = stack(on_device, self.num_clients)
        return self.state

    def take(self, ids: Tensor, device: torch.device | str) -> Tree:
        if not self.template:
            return {}
        return tree_map(lambda v: v.to(device), take(self._ensure(), ids.to(self.device)))

    def put(self, ids: Tensor, rows: Tree) -> None:
        if rows:
            put(self._ensure(), ids.to(self.device), rows)

    def nbytes(self) -> int:
        if not self.template:
            return 0
        per = sum(v.numel() * v.element_size() for v in leaves(self.template))
        return per * self.num_clients
