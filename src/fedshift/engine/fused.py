"""A fused cohort step for the commonest case: plain cross-entropy of a multilayer perceptron.

The general step (``vmap(grad(loss))`` then functional SGD) materialises every gradient and
pays the interpretation cost of ``torch.func`` at every step. When an algorithm's local
loss *is* the weighted cross-entropy of the model's output (it keeps ``Algorithm.loss``,
the engine's own risk, which carries the mark of :func:`plain_cross_entropy`: the engine
marks it, no method has to), and the model is a stack of ``Linear`` layers with ReLU
and ``Flatten`` in between (``mlp``, ``mlr``), the trainer instead runs this hand-written
forward and backward pass over the stacked parameters: one ``baddbmm`` per layer forward,
one per layer backward, and the SGD update applied *in place* as part of the
weight-gradient product (``W.baddbmm_(δᵀ, a, alpha=-lr)``), so no gradient tensor exists.

It is the same mathematics as the general path — weighted cross-entropy
``Σ_b w_b·CE_b / max(Σ_b w_b, 1)``, PyTorch's SGD with momentum and weight decay — and equal
to it up to float32 rounding (``tests/engine/test_fast_path.py`` checks this against the general
path and against ``torch.optim.SGD``). Anything else (other losses, buffers, noise extras,
other layers) takes the general path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..models.chain import chain_modules
from .risk import cross_entropy_gradient, loss_scale
from .sgd import SGDConfig, sgd_update_
from .tree import Tree

MARK = "__fedshift_plain_cross_entropy__"
# With OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads sleep), a step of at most this many
# clients runs faster on one CPU thread: waking a second thread costs more than sharing so
# small a product saves. With spinning threads (OpenMP's default) two threads win even for
# one client. Measured on the 2-core development machine, docs/performance.md.
FEW_CLIENTS = 3


def passive_openmp() -> bool:
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


# Elements of the per-step label tensors built at once (steps are processed in blocks).
BLOCK_ELEMENTS = 1 << 22


def plain_cross_entropy(fn: Callable) -> Callable:
    """Declare that the loss ``fn(params, buffers, extras, x, y, w)`` is exactly
    ``cross_entropy(forward(params, buffers, x), y, w)`` (extras unused), so the trainer may
    use the fused step. Works on functions and methods (bound methods see the mark);
    a subclass that overrides the method loses the mark, as it should."""
    setattr(fn, MARK, True)
    return fn


def declares_plain_cross_entropy(fn: Callable) -> bool:
    return bool(getattr(fn, MARK, False))


PROXIMAL_MARK = "__fedshift_proximal_cross_entropy__"


def proximal_cross_entropy(weight: Callable[[Any], float]) -> Callable:
    """Declare that the loss ``fn(params, buffers, anchor, x, y, w)`` is exactly
    ``cross_entropy(forward(params, buffers, x), y, w) + (μ/2)·Σ_k ‖params[k] − anchor[k]‖²``
    over the keys both have, μ = ``weight(self)`` (FedProx's objective, Ditto's personal
    one): the fused step then runs it with the pull folded into its in-place update, so no
    gradient tensor is written and read back (on a wide layer that traffic, not the
    arithmetic, is most of a small step). Like ``plain_cross_entropy``, an override loses
    the mark."""

    def mark(fn: Callable) -> Callable:
        setattr(fn, PROXIMAL_MARK, weight)
        return fn

    return mark


def proximal_weight(fn: Callable) -> float | None:
    """μ of a loss marked by ``proximal_cross_entropy`` (a bound method), else ``None``."""
    weight = getattr(fn, PROXIMAL_MARK, None)
    owner = getattr(fn, "__self__", None)
    return None if weight is None or owner is None else float(weight(owner))


CORRECTED_MARK = "__fedshift_corrected_cross_entropy__"


def corrected_cross_entropy(fn: Callable) -> Callable:
    """Declare that the loss ``fn(params, buffers, correction, x, y, w)`` trains exactly
    ``cross_entropy(forward(params, buffers, x), y, w) + Σ_k ⟨params[k], correction[k]⟩``
    over the keys both have and logs the risk alone (SCAFFOLD's corrected step, whose
    linear term has no floor): the fused step then adds the constant correction to its
    in-place update. An override loses the mark."""
    setattr(fn, CORRECTED_MARK, True)
    return fn


def declares_corrected_cross_entropy(fn: Callable) -> bool:
    return bool(getattr(fn, CORRECTED_MARK, False))


def declares_cross_entropy_step(fn: Callable) -> bool:
    """Whether a loss is one the fused steps train: the plain risk, or it plus a proximal
    pull (``proximal_cross_entropy``) or a linear term (``corrected_cross_entropy``)."""
    return (
        declares_plain_cross_entropy(fn)
        or proximal_weight(fn) is not None
        or declares_corrected_cross_entropy(fn)
    )


@dataclass(frozen=True)
class Layer:
    weight: str  # parameter name of the [out, in] weight
    bias: str | None
    relu: bool  # ReLU after this layer


def mlp_layers(model: nn.Module) -> list[Layer] | None:
    """The Linear layers of ``head(extractor(x))`` when the model is an MLP the fused step
    handles (Flatten/Linear/ReLU only, ReLU never first or doubled), else ``None``; also
    ``None`` for a model whose forward is not ``head(extractor(x))`` (a plugin's own)."""
    modules = chain_modules(model)
    if modules is None:
        return None
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


class FusedMLPStep:
    """In-place SGD steps of a cohort for weighted cross-entropy of an MLP, optionally with
    a proximal pull (μ/2)‖θ − anchor‖² (``proximal_cross_entropy``): its gradient μ(θ − a)
    joins the update in place, θ ← θ − lr·μ(θ − a) − lr·δᵀx, and its value the logged loss;
    or with a linear term ⟨θ, c⟩ (``corrected_cross_entropy``, ``corrected=True``): θ ←
    θ − lr·c − lr·δᵀx, the risk logged. ``anchor`` (parameter name → (tensor, per client))
    holds a or c: the extras under the parameters' names, one tensor for the cohort or a
    [C, …] stack in cohort order."""

    def __init__(
        self,
        layers: list[Layer],
        sgd: SGDConfig,
        train_keys: tuple[str, ...],
        mu: float = 0.0,
        corrected: bool = False,
        anchor: dict[str, tuple[Tensor, bool]] | None = None,
    ):
        self.layers = layers
        self.sgd = sgd
        self.train_keys = set(train_keys)
        self.mu = mu
        self.corrected = corrected
        self.anchor = anchor or {}
        # without momentum or weight decay a bias update is one rank-B product in place
        self.plain = not sgd.momentum and not sgd.weight_decay

    @staticmethod
    def applies(
        loss_fn: Callable, model: nn.Module, buffers: Tree, noise: dict | None
    ) -> list[Layer] | None:
        if not declares_cross_entropy_step(loss_fn) or buffers or noise:
            return None
        return mlp_layers(model)

    def __call__(self, params: Tree, momentum: Tree, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Update the stacked ``params`` (and ``momentum``) of ``k`` clients in place with one
        step on minibatch ``x`` [k, B, ...], ``y`` [k, B], ``w`` [k, B]; returns the [k]
        losses before the step."""
        k, b = y.shape
        x_flat = x.reshape(k * b, -1)
        idx = torch.arange(k * b, device=x.device).view(k, 1, b)
        return self.train(params, momentum, x_flat, y.reshape(-1), idx, w.unsqueeze(1), [k])

    def train(
        self,
        params: Tree,
        momentum: Tree,
        x_flat: Tensor,
        y: Tensor,
        idx: Tensor,
        wgt: Tensor,
        active: list[int],
        between_steps: Callable[[], None] = lambda: None,
    ) -> Tensor:
        """Every step of a schedule: ``idx``/``wgt`` [C, S, B] rows of ``x_flat`` [N, D]
        (labels ``y`` [N]) and their weights, clients sorted so that the ``active[s]``
        clients still training at step ``s`` are a prefix. Returns the [C] sums of each
        client's step losses (each taken before its step). ``between_steps`` is called
        before each step."""
        c, s_max, b = idx.shape
        classes = params[self.layers[-1].weight].shape[1]
        # per-step tensors in step-major order, so that a prefix of clients is contiguous;
        # built in blocks of steps to bound their memory
        per_step = c * b * (classes + 3)
        block = max(1, BLOCK_ELEMENTS // max(per_step, 1))
        acc = torch.zeros(c, b, classes, dtype=x_flat.dtype, device=x_flat.device)
        prox = torch.zeros(c, dtype=x_flat.dtype, device=x_flat.device)  # Σ_steps (μ/2)‖θ − a‖²
        ones = torch.ones(c, 1, b, dtype=x_flat.dtype, device=x_flat.device)
        views: dict[int, tuple] = {}
        threads = torch.get_num_threads()
        few = FEW_CLIENTS if threads > 1 and passive_openmp() and x_flat.device.type == "cpu" else 0
        try:
            for s0 in range(0, len(active), block):
                s1 = min(s0 + block, len(active))
                rows = idx[:, s0:s1].transpose(0, 1).reshape(s1 - s0, c * b)
                scale = loss_scale(wgt[:, s0:s1]).transpose(0, 1).unsqueeze(-1).contiguous()
                labels = y[rows].view(s1 - s0, c, b, 1)
                # −onehot(y)·scale: the label's share of d loss / d logits and the loss weights
                neg = torch.zeros(s1 - s0, c, b, classes, dtype=scale.dtype, device=scale.device)
                neg.scatter_(-1, labels, scale.neg())
                for s in range(s0, s1):
                    between_steps()  # may raise to abandon the training (a stop request)
                    k = active[s]
                    if k not in views:
                        views[k] = self._views(params, momentum, k, acc, ones, prox)
                        if k <= few:
                            torch.set_num_threads(1)
                    a = x_flat.index_select(0, rows[s - s0, : k * b]).view(k, b, -1)
                    self._step(views[k], a, scale[s - s0, :k], neg[s - s0, :k])
        finally:
            torch.set_num_threads(threads)
        return acc.sum((1, 2)) + prox

    def _anchor(self, name: str | None, k: int, like: Tensor) -> Tensor | None:
        """The anchor of parameter ``name`` for the ``k``-client prefix, shaped to broadcast
        against its view ``like`` ([k, …]), or ``None`` without one."""
        if name is None or name not in self.anchor:
            return None
        t, per_client = self.anchor[name]
        t = t[:k] if per_client else t.unsqueeze(0)
        return t.reshape(t.shape[0], *like.shape[1:])

    def _views(
        self, params: Tree, momentum: Tree, k: int, acc: Tensor, ones: Tensor, prox: Tensor
    ) -> tuple:
        """The ``k``-client prefixes of everything a step touches, built once per ``k``;
        with a proximal pull or a linear term, also the anchors (or corrections), and the
        pull's value on the parameters that are not trained (a constant)."""
        per_layer = []
        for layer in self.layers:
            w = params[layer.weight][:k]
            bias = params[layer.bias][:k].unsqueeze(1) if layer.bias is not None else None
            anchors = (self._anchor(layer.weight, k, w), self._anchor(layer.bias, k, bias))
            per_layer.append((layer, w, w.transpose(1, 2), bias, anchors))
        mom = {n: t[:k] for n, t in momentum.items()}
        still = torch.zeros(k, dtype=acc.dtype, device=acc.device)
        for name, (t, per_client) in self.anchor.items():
            if name in params and name not in self.train_keys and not self.corrected:
                gap = (params[name][:k] - (t[:k] if per_client else t)).reshape(k, -1)
                still += (0.5 * self.mu) * torch.linalg.vecdot(gap, gap)
        return per_layer, mom, acc[:k], ones[:k], prox[:k], still

    def _pull(self, p: Tensor, a: Tensor | None, prox: Tensor) -> tuple[Tensor | None, float]:
        """The term the extras add to one parameter's gradient, as (tensor, factor): c with
        a linear term; θ − a (before the step) and μ with a proximal pull, whose (μ/2)‖θ − a‖²
        is added to ``prox``."""
        if a is None:
            return None, 0.0
        if self.corrected:
            return a, 1.0
        gap = p - a
        flat = gap.reshape(p.shape[0], -1)
        prox.add_(torch.linalg.vecdot(flat, flat), alpha=0.5 * self.mu)
        return gap, self.mu

    def _step(self, views: tuple, a: Tensor, scale: Tensor, neg: Tensor) -> None:
        per_layer, mom, acc, ones, prox, still = views
        if self.anchor:
            prox.add_(still)
        acts = []  # input of each layer
        for layer, _, wt, bias, _ in per_layer:
            acts.append(a)
            a = torch.baddbmm(bias, a, wt) if bias is not None else torch.bmm(a, wt)
            if layer.relu:
                a = a.clamp_min_(0)
        logp = torch.log_softmax(a, -1)  # a: the logits [k, B, classes]
        acc.addcmul_(neg, logp)  # Σ −w_b/max(Σw,1)·log p(y_b): the loss, summed at the end
        # d loss / d logits = (softmax − onehot) · w_b / max(Σw, 1)
        delta = torch.addcmul(neg, logp.exp_(), scale)
        lr = self.sgd.lr
        for i in range(len(per_layer) - 1, -1, -1):
            layer, w, _, bias, (w_anchor, b_anchor) = per_layer[i]
            a_in = acts[i]
            # δ of the layer below, with the weight before this step's update
            below = torch.bmm(delta, w) if i > 0 else None
            if layer.weight in self.train_keys:
                term, factor = self._pull(w, w_anchor, prox)
                if self.plain:
                    if term is not None:
                        w.sub_(term, alpha=lr * factor)
                    w.baddbmm_(delta.transpose(1, 2), a_in, alpha=-lr)
                else:
                    g = torch.bmm(delta.transpose(1, 2), a_in)
                    if term is not None:
                        g.add_(term, alpha=factor)
                    sgd_update_({"p": w}, {"p": g}, {"p": mom.get(layer.weight)}, self.sgd)
            if bias is not None and layer.bias in self.train_keys:
                term, factor = self._pull(bias, b_anchor, prox)
                if self.plain:
                    if term is not None:
                        bias.sub_(term, alpha=lr * factor)
                    bias.baddbmm_(ones, delta, alpha=-lr)
                else:
                    p, g = bias.squeeze(1), delta.sum(1)
                    if term is not None:
                        g.add_(term.squeeze(1), alpha=factor)
                    sgd_update_({"p": p}, {"p": g}, {"p": mom.get(layer.bias)}, self.sgd)
            if below is not None:
                delta = below
                if self.layers[i - 1].relu:  # ReLU's backward, as autograd computes it
                    delta = torch.ops.aten.threshold_backward(delta, a_in, 0)


def mlp_risk_gradient(model: nn.Module) -> Callable | None:
    """For an MLP the fused step handles: ``gradient(params, x, y, w) -> (∇ of every
    parameter, loss)`` of the weighted cross-entropy for ONE client's minibatch, written out
    (the fused step's backward pass without its in-place update), for losses that need the
    risk's gradient at points of their own (pFedMe's inner problem), under ``vmap`` or, with
    a leading client axis on every tensor, for the whole cohort at once; ``gradient.risk``
    is the risk alone. ``None`` for any other model."""
    layers = mlp_layers(model)
    if layers is None or any(True for _ in model.buffers()):
        return None
    net = MLPChain(tuple(layers))  # the whole MLP: its output is the logits

    def gradient(params: Tree, x: Tensor, y: Tensor, w: Tensor) -> tuple[Tree, Tensor]:
        logits, cache = net.forward(params, x)
        loss, delta, _ = cross_entropy_gradient(logits, y, w)
        return net.backward(params, cache, delta), loss

    def risk(params: Tree, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        return cross_entropy_gradient(net.forward(params, x)[0], y, w)[0]

    gradient.risk = risk  # the risk alone, by the same forward pass
    gradient.net = net  # its layers, for solvers that fuse the gradient into their update
    return gradient


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x Wᵀ + b for one client (x [B, in]) or a cohort (a leading client axis on x, W and
    b): the forward of every Linear layer whose gradient is written out."""
    out = x @ weight.transpose(-1, -2)
    return out if bias is None else out + bias.unsqueeze(-2)


def linear_grads(delta: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """∂/∂W and ∂/∂b of ``linear`` from δ = ∂/∂output and the layer's input x."""
    return delta.transpose(-1, -2) @ x, delta.sum(-2)


@dataclass(frozen=True)
class MLPChain:
    """Linear(+ReLU) layers of an MLP as two pure functions: ``forward(params, x) ->
    (output, cache)`` and ``backward(params, cache, ∂/∂output) -> ∇ of the layers'
    parameters``, for ONE client (vmappable) or, when the weights carry a leading client
    axis ([C, out, in]), for a whole cohort at once (x [C, B, …]; for gradients written with
    ``gradient_by(batched=True)``). The whole model gives ``mlp_risk_gradient``; its
    extractor Φ (``mlp_extractor``) serves methods that put their own terms between Φ(x) and
    the loss and write the gradient out (FedSR, FedIIR, FedPIN, FedSDR)."""

    layers: tuple[Layer, ...]

    def forward(self, params: Tree, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        lead = params[self.layers[0].weight].dim() - 1  # 1, or 2 with a client axis
        a = x.reshape(*x.shape[:lead], -1)
        inputs = []  # input of each layer, then the output
        for layer in self.layers:
            inputs.append(a)
            bias = params[layer.bias] if layer.bias is not None else None
            a = linear(a, params[layer.weight], bias)
            if layer.relu:
                a = a.clamp_min(0)
        return a, [*inputs, a]

    def backward(self, params: Tree, cache: list[Tensor], delta: Tensor) -> Tree:
        grads: Tree = {}
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            if layer.relu:  # ReLU's backward, as autograd computes it (output > 0)
                delta = torch.ops.aten.threshold_backward(delta, cache[i + 1], 0)
            if layer.bias is not None:
                grads[layer.weight], grads[layer.bias] = linear_grads(delta, cache[i])
            else:
                grads[layer.weight] = delta.transpose(-1, -2) @ cache[i]
            if i > 0:
                delta = delta @ params[layer.weight]
        return grads

    def prox_descent(
        self,
        theta: Tree,
        anchor: Tree,
        x: Tensor,
        y: Tensor,
        w: Tensor,
        lam: float,
        lr: float,
        steps: int,
    ) -> tuple[Tree, Tensor]:
        """``steps`` gradient steps (lr ``lr``) on each client's risk R(θ) + (λ/2)‖θ − anchor‖²
        from ``theta``, for a cohort (a leading client axis on every tensor; the MLP is the
        whole model, its output the logits), and every client's risk at the result:
        pFedMe's inner problem. The same arithmetic as ``prox_solve`` with this chain's
        gradient, done as the fused step does it: each weight's gradient goes straight into
        its update, θ ← (1 − lr·λ)·θ − lr·∇R(θ) + lr·λ·anchor by one ``baddbmm_`` and one
        ``add_`` (no gradient tensor), and the labels' part of ∂R/∂logits is built once for
        the K steps. Equal to ``prox_solve`` to float rounding. Returns fresh tensors;
        ``theta`` and ``anchor`` are not changed."""
        c, b = y.shape
        theta = {k: v.detach().clone() for k, v in theta.items()}
        pull = {k: anchor[k].detach() * (lr * lam) for k in theta}
        keep = 1.0 - lr * lam
        dtype = theta[self.layers[0].weight].dtype  # the labels' tensors in the weights' type
        scale = loss_scale(w).to(dtype).unsqueeze(-1)  # [C, B, 1]
        classes = theta[self.layers[-1].weight].shape[1]
        neg = torch.zeros(c, b, classes, dtype=scale.dtype, device=scale.device)
        neg.scatter_(-1, y.unsqueeze(-1), scale.neg())  # −onehot(y)·w_b / max(Σw, 1)
        ones = torch.ones(c, 1, b, dtype=scale.dtype, device=scale.device)
        x = x.reshape(c, b, -1)
        for _ in range(steps):
            outputs = self.forward(theta, x)[1]
            delta = torch.addcmul(neg, torch.softmax(outputs[-1], -1), scale)  # ∂R/∂logits
            for i in range(len(self.layers) - 1, -1, -1):
                layer = self.layers[i]
                if layer.relu:  # ReLU's backward, as autograd computes it (output > 0)
                    delta = torch.ops.aten.threshold_backward(delta, outputs[i + 1], 0)
                weight = theta[layer.weight]
                below = torch.bmm(delta, weight) if i > 0 else None  # before the update
                weight.baddbmm_(delta.transpose(1, 2), outputs[i], beta=keep, alpha=-lr)
                weight.add_(pull[layer.weight])
                if layer.bias is not None:
                    bias = theta[layer.bias].unsqueeze(1)
                    bias.baddbmm_(ones, delta, beta=keep, alpha=-lr)
                    bias.add_(pull[layer.bias].unsqueeze(1))
                delta = below
        logp = torch.log_softmax(self.forward(theta, x)[0], -1)
        return theta, (neg * logp).sum((1, 2))


def mlp_extractor(model: nn.Module) -> MLPChain | None:
    """Φ of an MLP the fused step handles whose head is one Linear layer, else ``None``."""
    layers = mlp_layers(model)
    if layers is None or any(True for _ in model.buffers()) or len(layers) < 2:
        return None
    if not layers[-1].weight.startswith("head."):  # a head of several layers
        return None
    return MLPChain(tuple(layers[:-1]))
