"""A fused client step for the cross-entropy of a small CNN (``fedavg-cnn``, ``lenet5``,
``cmnist-cnn``): a hand-written forward and backward pass, one client at a time; also
pFedMe's inner problem on such a model (``FusedConvStep.prox_descent``).

On a CPU the clients' own convolutions run one after another beat one grouped convolution
for the cohort (docs/performance.md), so the general path runs such models client after
client under ``torch.func.grad``. That step pays for what the model does not need: the
interpretation of ``torch.func`` at every step, a gradient tensor for every weight written
and read back by the SGD update, and PyTorch's channels-first max-pooling kernel, which on
this kind of CPU is several times slower than its channels-last one. This step calls the
same ATen kernels directly (``convolution`` and ``convolution_backward``), keeps the
activations channels-last from the first convolution to the flatten (so the pooling takes
the fast kernel and no gradient changes layout: a ReLU's backward on mixed layouts cost 30×
the same on one), and folds each Linear layer's SGD update into its weight-gradient product
(``W.addmm_(δᵀ, a, alpha=-lr)``, as the fused MLP step does), so no Linear gradient exists.
W2 (the FedAvg CNN on all of MNIST, 20 clients, batch 10): 1.3–1.4× the general
client-after-client path, 2.1× the per-client reference loop (docs/performance.md).

``execution = auto`` (the default) takes it; a pinned ``batched`` or ``sequential`` keeps
the general path, so a run can still be reproduced bit for bit on the path it was made on.

It applies where the fused MLP step would: a loss that *is* the engine's weighted
cross-entropy (``plain_cross_entropy``), or that plus a proximal pull (μ/2)‖θ − a‖²
(``proximal_cross_entropy``: FedProx, Ditto's personal objective) or a linear term ⟨θ, c⟩
(``corrected_cross_entropy``: SCAFFOLD); no buffers, no noise, a CPU tensor; and a model
made only of ``ToImage``, ``ZeroPad2d``, ``Conv2d``, ``ReLU``, ``MaxPool2d`` and
``Flatten`` followed by ``Linear``/``ReLU`` layers. It is the same mathematics as the
general path — ``Σ_b w_b·CE_b / max(Σ_b w_b, 1)``, PyTorch's SGD with momentum and weight
decay — and equal to it up to float32 rounding (``tests/engine/test_fused_conv.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..models.layers import ToImage
from .fused import (
    declares_corrected_cross_entropy,
    declares_plain_cross_entropy,
    proximal_weight,
)
from .risk import cross_entropy_gradient
from .sgd import SGDConfig, sgd_update_
from .tree import Tree

aten = torch.ops.aten
CHANNELS_LAST = torch.channels_last


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


def conv_chain(model: nn.Module) -> list[Op] | None:
    """The stages of ``head(extractor(x))`` when the model is a CNN this step handles (at
    least one convolution, Linear layers only after the flatten, ReLU only after a
    convolution or a Linear layer), else ``None``."""
    modules: list[tuple[str, nn.Module]] = []
    for part in ("extractor", "head"):
        sub = getattr(model, part, None)
        if sub is None:
            return None
        if isinstance(sub, nn.Sequential):
            modules += [(f"{part}.{n}", m) for n, m in sub.named_children()]
        else:
            modules.append((part, sub))
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


class FusedConvStep:
    """In-place SGD steps of ONE client for weighted cross-entropy of a CNN chain
    (``conv_chain``): ``step(params, momentum, x, y, w, anchor)`` updates the client's
    ``params`` (views into the cohort's stacked state; only ``train_keys`` change) and
    returns the minibatch's loss before the step. With ``mu > 0`` the loss adds
    (μ/2)‖θ − a‖² over the parameters ``anchor`` names (its value logged, μ(θ − a) in the
    gradient); with ``corrected`` it adds ⟨θ, c⟩, ``anchor`` holding c (the risk logged)."""

    def __init__(
        self,
        ops: list[Op],
        sgd: SGDConfig,
        train_keys: tuple[str, ...],
        mu: float = 0.0,
        corrected: bool = False,
    ):
        self.ops = ops
        self.sgd = sgd
        self.train_keys = set(train_keys)
        self.mu = mu
        self.corrected = corrected
        # without momentum or weight decay a Linear update is one product in place
        self.plain = not sgd.momentum and not sgd.weight_decay
        # the input's gradient is needed below the lowest stage that trains
        trains = [i for i, op in enumerate(ops) if self._trains(op)]
        self.lowest = trains[0] if trains else len(ops)

    @staticmethod
    def applies(
        loss_fn: Callable, model: nn.Module, buffers: Tree, noise: dict | None, device
    ) -> list[Op] | None:
        fusable = (
            declares_plain_cross_entropy(loss_fn)
            or proximal_weight(loss_fn) is not None
            or declares_corrected_cross_entropy(loss_fn)
        )
        if not fusable or buffers or noise:
            return None
        if torch.device(device).type != "cpu":  # one client at a time: a CPU's choice
            return None
        return conv_chain(model)

    def _trains(self, op: Op) -> bool:
        return op.weight in self.train_keys or (op.bias is not None and op.bias in self.train_keys)

    def _terms(self, params: Tree, anchor: Tree) -> tuple[Tree, Tensor | None]:
        """What the extras add to the trained parameters' gradients (μ(θ − a) or c, taken
        before the step) and, with a pull, its value (μ/2)·Σ‖θ − a‖² over every named one."""
        if not anchor:
            return {}, None
        if self.corrected:
            return {k: c for k, c in anchor.items() if k in self.train_keys}, None
        gaps = {k: params[k] - a for k, a in anchor.items() if k in params}
        value = sum(gap.square().sum() for gap in gaps.values()) * (0.5 * self.mu)
        terms = {k: gap.mul_(self.mu) for k, gap in gaps.items() if k in self.train_keys}
        return terms, value

    def step(
        self,
        params: Tree,
        momentum: Tree,
        x: Tensor,
        y: Tensor,
        w: Tensor,
        anchor: Tree | None = None,
    ) -> Tensor:
        terms, pull = self._terms(params, anchor or {})
        logits, cache = self._forward(params, x)
        loss, delta, _ = cross_entropy_gradient(logits, y, w)
        if pull is not None:
            loss = loss + pull
        self._backward(params, momentum, cache, delta, terms)
        return loss

    def risk(self, params: Tree, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """The weighted cross-entropy of ``params`` on the minibatch (a forward pass)."""
        return cross_entropy_gradient(self._forward(params, x)[0], y, w)[0]

    def prox_descent(
        self, theta: Tree, anchor: Tree, x: Tensor, y: Tensor, w: Tensor, steps: int
    ) -> tuple[Tree, Tensor]:
        """``steps`` SGD steps (this step's lr) on R(θ) + (μ/2)‖θ − anchor‖² from ``theta``
        on one minibatch, and R at the result: pFedMe's inner problem for one client, as
        ``prox_solve`` takes it (equal to float rounding). ``theta`` is not changed."""
        theta = {k: v.detach().clone() for k, v in theta.items()}
        for _ in range(steps):
            terms = {k: (theta[k] - a).mul_(self.mu) for k, a in anchor.items()}
            logits, cache = self._forward(theta, x)
            delta = cross_entropy_gradient(logits, y, w)[1]
            self._backward(theta, {}, cache, delta, terms)
        return theta, self.risk(theta, x, y, w)

    def _forward(self, params: Tree, x: Tensor) -> tuple[Tensor, list[tuple]]:
        a = x
        cache: list[tuple] = []
        for op in self.ops:  # forward, keeping what each stage's backward needs
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
                a, where = aten.max_pool2d_with_indices(
                    a_in, kernel, stride, padding, dilation, ceil
                )
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

    def _backward(
        self, params: Tree, momentum: Tree, cache: list[tuple], delta: Tensor, terms: Tree
    ) -> None:
        grads: Tree = {}  # gradients that are materialised (convolutions; not-plain SGD)
        g = delta
        for i in range(len(self.ops) - 1, self.lowest - 1, -1):
            op, saved = self.ops[i], cache[i]
            below = i > self.lowest  # does any stage below this one train?
            if op.kind == "linear":
                a_in, out = saved
                if op.relu:  # ReLU's backward, as autograd computes it (output > 0)
                    g = aten.threshold_backward(g, out, 0)
                weight = params[op.weight]
                g_below = g @ weight if below else None  # with the weight before the update
                self._linear_update(op, params, grads, terms, g, a_in)
                g = g_below
            elif op.kind == "conv":
                a_in, out = saved
                g = g.contiguous(memory_format=CHANNELS_LAST)  # the layout of a_in and out
                if op.relu:
                    g = aten.threshold_backward(g, out, 0)
                stride, padding, dilation, groups = op.args
                weight = params[op.weight]
                mask = [below, op.weight in self.train_keys, op.bias in self.train_keys]
                g_in, g_w, g_b = aten.convolution_backward(
                    g,
                    a_in,
                    weight,
                    [weight.shape[0]] if op.bias else None,
                    stride,
                    padding,
                    dilation,
                    False,
                    [0, 0],
                    groups,
                    [mask[0], mask[1], mask[2] and op.bias is not None],
                )
                if mask[1]:
                    grads[op.weight] = add_term(g_w, terms.get(op.weight))
                if op.bias is not None and mask[2]:
                    grads[op.bias] = add_term(g_b, terms.get(op.bias))
                g = g_in
            elif op.kind == "pool":
                a_in, where = saved
                kernel, stride, padding, dilation, ceil = op.args
                g = g.contiguous(memory_format=CHANNELS_LAST)
                g = aten.max_pool2d_with_indices_backward(
                    g, a_in, kernel, stride, padding, dilation, ceil, where
                )
            elif op.kind == "flatten":
                g = g.reshape(saved[0])
            elif op.kind == "pad":
                left, right, top, bottom = op.args
                height, width = saved[0][-2:]
                g = g[..., top : height - bottom, left : width - right]
            else:  # image
                g = g.reshape(saved[0])
        if grads:
            sgd_update_(params, grads, momentum, self.sgd)

    def _linear_update(
        self, op: Op, params: Tree, grads: Tree, terms: Tree, g: Tensor, a_in: Tensor
    ) -> None:
        """The Linear layer's update: in place inside the weight-gradient product under plain
        SGD (an extra term first, as its own step), else its gradient kept for
        ``sgd_update_``."""
        lr = self.sgd.lr
        if op.weight in self.train_keys:
            term = terms.get(op.weight)
            if self.plain:
                if term is not None:
                    params[op.weight].sub_(term, alpha=lr)
                params[op.weight].addmm_(g.t(), a_in, alpha=-lr)
            else:
                grads[op.weight] = add_term(g.t() @ a_in, term)
        if op.bias is not None and op.bias in self.train_keys:
            term = terms.get(op.bias)
            if self.plain:
                if term is not None:
                    params[op.bias].sub_(term, alpha=lr)
                params[op.bias].sub_(g.sum(0), alpha=lr)
            else:
                grads[op.bias] = add_term(g.sum(0), term)


def add_term(grad: Tensor, term: Tensor | None) -> Tensor:
    return grad if term is None else grad.add_(term)
