"""``mlp``: multilayer perceptron with ReLU hidden layers.

The "2NN" of McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (AISTATS 2017) is ``hidden=[200, 200]`` (784-200-200-10); the default
``[100]`` is the one-hidden-layer network of many personalised-FL baselines. The extractor is
flatten + every hidden layer (Φ(x) is the last hidden activation), the head the last Linear.

Options for the MLP of the IRM reference code (Arjovsky et al. 2019, code/colored_mnist):
``init = "xavier"`` (Glorot-uniform weights, zero biases) and, for two classes,
``binary_head = true``: one logit z and logits [0, z], so softmax cross-entropy is exactly the
reference's 1-logit binary cross-entropy on z (and the prediction is z > 0).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..options import opt, require
from .base import FedModel
from .layers import require_classes
from .registry import register_model

INITS = ("torch", "xavier")


@dataclass(frozen=True)
class PerceptronOptions:
    hidden: list[int] = opt([100], "sizes of the hidden layers, e.g. [200,200] for FedAvg's 2NN")
    init: str = opt("torch", "weight initialisation: torch (nn.Linear's) or xavier", INITS)
    binary_head: bool = opt(False, "two classes from one logit z: logits [0, z] (BCE on z)")

    def __post_init__(self) -> None:
        require(len(self.hidden) > 0, "model.hidden must list at least one layer size")
        require(
            all(int(h) >= 1 for h in self.hidden),
            f"model.hidden={list(self.hidden)} must contain positive layer sizes",
        )
        require(self.init in INITS, f"model.init must be one of {INITS}, got {self.init!r}")


class BinaryLogit(nn.Module):
    """One logit z as the two logits [0, z]: softmax cross-entropy = BCE with logit z."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 1)

    def forward(self, h: Tensor) -> Tensor:
        z = self.linear(h)
        return torch.cat([torch.zeros_like(z), z], dim=-1)


class Perceptron(FedModel):
    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        hidden: list[int],
        init: str = "torch",
        binary_head: bool = False,
    ) -> None:
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
        self.head = BinaryLogit(width) if binary_head else nn.Linear(width, num_classes)
        if init == "xavier":
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight)
                    nn.init.zeros_(m.bias)


@register_model("mlp", PerceptronOptions, help="multilayer perceptron, ReLU hidden layers")
def build_perceptron(
    options: PerceptronOptions, input_shape: tuple[int, ...], num_classes: int
) -> Perceptron:
    require_classes("mlp", num_classes)
    require(
        not options.binary_head or num_classes == 2,
        f"model.binary_head needs two classes, the scenario has {num_classes}",
    )
    hidden = [int(h) for h in options.hidden]
    return Perceptron(input_shape, num_classes, hidden, options.init, options.binary_head)
