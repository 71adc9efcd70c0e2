"""``fedavg-cnn``: the CNN of McMahan et al., "Communication-Efficient Learning of Deep
Networks from Decentralized Data" (AISTATS 2017).

conv5x5(32) → ReLU → maxpool2 → conv5x5(64) → ReLU → maxpool2 → FC 512 → ReLU → FC classes.
The paper describes the layers but not the padding; its model follows the TensorFlow
"Deep MNIST" tutorial, which pads convolutions 'same', so both convolutions use ``padding=2``
here (1×28×28 → 64×7×7 → 3136 inputs to the FC layer, 1,663,370 parameters for 10 classes, as
the paper reports). Any (C, H, W) input with H, W ≥ 4 works: the flattened size is computed
from ``input_shape``. Φ(x) is the 512-d hidden layer; the head is the last Linear.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from ..options import opt, require
from .base import FedModel
from .layers import ToImage, image_shape, pool_size, require_classes, require_spatial
from .registry import register_model

NAME = "fedavg-cnn"


@dataclass(frozen=True)
class FedAvgCNNOptions:
    feature_dim: int = opt(512, "width of the hidden fully connected layer (paper: 512)")

    def __post_init__(self) -> None:
        require(self.feature_dim >= 1, f"model.feature_dim={self.feature_dim} must be positive")


class FedAvgCNN(FedModel):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, feature_dim: int) -> None:
        super().__init__()
        channels, height, width = image_shape(input_shape, NAME)
        out = (pool_size(pool_size(height)), pool_size(pool_size(width)))
        require_spatial(NAME, (channels, height, width), out)
        self.extractor = nn.Sequential(
            OrderedDict(
                image=ToImage(input_shape, (channels, height, width)),
                conv1=nn.Conv2d(channels, 32, kernel_size=5, padding=2),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(32, 64, kernel_size=5, padding=2),
                relu2=nn.ReLU(),
                pool2=nn.MaxPool2d(2),
                flatten=nn.Flatten(start_dim=-3),
                fc=nn.Linear(64 * out[0] * out[1], feature_dim),
                relu=nn.ReLU(),
            )
        )
        self.feature_dim = feature_dim
        self.head = nn.Linear(feature_dim, num_classes)


@register_model(NAME, FedAvgCNNOptions, help="CNN of the FedAvg paper (2×conv5x5 + FC 512)")
def build_fedavg_cnn(
    options: FedAvgCNNOptions, input_shape: tuple[int, ...], num_classes: int
) -> FedAvgCNN:
    require_classes(NAME, num_classes)
    return FedAvgCNN(input_shape, num_classes, options.feature_dim)
