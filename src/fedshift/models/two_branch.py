"""Two-branch version of any fedshift model, for DFL (Luo et al., ICML 2022, Fig. 2): an
invariant extractor E_c (the base model's extractor), a specific extractor E_s (a freshly
initialised copy of it) and a predictor on the concatenation [E_c(x), E_s(x)].

Parameter names: ``extractor.invariant.*``, ``extractor.specific.*``, ``head.*``.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from .base import FedModel


class TwoBranchExtractor(nn.Module):
    def __init__(self, invariant: nn.Module, specific: nn.Module) -> None:
        super().__init__()
        self.invariant = invariant
        self.specific = specific

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.invariant(x), self.specific(x)], -1)


class TwoBranch(FedModel):
    def __init__(self, base: FedModel, num_classes: int, seed: int) -> None:
        super().__init__()
        # drawn on the CPU whatever the base's device: CUDA's generator gives other numbers
        # for the same seed, and its state is not forked here
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            specific = copy.deepcopy(base.extractor).cpu()
            for module in specific.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
            head = nn.Linear(2 * base.feature_dim, num_classes)
        device = next(base.parameters()).device
        self.extractor = TwoBranchExtractor(base.extractor, specific).to(device)
        self.head = head.to(device)
        self.feature_dim = 2 * base.feature_dim
