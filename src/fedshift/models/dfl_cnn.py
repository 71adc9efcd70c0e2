"""``dfl-cnn``: the convolutional backbone used for the experiments of Luo et al.,
"Disentangled Federated Learning for Tackling Attributes Skew via Invariant Aggregation and
Diversity Transferring" (DFL, ICML 2022).

One block per entry of ``channels`` (default three: 32, 64, 128), each
conv3x3 (padding 1) → BatchNorm2d → ReLU → maxpool2, then FC ``feature_dim`` → ReLU (the end
of the extractor Φ) and a Linear head. A block's pooling is left out when the map is already
1 pixel high or wide, so small inputs (2×14×14: 14 → 7 → 3 → 1) and large ones both work;
that choice is made once from ``input_shape``, never from data.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from ..options import opt, require
from .base import FedModel
from .layers import ToImage, image_shape, pool_size, require_classes
from .registry import register_model

NAME = "dfl-cnn"


@dataclass(frozen=True)
class DFLOptions:
    channels: list[int] = opt([32, 64, 128], "output channels of each conv-BN-ReLU-pool block")
    feature_dim: int = opt(128, "width of the feature layer Φ(x) (the head's input)")

    def __post_init__(self) -> None:
        require(len(self.channels) > 0, "model.channels must list at least one block width")
        require(
            all(int(c) >= 1 for c in self.channels),
            f"model.channels={list(self.channels)} must contain positive channel counts",
        )
        require(self.feature_dim >= 1, f"model.feature_dim={self.feature_dim} must be positive")


class DFLCNN(FedModel):
    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        channels: list[int],
        feature_dim: int,
    ) -> None:
        super().__init__()
        in_channels, height, width = image_shape(input_shape, NAME)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["image"] = ToImage(input_shape, (in_channels, height, width))
        prev = in_channels
        for i, out_channels in enumerate(channels, start=1):
            layers[f"conv{i}"] = nn.Conv2d(prev, out_channels, kernel_size=3, padding=1)
            layers[f"bn{i}"] = nn.BatchNorm2d(out_channels)
            layers[f"relu{i}"] = nn.ReLU()
            if min(height, width) >= 2:
                layers[f"pool{i}"] = nn.MaxPool2d(2)
                height, width = pool_size(height), pool_size(width)
            prev = out_channels
        layers["flatten"] = nn.Flatten(start_dim=-3)
        layers["fc"] = nn.Linear(prev * height * width, feature_dim)
        layers["relu"] = nn.ReLU()
        self.extractor = nn.Sequential(layers)
        self.feature_dim = feature_dim
        self.head = nn.Linear(feature_dim, num_classes)


@register_model(NAME, DFLOptions, help="DFL backbone: conv-BN-ReLU-pool blocks + 2 FC")
def build_dfl_cnn(options: DFLOptions, input_shape: tuple[int, ...], num_classes: int) -> DFLCNN:
    require_classes(NAME, num_classes)
    return DFLCNN(input_shape, num_classes, [int(c) for c in options.channels], options.feature_dim)
