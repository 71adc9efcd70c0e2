"""A fused cohort step for the commonest case: plain cross-entropy of a multilayer perceptron.

The general step (``vmap(grad(loss))`` then functional SGD) materialises every gradient and
pays the interpretation cost of ``torch.func`` at every step. When an algorithm declares
that its local loss *is* the weighted cross-entropy of the model's output (decorate the loss
with :func:`plain_cross_entropy`), and the model is a stack of ``Linear`` layers with ReLU
and ``Flatten`` in between (``mlp``, ``mlr``), the trainer instead runs this hand-written
forward and backward pass over the stacked parameters: one ``baddbmm`` per layer forward,
one per layer backward, and the SGD update applied *in place* as part of the
weight-gradient product (``W.baddbmm_(δᵀ, a, alpha=-lr)``), so no gradient tensor exists.

It is the same mathematics as the general path — weighted cross-entropy
``Σ_b w_b·CE_b / max(Σ_b w_b, 1)``, PyTorch's SGD with momentum and weight decay — and equal
to it up to float32 rounding (``tests/test_fast_path.py`` checks this against the general
path and against ``torch.optim.SGD``). Anything else (other losses, buffers, noise extras,
other layers) takes the general path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .sgd import SGDConfig
from .tree import Tree

MARK = "__fedshift_plain_cross_entropy__"


def plain_cross_entropy(fn: Callable) -> Callable:
    """Declare that the loss ``fn(params, buffers, extras, x, y, w)`` is exactly
    ``cross_entropy(forward(params, buffers, x), y, w)`` (extras unused), so the trainer may
    use the fused step. Works on functions and methods (bound methods see the mark);
    a subclass that overrides the method loses the mark, as it should."""
    setattr(fn, MARK, True)
    return fn


def declares_plain_cross_entropy(fn: Callable) -> bool:
    return bool(getattr(fn, MARK, False))


@dataclass(frozen=True)
class Layer:
    weight: str  # parameter name of the [out, in] weight
    bias: str | None
    relu: bool  # ReLU after this layer


def mlp_layers(model: nn.Module) -> list[Layer] | None:
    """The Linear layers of ``head(extractor(x))`` when the model is an MLP the fused step
    handles (Flatten/Linear/ReLU only, ReLU never first or doubled), else ``None``."""
    modules: list[tuple[str, nn.Module]] = []
    for part in ("extractor", "head"):
        sub = getattr(model, part, None)
        if sub is None:
            return None
        if isinstance(sub, nn.Sequential):
            modules += [(f"{part}.{n}", m) for n, m in sub.named_children()]
        else:
            modules.append((part, sub))
    layers: list[Layer] = []
    flatten_ok = True
    for name, m in modules:
        if isinstance(m, nn.Flatten) and flatten_ok:
            continue
        flatten_ok = False
        if isinstance(m, nn.Linear):
            bias = f"{name}.bias" if m.bias is not None else None
            layers.append(Layer(f"{name}.weight", bias, False))
        elif isinstance(m, nn.ReLU) and layers and not layers[-1].relu:
            layers[-1] = Layer(layers[-1].weight, layers[-1].bias, True)
        else:
            return None
    if not layers or layers[-1].relu:
        return None
    return layers


def loss_scale(w: Tensor) -> Tensor:
    """Per-sample weights of the weighted mean ``Σ_b w_b·ℓ_b / max(Σ_b w_b, 1)``."""
    return w / w.sum(-1, keepdim=True).clamp(min=1.0)


class FusedMLPStep:
    """In-place SGD step of a cohort prefix for weighted cross-entropy of an MLP."""

    def __init__(self, layers: list[Layer], sgd: SGDConfig, train_keys: tuple[str, ...]):
        self.layers = layers
        self.sgd = sgd
        self.train = set(train_keys)
        self._neg: Tensor | None = None  # −1s scattered onto the labels' probabilities

    @staticmethod
    def applies(
        loss_fn: Callable, model: nn.Module, buffers: Tree, noise: dict | None
    ) -> list[Layer] | None:
        if not declares_plain_cross_entropy(loss_fn) or buffers or noise:
            return None
        return mlp_layers(model)

    def __call__(self, params: Tree, momentum: Tree, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Update the stacked ``params`` (and ``momentum``) views of ``k`` clients in place
        with one step on minibatch ``x`` [k, B, ...], ``y`` [k, B], ``w`` [k, B]; returns the
        [k] losses before the step."""
        k, b = y.shape
        return self.run(params, momentum, x.reshape(k, b, -1), y.unsqueeze(-1), loss_scale(w))

    def run(self, params: Tree, momentum: Tree, a: Tensor, y1: Tensor, scale: Tensor) -> Tensor:
        """The step on flat inputs ``a`` [k, B, D], labels ``y1`` [k, B, 1] and per-sample
        loss weights ``scale`` = w / max(Σw, 1) [k, B] (see :func:`loss_scale`)."""
        acts = [a]  # input of each layer
        for i, layer in enumerate(self.layers):
            wt = params[layer.weight].transpose(1, 2)
            if layer.bias is not None:
                z = torch.baddbmm(params[layer.bias].unsqueeze(1), a, wt)
            else:
                z = torch.bmm(a, wt)
            if layer.relu:
                z = z.clamp_min_(0)
            if i + 1 < len(self.layers):
                acts.append(z)
            a = z
        logp = torch.log_softmax(a, -1)  # a: the logits [k, B, classes]
        loss = (logp.gather(-1, y1).squeeze(-1) * scale).sum(1).neg_()
        # d loss / d logits = (softmax − onehot) · w_b / max(Σw, 1)
        delta = logp.exp_()
        if (
            self._neg is None
            or self._neg.shape[0] < y1.shape[0]
            or self._neg.shape[1:] != y1.shape[1:]
        ):
            self._neg = torch.full(y1.shape, -1.0, dtype=delta.dtype, device=delta.device)
        delta.scatter_add_(-1, y1, self._neg[: y1.shape[0]])
        delta.mul_(scale.unsqueeze(-1))
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            a_in = acts[i]
            weight = params[layer.weight]
            # δ of the layer below, with the weight before this step's update
            below = torch.bmm(delta, weight) if i > 0 else None
            self._update(layer.weight, params, momentum, delta.transpose(1, 2), a_in)
            if layer.bias is not None:
                self._update(layer.bias, params, momentum, delta.sum(1), None)
            if below is not None:
                delta = below
                if self.layers[i - 1].relu:  # ReLU's backward, as autograd computes it
                    delta = torch.ops.aten.threshold_backward(delta, a_in, 0)
        return loss

    def _update(self, key: str, params: Tree, momentum: Tree, d: Tensor, a: Tensor | None) -> None:
        """``p ← p − lr·buf`` with ``buf ← μ·buf + g + λ·p`` where ``g = d @ a`` (weights) or
        ``g = d`` (biases); without momentum or weight decay ``g`` is never materialised."""
        if key not in self.train:
            return
        cfg, p = self.sgd, params[key]
        if not cfg.momentum and not cfg.weight_decay:
            if a is None:
                p.add_(d, alpha=-cfg.lr)
            else:
                p.baddbmm_(d, a, alpha=-cfg.lr)
            return
        g = d if a is None else torch.bmm(d, a)
        if cfg.weight_decay:
            g = g.add(p, alpha=cfg.weight_decay)
        if cfg.momentum:
            buf = momentum[key]
            buf.mul_(cfg.momentum).add_(g)
            g = buf
        p.add_(g, alpha=-cfg.lr)
