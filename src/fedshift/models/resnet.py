"""``resnet18``: ResNet-18 of He et al., "Deep Residual Learning for Image Recognition"
(CVPR 2016): BasicBlocks in stages [2, 2, 2, 2] of 64, 128, 256, 512 channels, BatchNorm2d,
global average pooling.

The extractor's submodules carry torchvision's names (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer2.0.downsample.0`` …), so a torchvision ``resnet18`` state_dict maps onto this model by
prefixing ``extractor.`` (and ``fc.`` → ``head.``). ``small_input`` swaps the 7×7/2 stem and its
max pooling for a 3×3/1 stem without pooling, the usual CIFAR variant for 32×32 inputs.
Written without in-place activations or additions so that it runs under ``vmap`` + ``grad``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import FedshiftError
from ..options import opt
from .base import FedModel
from .layers import ToImage, image_shape, require_classes
from .registry import register_model

NAME = "resnet18"
STAGES = ((64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2))  # (width, blocks, first stride)


@dataclass(frozen=True)
class ResNetOptions:
    weights: str = opt("", "path of a torchvision resnet18 state_dict to start from ('' = none)")
    small_input: bool = opt(False, "3x3 stride-1 stem without max pooling (CIFAR-style 32x32)")


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with BatchNorm and an identity (or 1×1 projection) shortcut."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetExtractor(nn.Module):
    """Stem, four stages, global average pooling and flatten: Φ(x) ∈ R^512."""

    def __init__(self, input_shape: tuple[int, ...], small_input: bool) -> None:
        super().__init__()
        image = image_shape(input_shape, NAME)
        self.image = ToImage(input_shape, image)
        if small_input:
            self.conv1 = nn.Conv2d(image[0], 64, 3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(image[0], 64, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        width = 64
        for i, (channels, blocks, stride) in enumerate(STAGES, start=1):
            layer = [BasicBlock(width, channels, stride)]
            layer += [BasicBlock(channels, channels, 1) for _ in range(blocks - 1)]
            setattr(self, f"layer{i}", nn.Sequential(*layer))
            width = channels
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(start_dim=-3)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(self.image(x)))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.flatten(self.avgpool(x))


class ResNet18(FedModel):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, small_input: bool) -> None:
        super().__init__()
        self.extractor = ResNetExtractor(input_shape, small_input)
        self.feature_dim = 512
        self.head = nn.Linear(512, num_classes)


def _fail(path: str, problem: str) -> FedshiftError:
    return FedshiftError(f"model.weights={path!r}: {problem}")


def load_torchvision_weights(model: ResNet18, path: str) -> None:
    """Load a torchvision-named resnet18 state_dict into ``model``.

    Every extractor tensor must be present with the right shape (``num_batches_tracked`` may
    be missing, as in torchvision's published files); ``fc.*`` is loaded into the head only
    when its shape matches (same class count), and skipped otherwise.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise _fail(path, "no such file")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _fail(path, f"cannot be read as a weights-only state_dict ({reason})") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise _fail(path, "is not a state_dict (a mapping of names to tensors)")
    extractor = OrderedDict((k, v) for k, v in state.items() if not k.startswith("fc."))
    own = model.extractor.state_dict()
    missing = [k for k in own if k not in extractor and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in extractor if k not in own]
    wrong = [
        f"{k} is {tuple(v.shape)}, expected {tuple(own[k].shape)}"
        for k, v in extractor.items()
        if k in own and v.shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}" + (" …" if len(missing) > 3 else ""))
        if unexpected:
            parts.append(
                f"unexpected {', '.join(unexpected[:3])}" + (" …" if len(unexpected) > 3 else "")
            )
        if wrong:
            parts.append("; ".join(wrong[:3]) + (" …" if len(wrong) > 3 else ""))
        raise _fail(
            path, f"does not match resnet18 (torchvision key names) here: {'; '.join(parts)}"
        )
    model.extractor.load_state_dict(extractor, strict=True)
    head = {k[len("fc.") :]: v for k, v in state.items() if k.startswith("fc.")}
    own_head = model.head.state_dict()
    if set(head) == set(own_head) and all(head[k].shape == own_head[k].shape for k in head):
        model.head.load_state_dict(head, strict=True)


@register_model(NAME, ResNetOptions, help="ResNet-18 (BasicBlock, BatchNorm), optional weights")
def build_resnet18(
    options: ResNetOptions, input_shape: tuple[int, ...], num_classes: int
) -> ResNet18:
    require_classes(NAME, num_classes)
    model = ResNet18(input_shape, num_classes, options.small_input)
    if options.weights:
        load_torchvision_weights(model, options.weights)
    return model
