"""``mlp``: multilayer perceptron with ReLU hidden layers.

The "2NN" of McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (AISTATS 2017) is ``hidden=[200, 200]`` (784-200-200-10); the default
``[100]`` is the one-hidden-layer network of many personalised-FL baselines. The extractor is
flatten + every hidden layer (Φ(x) is the last hidden activation), the head the last Linear.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from ..options import opt, require
from .base import FedModel
from .layers import require_classes
from .registry import register_model


@dataclass(frozen=True)
class PerceptronOptions:
    hidden: list[int] = opt([100], "sizes of the hidden layers, e.g. [200,200] for FedAvg's 2NN")

    def __post_init__(self) -> None:
        require(len(self.hidden) > 0, "model.hidden must list at least one layer size")
        require(
            all(int(h) >= 1 for h in self.hidden),
            f"model.hidden={list(self.hidden)} must contain positive layer sizes",
        )


class Perceptron(FedModel):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: list[int]) -> None:
        super().__init__()
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["flatten"] = nn.Flatten(start_dim=-len(input_shape))
        width = math.prod(input_shape)
        for i, size in enumerate(hidden, start=1):
            layers[f"fc{i}"] = nn.Linear(width, size)
            layers[f"relu{i}"] = nn.ReLU()
            width = size
        self.extractor = nn.Sequential(layers)
        self.feature_dim = width
        self.head = nn.Linear(width, num_classes)


@register_model("mlp", PerceptronOptions, help="multilayer perceptron, ReLU hidden layers")
def build_perceptron(
    options: PerceptronOptions, input_shape: tuple[int, ...], num_classes: int
) -> Perceptron:
    require_classes("mlp", num_classes)
    return Perceptron(input_shape, num_classes, [int(h) for h in options.hidden])
