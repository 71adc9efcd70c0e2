"""``cmnist-cnn``: a small CNN for Coloured MNIST (2×14×14 images: the digit drawn in a red
or green channel), the benchmark of Arjovsky et al., "Invariant Risk Minimization"
(arXiv:1907.02893, 2019).

conv3x3(32) → ReLU → conv3x3(64) → ReLU → maxpool2 → FC ``feature_dim`` → ReLU, then a
Linear head: the layout of the Keras MNIST example CNN, with 'same' padding (``padding=1``)
so that any small C×H×W input with H, W ≥ 2 works (2×14×14 → 64×7×7 → 3136 → 128).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from ..options import opt, require
from .base import FedModel
from .layers import ToImage, image_shape, pool_size, require_classes, require_spatial
from .registry import register_model

NAME = "cmnist-cnn"


@dataclass(frozen=True)
class ColoredMnistOptions:
    feature_dim: int = opt(128, "width of the feature layer Φ(x) (the head's input)")

    def __post_init__(self) -> None:
        require(self.feature_dim >= 1, f"model.feature_dim={self.feature_dim} must be positive")


class ColoredMnistCNN(FedModel):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, feature_dim: int) -> None:
        super().__init__()
        channels, height, width = image_shape(input_shape, NAME)
        out = (pool_size(height), pool_size(width))
        require_spatial(NAME, (channels, height, width), out)
        self.extractor = nn.Sequential(
            OrderedDict(
                image=ToImage(input_shape, (channels, height, width)),
                conv1=nn.Conv2d(channels, 32, kernel_size=3, padding=1),
                relu1=nn.ReLU(),
                conv2=nn.Conv2d(32, 64, kernel_size=3, padding=1),
                relu2=nn.ReLU(),
                pool=nn.MaxPool2d(2),
                flatten=nn.Flatten(start_dim=-3),
                fc=nn.Linear(64 * out[0] * out[1], feature_dim),
                relu=nn.ReLU(),
            )
        )
        self.feature_dim = feature_dim
        self.head = nn.Linear(feature_dim, num_classes)


@register_model(NAME, ColoredMnistOptions, help="small CNN for Coloured MNIST (2×14×14)")
def build_colored_mnist_cnn(
    options: ColoredMnistOptions, input_shape: tuple[int, ...], num_classes: int
) -> ColoredMnistCNN:
    require_classes(NAME, num_classes)
    return ColoredMnistCNN(input_shape, num_classes, options.feature_dim)
