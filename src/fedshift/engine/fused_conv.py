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

import torch
from torch import Tensor, nn

from ..models.chain import CHANNELS_LAST, Op, chain_forward, conv_chain
from .fused import declares_cross_entropy_step
from .risk import cross_entropy_gradient
from .sgd import SGDConfig, sgd_update_
from .tree import Tree

aten = torch.ops.aten


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
        if not declares_cross_entropy_step(loss_fn) or buffers or noise:
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
        logits, cache = chain_forward(self.ops, params, x)
        loss, delta, _ = cross_entropy_gradient(logits, y, w)
        if pull is not None:
            loss = loss + pull
        self._backward(params, momentum, cache, delta, terms)
        return loss

    def risk(self, params: Tree, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """The weighted cross-entropy of ``params`` on the minibatch (a forward pass)."""
        return cross_entropy_gradient(chain_forward(self.ops, params, x)[0], y, w)[0]

    def prox_descent(
        self, theta: Tree, anchor: Tree, x: Tensor, y: Tensor, w: Tensor, steps: int
    ) -> tuple[Tree, Tensor]:
        """``steps`` SGD steps (this step's lr) on R(θ) + (μ/2)‖θ − anchor‖² from ``theta``
        on one minibatch, and R at the result: pFedMe's inner problem for one client, as
        ``prox_solve`` takes it (equal to float rounding). ``theta`` is not changed."""
        theta = {k: v.detach().clone() for k, v in theta.items()}
        for _ in range(steps):
            terms = {k: (theta[k] - a).mul_(self.mu) for k, a in anchor.items()}
            logits, cache = chain_forward(self.ops, theta, x)
            delta = cross_entropy_gradient(logits, y, w)[1]
            self._backward(theta, {}, cache, delta, terms)
        return theta, self.risk(theta, x, y, w)

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
