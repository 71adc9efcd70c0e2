"""``mlr``: multinomial logistic regression, ``softmax(W·vec(x) + b)``.

The convex baseline of federated optimisation papers, e.g. McMahan et al., "Communication-
Efficient Learning of Deep Networks from Decentralized Data" (AISTATS 2017) and Li et al.,
"Federated Optimization in Heterogeneous Networks" (FedProx, MLSys 2020). The extractor is
only a flatten, so Φ(x) = vec(x) and every parameter lives in the head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from .base import FedModel
from .layers import require_classes
from .registry import register_model


@dataclass(frozen=True)
class LogisticOptions:
    """Multinomial logistic regression has no options."""


class LogisticRegression(FedModel):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.feature_dim = math.prod(input_shape)
        self.extractor = nn.Flatten(start_dim=-len(input_shape))
        self.head = nn.Linear(self.feature_dim, num_classes)


@register_model("mlr", LogisticOptions, help="multinomial logistic regression (flatten → linear)")
def build_logistic(
    options: LogisticOptions, input_shape: tuple[int, ...], num_classes: int
) -> LogisticRegression:
    require_classes("mlr", num_classes)
    return LogisticRegression(input_shape, num_classes)
