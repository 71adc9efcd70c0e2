"""Every fedshift model is ``head(extractor(x))``: the extractor Φ and head ω are named
submodules, so parameter names start with ``extractor.`` or ``head.`` and methods that
share only one part (FedRep, FedRoD, FedPIN, FedSDR, DFL) select by prefix."""

from __future__ import annotations

from torch import Tensor, nn


class FedModel(nn.Module):
    """Base class: subclasses set ``self.extractor`` and ``self.head`` in ``__init__``.

    ``feature_dim`` is the size of Φ(x) (the head's input). Models must run under
    ``torch.func.functional_call`` + ``vmap``: no in-place ops on parameters, no
    data-dependent Python control flow in ``forward``. BatchNorm is allowed: its running
    statistics are buffers, stacked per client like parameters, and under ``vmap`` each
    client's statistics are updated from its own batch only.
    """

    extractor: nn.Module
    head: nn.Module
    feature_dim: int

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.extractor(x))

    def features(self, x: Tensor) -> Tensor:
        return self.extractor(x)
