"""Extractor / head split of a fedshift model (models/base.py: f = ω ∘ Φ), for methods that
share or personalise only one part (FedRep, FedRoD, FedPAC, FedIIR, FedSR …).

Parameter names start with ``extractor.`` or ``head.``; these helpers run either part as a
pure function of its own parameters, for ONE client (the trainer vmaps them).
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.func import functional_call

from ...engine.contract import Context, Tree
from ...options import require

EXTRACTOR, HEAD = "extractor.", "head."


def submodule(tree: Tree, name: str) -> Tree:
    """The entries of a model parameter/buffer dict under submodule ``name``, that prefix
    removed: ``submodule({"extractor.fc1.weight": w, "head.weight": h}, "extractor")`` →
    ``{"fc1.weight": w}``."""
    prefix = f"{name}."
    return {k[len(prefix) :]: v for k, v in tree.items() if k.startswith(prefix)}


def is_head(name: str) -> bool:
    return name.startswith(HEAD)


def is_extractor(name: str) -> bool:
    return name.startswith(EXTRACTOR)


def features(ctx: Context, params: Tree, buffers: Tree, x: Tensor) -> Tensor:
    """Φ(x): the extractor alone, with the extractor's parameters and buffers."""
    own = {**submodule(params, "extractor"), **submodule(buffers, "extractor")}
    return functional_call(ctx.model.extractor, own, (x,))


def classify(ctx: Context, head: Tree, z: Tensor) -> Tensor:
    """ω(z) with head parameters ``head`` (names with or without the ``head.`` prefix)."""
    own = {k[len(HEAD) :] if is_head(k) else k: v for k, v in head.items()}
    return functional_call(ctx.model.head, own, (z,))


def require_linear_head(ctx: Context, method: str) -> None:
    """Methods that fold two linear maps into one head need ω to be one nn.Linear."""
    require(
        isinstance(ctx.model.head, nn.Linear),
        f"{method} needs a model whose head is one Linear layer, got "
        f"{type(ctx.model.head).__name__}",
    )
