"""``lenet5``: LeNet-5 of LeCun et al., "Gradient-Based Learning Applied to Document
Recognition" (Proc. IEEE 1998).

conv5x5(6) → ReLU → maxpool2 → conv5x5(16) → ReLU → maxpool2 → FC 120 → ReLU → FC 84 → ReLU
→ FC classes. Two modern substitutions, as in most re-implementations (and FL benchmarks):
ReLU instead of scaled tanh, max pooling instead of trainable subsampling; C3 is fully
connected to S2. The paper feeds 32×32 images (28×28 digits padded by 2); here the first
convolution pads by 2 instead, so 28×28 inputs give the paper's 16×5×5 map and 32×32
inputs give 16×6×6. Inputs smaller than 12×12 are zero-padded up to 12×12 so that every
layer has at least one output position. Φ(x) is the 84-d layer; the head is the last Linear.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from .base import FedModel
from .layers import ToImage, conv_size, image_shape, pool_size, require_classes
from .registry import register_model

NAME = "lenet5"
MIN_SIDE = 12  # smallest H, W (conv1 pads by 2) that leaves ≥ 1×1 after the last pool


@dataclass(frozen=True)
class LeNetOptions:
    """LeNet-5 has no options: its layer sizes are the paper's."""


def _side(size: int) -> int:
    size = pool_size(conv_size(size, 5, padding=2))
    return pool_size(conv_size(size, 5))


class LeNet5(FedModel):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = image_shape(input_shape, NAME)
        pad_h, pad_w = max(0, MIN_SIDE - height), max(0, MIN_SIDE - width)
        # (left, right, top, bottom); an empty pad is a no-op
        pad = nn.ZeroPad2d((pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        out_h, out_w = _side(height + pad_h), _side(width + pad_w)
        self.extractor = nn.Sequential(
            OrderedDict(
                image=ToImage(input_shape, (channels, height, width)),
                pad=pad,
                conv1=nn.Conv2d(channels, 6, kernel_size=5, padding=2),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(6, 16, kernel_size=5),
                relu2=nn.ReLU(),
                pool2=nn.MaxPool2d(2),
                flatten=nn.Flatten(start_dim=-3),
                fc1=nn.Linear(16 * out_h * out_w, 120),
                relu3=nn.ReLU(),
                fc2=nn.Linear(120, 84),
                relu4=nn.ReLU(),
            )
        )
        self.feature_dim = 84
        self.head = nn.Linear(84, num_classes)


@register_model(NAME, LeNetOptions, help="LeNet-5 (2×conv5x5 + FC 120, 84), ReLU + max pooling")
def build_lenet(options: LeNetOptions, input_shape: tuple[int, ...], num_classes: int) -> LeNet5:
    require_classes(NAME, num_classes)
    return LeNet5(input_shape, num_classes)
