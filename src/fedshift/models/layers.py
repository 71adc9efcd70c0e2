"""Small shared pieces of the model zoo: reading an input shape as an image, output sizes of
convolutions and poolings, and the names of BatchNorm state (FedBN keeps it local).

Everything here is shape arithmetic done once at construction, so ``forward`` stays free of
data-dependent control flow and runs unchanged under ``torch.func.vmap``.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from ..errors import FedshiftError


def image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    """Read ``input_shape`` as ``(C, H, W)`` for a convolutional model.

    ``(C, H, W)`` is used as is, ``(H, W)`` gets one channel, and a flat ``(D,)`` is read as a
    one-channel square image when ``D`` is a perfect square (784 → 1×28×28).
    """
    shape = tuple(int(s) for s in input_shape)
    if any(s < 1 for s in shape):
        raise FedshiftError(f"model {model!r}: input_shape {shape} has a non-positive size")
    if len(shape) == 3:
        return shape  # type: ignore[return-value]
    if len(shape) == 2:
        return (1, *shape)
    if len(shape) == 1:
        side = math.isqrt(shape[0])
        if side * side == shape[0]:
            return (1, side, side)
    raise FedshiftError(
        f"model {model!r} needs an image input_shape (C, H, W), (H, W) or a flat square (D,); "
        f"got {shape}"
    )


class ToImage(nn.Module):
    """Reshape ``[..., *input_shape]`` to ``[..., C, H, W]`` (identity for 3-D input shapes).

    Uses ``reshape`` (never ``view``), so non-contiguous batches work under ``vmap`` too.
    """

    def __init__(self, input_shape: tuple[int, ...], image: tuple[int, int, int]) -> None:
        super().__init__()
        self.input_ndim = len(input_shape)
        self.image = tuple(image)

    def forward(self, x: Tensor) -> Tensor:
        if self.input_ndim == 3:
            return x
        return x.reshape(*x.shape[: x.dim() - self.input_ndim], *self.image)

    def extra_repr(self) -> str:
        return f"image={self.image}"


def conv_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Spatial size after a convolution (or pooling) with the given geometry."""
    return (size + 2 * padding - kernel) // stride + 1


def pool_size(size: int) -> int:
    """Spatial size after ``MaxPool2d(2)`` (floor, as PyTorch and TF's 'valid' pooling)."""
    return size // 2


def require_spatial(model: str, image: tuple[int, int, int], out: tuple[int, int]) -> None:
    """One clear error when an input image is too small for the model's layers."""
    if min(out) < 1:
        raise FedshiftError(
            f"model {model!r}: input of size {image[1]}x{image[2]} is too small for its "
            "convolutions and poolings; use a larger input or another model"
        )


def batchnorm_keys(model: nn.Module) -> set[str]:
    """Names of the parameters and buffers (affine weights, running statistics, counters) of
    the model's BatchNorm layers: FedBN-style methods keep exactly these local."""
    keys: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            for name, _ in module.named_parameters(recurse=False):
                keys.add(f"{prefix}.{name}" if prefix else name)
            for name, _ in module.named_buffers(recurse=False):
                keys.add(f"{prefix}.{name}" if prefix else name)
    return keys


def require_classes(model: str, num_classes: int) -> None:
    """One clear error for a class count the head cannot have."""
    if int(num_classes) < 1:
        raise FedshiftError(f"model {model!r}: num_classes must be at least 1, got {num_classes}")
