"""Feature-alignment pieces (FedPAC; usable by any prototype/centroid method): class-wise
feature sums of a client's data, and the squared distance of features to class targets."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torch.func import grad

from ...engine.contract import Context, Tree
from .losses import cross_entropy, squared_distance
from .split import classify, features


def class_feature_sums(
    ctx: Context,
    model: Tree,
    x: Tensor,
    y: Tensor,
    mask: Tensor,
    groups: int | None = None,
    outer: bool = False,
) -> Tree:
    """For ONE client's chunk: per class k, the count, Σ Φ(x) and Σ ‖Φ(x)‖² of its samples;
    with ``outer`` also Σ Φ(x)Φ(x)ᵀ over all of them. ``groups`` (default: the classes) is
    the number of distinct labels in ``y`` when it holds another grouping.

    ``model`` is a model state ``{"p": parameters, "b": buffers}`` (the extractor's are
    used; an empty part may be absent).
    """
    params, buffers = model.get("p", {}), model.get("b", {})
    z = features(ctx, params, buffers, x)
    onehot = F.one_hot(y, groups or ctx.data.num_classes).to(z.dtype) * mask.unsqueeze(1)
    out = {"count": onehot.sum(0), "sum": onehot.T @ z, "sq": onehot.T @ (z**2).sum(1)}
    if outer:
        zm = z * mask.unsqueeze(1)
        out["outer"] = zm.T @ zm
    return out


def alignment_loss(z: Tensor, y: Tensor, w: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error between features z [B, D] and their class targets [K, D], averaged
    over the real samples (weights w) and the D feature dimensions (nn.MSELoss's mean)."""
    sq = ((z - targets[y]) ** 2).sum(1)
    return (sq * w).sum() / (w.sum().clamp(min=1.0) * z.shape[1])


def classifier_gradient(ctx: Context, head: Tree, z: Tensor, y: Tensor, w: Tensor) -> Tree:
    """∇_ω of the minibatch risk with respect to the head ω (differentiable again)."""
    return grad(lambda h: cross_entropy(classify(ctx, h, z), y, w))(head)


def gradient_alignment_penalty(grads: Tree, target: Tree) -> Tensor:
    """‖g − ḡ‖² summed over the head's tensors (FedIIR's implicit invariance penalty)."""
    return squared_distance(grads, target)
