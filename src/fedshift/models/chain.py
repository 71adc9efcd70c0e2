"""A small CNN as a chain of stages (``conv_chain``) and its forward pass written with
ATen's kernels, channels-last from the first convolution to the flatten (``chain_forward``):
the structure the engine's fused CNN step (engine/fused_conv.py) trains and evaluation
(eval/evaluate.py) runs on a CPU. ``fedavg-cnn``, ``lenet5`` and ``cmnist-cnn`` are such
chains: ``ToImage``, ``ZeroPad2d``, ``Conv2d``, ``ReLU``, ``MaxPool2d`` and ``Flatten``,
then ``Linear``/``ReLU`` layers, no buffers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import FedModel
from .layers import ToImage

aten = torch.ops.aten
CHANNELS_LAST = torch.channels_last
Tree = dict[str, Tensor]


@dataclass(frozen=True)
class Op:
    """One stage of the chain: ``kind`` is image | pad | conv | pool | flatten | linear."""

    kind: str
    weight: str | None = None
    bias: str | None = None
    relu: bool = False  # ReLU after this stage
    args: tuple = ()  # image: (C, H, W); pad: (left, right, top, bottom); conv: (stride,
    # padding, dilation, groups); pool: (kernel, stride, padding, dilation, ceil_mode)


def _pair(v) -> list[int]:
    return list(v) if isinstance(v, tuple | list) else [v, v]


def _stage(name: str, m: nn.Module) -> Op | None:
    if isinstance(m, ToImage):
        return Op("image", args=(m.input_ndim, m.image))
    if isinstance(m, nn.ZeroPad2d):
        return Op("pad", args=tuple(m.padding))
    if isinstance(m, nn.Conv2d) and m.padding_mode == "zeros" and isinstance(m.padding, tuple):
        bias = f"{name}.bias" if m.bias is not None else None
        geometry = (_pair(m.stride), _pair(m.padding), _pair(m.dilation), m.groups)
        return Op("conv", f"{name}.weight", bias, args=geometry)
    if isinstance(m, nn.MaxPool2d) and not m.return_indices:
        stride = m.stride if m.stride is not None else m.kernel_size
        geometry = (_pair(m.kernel_size), _pair(stride), _pair(m.padding), _pair(m.dilation))
        return Op("pool", args=(*geometry, bool(m.ceil_mode)))
    if isinstance(m, nn.Flatten) and m.end_dim == -1:
        return Op("flatten")
    if isinstance(m, nn.Linear):
        bias = f"{name}.bias" if m.bias is not None else None
        return Op("linear", f"{name}.weight", bias)
    return None


def chain_modules(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The modules of ``head(extractor(x))`` in order, named as their parameters are, for a
    model whose forward is exactly that (a plugin may override ``forward``), else ``None``:
    what the hand-written steps (this chain, the fused MLP step) read a model from."""
    if type(model).forward is not FedModel.forward:
        return None
    modules: list[tuple[str, nn.Module]] = []
    for part in ("extractor", "head"):
        sub = getattr(model, part, None)
        if sub is None:
            return None
        if isinstance(sub, nn.Sequential):
            modules += [(f"{part}.{n}", m) for n, m in sub.named_children()]
        else:
            modules.append((part, sub))
    return modules


def conv_chain(model: nn.Module) -> list[Op] | None:
    """The stages of ``head(extractor(x))`` when the model is a CNN this step handles (at
    least one convolution, Linear layers only after the flatten, ReLU only after a
    convolution or a Linear layer), else ``None``."""
    modules = chain_modules(model)
    if modules is None:
        return None
    ops: list[Op] = []
    flat = False
    for name, m in modules:
        if isinstance(m, nn.ReLU):
            if not ops or ops[-1].kind not in ("conv", "linear") or ops[-1].relu:
                return None
            last = ops[-1]
            ops[-1] = Op(last.kind, last.weight, last.bias, True, last.args)
            continue
        op = _stage(name, m)
        if op is None or (flat and op.kind != "linear") or (not flat and op.kind == "linear"):
            return None
        if op.kind == "image" and ops:
            return None
        flat = flat or op.kind == "flatten"
        ops.append(op)
    if not flat or not any(op.kind == "conv" for op in ops) or ops[-1].kind != "linear":
        return None
    if ops[-1].relu:
        return None
    return ops


def channels_last(a: Tensor) -> Tensor:
    """``a`` [B, C, H, W] in the channels-last layout. With one channel both layouts have
    the same strides and PyTorch keeps calling it channels-first, so its convolution's
    output would be channels-first: there the channel stride is set to 1 explicitly."""
    if a.shape[1] == 1:
        height, width = a.shape[-2:]
        a = a.contiguous()
        return a.as_strided(a.shape, (a.shape[1] * height * width, 1, width, 1))
    return a.contiguous(memory_format=CHANNELS_LAST)


def chain_forward(ops: list[Op], params: Tree, x: Tensor) -> tuple[Tensor, list[tuple]]:
    """The chain's output (the logits) on ``x`` and what each stage's backward needs: the
    fused step's forward pass, and evaluation's (eval/evaluate.py) on a CPU."""
    a = x
    cache: list[tuple] = []
    for op in ops:  # forward, keeping what each stage's backward needs
        a_in = a
        if op.kind == "image":
            ndim, image = op.args
            a = a if ndim == 3 else a.reshape(a.shape[0], *image)
            cache.append((a_in.shape,))
        elif op.kind == "pad":
            a = nn.functional.pad(a, op.args)
            cache.append((a.shape,))
        elif op.kind == "conv":
            stride, padding, dilation, groups = op.args
            a = a_in = channels_last(a)
            bias = params[op.bias] if op.bias else None
            a = aten.convolution(
                a, params[op.weight], bias, stride, padding, dilation, False, [0, 0], groups
            )
            if op.relu:
                a = a.relu_()
            cache.append((a_in, a))
        elif op.kind == "pool":
            kernel, stride, padding, dilation, ceil = op.args
            # PyTorch's channels-last max-pool kernel: the same maxima, much faster here
            a_in = a_in.contiguous(memory_format=CHANNELS_LAST)
            a, where = aten.max_pool2d_with_indices(a_in, kernel, stride, padding, dilation, ceil)
            cache.append((a_in, where))
        elif op.kind == "flatten":
            a = a.contiguous().reshape(a.shape[0], -1)  # channels-first order, as Flatten
            cache.append((a_in.shape,))
        else:  # linear
            weight = params[op.weight]
            bias = params[op.bias] if op.bias else None
            a = torch.addmm(bias, a, weight.t()) if bias is not None else a @ weight.t()
            if op.relu:
                a = a.relu_()
            cache.append((a_in, a))
    return a, cache
