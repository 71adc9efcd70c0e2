"""The algorithm contract: everything a method may use from the engine, in one module.

A method module imports engine names from here only (``tests/test_import_graph.py``): the
classes below, the :class:`Context` it is given, the state helpers, and the few services a
loss or an update needs (seeded generators, the SGD settings, the fused-path and
single-thread marks, a client's minibatch order).

An algorithm is a small class over explicit state; the engine owns the loop. Per round the
engine samples clients, splits them into cohorts of at most ``cohort_size`` and calls:

1. ``configure(server, cohort) -> Payload`` — what each client receives: a ``broadcast``
   mapping (the same tensors for every client: FedAvg's global model) and/or a stacked
   ``per_client`` mapping (IFCA / CGPFL / UCFL send each client its own cluster model).
2. ``client_update(payload, state, cohort) -> ClientResult`` — local training of the
   whole cohort at once (``ctx.train`` runs a vmapped loss, or an update rule marked with
   ``update_rule`` where the algorithm box says how the model moves: pFedMe, CGPFL,
   PerInvFL), returning stacked
   ``upload`` tensors, the new per-client persistent ``state`` (Ditto's and pFedMe's
   personal models, SCAFFOLD's control variates, Local's models; ``{}`` when stateless)
   and explicit aggregation weights ``num_examples``.
3. ``aggregate(server, uploads, info) -> server`` — once per round with the uploads of
   every participant, stacked in ``info.ids`` order. Server-side maths (k-means,
   silhouette, QPs, DRO weights) lives here; server state may hold anything that is a
   tensor (global models, cluster models, DRO weights, control variates).
4. ``predictor(server, state, cohort) -> Prediction`` — the model each client is
   evaluated with: the global model (``shared=True``), the client's personal model, or a
   model built on the spot (FTFA fine-tunes the global model on the client's data).

``init()`` builds the server state and ``init_client_state(server)`` a single-client
template of the persistent client state (the engine stacks it for all N clients, lazily).
An algorithm whose box trains *every* client each round while only the sampled ones upload
(FedSDR, thesis Alg. 2 line 4) sets ``trains_unsampled = True`` and implements
``update_unsampled(server, state, cohort) -> state``: the engine calls it, in cohorts, for
the clients not sampled in the round, with the round's server state (before aggregation).
Optional ``before_training(server)`` runs once before round 0 (UCFL's gradient statistics
round); the class method ``wrap_model`` gives the model the method trains (DFL's two
branches) before the context is built. State, payloads and uploads are trees: mappings
of names to tensors or to further trees (``{"p": params, "b": buffers}``; pFedMe's client
state ``{"pm": θ}``), never names with prefixes. The engine stacks, slices, averages and
counts them whatever their shape (``tree.py``), so communication cost is a generic sum of
bytes, and checkpoints and Flower records hold their flattened form (``"p/fc1.weight"``)
without knowing the algorithm.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from ..data.federated import FederatedData
from ..models.base import FedModel
from .context import Cohort, Context
from .execution import client_by_client, single_threaded
from .fused import (
    corrected_cross_entropy,
    linear,
    linear_grads,
    mlp_extractor,
    mlp_risk_gradient,
    plain_cross_entropy,
    proximal_cross_entropy,
)
from .fused_conv import FusedConvStep
from .fused_heads import grouped_linear_cross_entropy
from .local import LossFn, TrainResult
from .risk import cross_entropy, cross_entropy_gradient, gradient_by, loss_scale, sample_mean
from .rng import generator, torch_seed
from .rule import batched_update_rule, update_rule
from .schedule import client_order
from .sgd import SGDConfig
from .tree import (
    Tree,
    flatten,
    leaves,
    put,
    select,
    stack,
    take,
    to_device,
    tree_map,
    unflatten,
    weighted_mean,
)

__all__ = [
    "Algorithm",
    "ClientResult",
    "Cohort",
    "Context",
    "LossFn",
    "Payload",
    "Prediction",
    "RoundInfo",
    "FusedConvStep",
    "SGDConfig",
    "TrainResult",
    "Tree",
    "client_order",
    "client_by_client",
    "corrected_cross_entropy",
    "cross_entropy",
    "cross_entropy_gradient",
    "linear",
    "linear_grads",
    "flatten",
    "generator",
    "leaves",
    "loss_scale",
    "gradient_by",
    "grouped_linear_cross_entropy",
    "batched_update_rule",
    "mlp_extractor",
    "mlp_risk_gradient",
    "proximal_cross_entropy",
    "put",
    "sample_mean",
    "select",
    "single_threaded",
    "stack",
    "take",
    "torch_seed",
    "tree_map",
    "unflatten",
    "update_rule",
    "weighted_mean",
]


@dataclass
class Payload:
    broadcast: Tree = field(default_factory=dict)  # same for every client of the cohort
    per_client: Tree = field(default_factory=dict)  # stacked over the cohort

    def to(self, device) -> Payload:
        """The payload with every tensor on ``device`` (the cohort's): what ``configure``
        made on the CPU (a per-client α, a round counter) must not meet the cohort's
        tensors on another device."""
        return Payload(to_device(self.broadcast, device), to_device(self.per_client, device))


@dataclass
class ClientResult:
    upload: Tree  # stacked over the cohort
    state: Tree  # new persistent client state, stacked ({} if stateless)
    num_examples: Tensor  # [C] aggregation weights
    loss: Tensor  # [C] mean local training loss


@dataclass
class RoundInfo:
    """The participants of a round, in the order their uploads are stacked.

    ``log`` collects per-round figures an algorithm wants recorded (UCFL's simulated time,
    FedIPG's contributions C_i^t, chosen cluster counts …): name → number or list of
    numbers (tensors are converted). The runner stores it with the round's record.
    """

    ids: Tensor
    num_examples: Tensor
    round: int
    log: dict = field(default_factory=dict)


@dataclass
class Prediction:
    params: Tree
    buffers: Tree
    shared: bool  # True: one model for every client (no client axis)


class Algorithm(ABC):
    name: ClassVar[str]
    Hyper: ClassVar[type]
    personalized: ClassVar[bool] = False
    trains_unsampled: ClassVar[bool] = False  # update_unsampled runs for the other clients

    def __init__(self, hyper: Any, ctx: Context) -> None:
        self.hp = hyper
        self.ctx = ctx

    @classmethod
    def wrap_model(cls, model: FedModel, hyper: Any, data: FederatedData, seed: int) -> FedModel:
        """The model this method trains, built from the run's ``model`` before the context
        is made (DFL adds a second feature extractor): the context is never rebuilt later."""
        return model

    @abstractmethod
    def init(self) -> Tree: ...

    def init_client_state(self, server: Tree) -> Tree:
        return {}

    def before_training(self, server: Tree) -> Tree:
        return server

    def update_unsampled(self, server: Tree, state: Tree, cohort: Cohort) -> Tree:
        """New persistent state of clients NOT sampled this round (``trains_unsampled``)."""
        return state

    @plain_cross_entropy
    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w) -> Tensor:
        """The local empirical risk: weighted cross-entropy of the model's output (``extras``
        unused). A method that only changes what is trained and how it is combined keeps
        it, and the engine may then train it with its fused step; a method whose local
        objective adds a term overrides it (and so never takes that step)."""
        return cross_entropy(self.ctx.forward(params, buffers, x), y, w)

    def risk_gradient(self):
        """``loss``'s risk with its gradient written out, ``(params, x, y, w) -> (grads,
        risk)``, for a model it handles (an MLP: ``mlp_risk_gradient``), else ``None``: for
        methods whose objective adds a term to the risk (``gradient_by``)."""
        if not hasattr(self, "_risk_gradient"):
            self._risk_gradient = mlp_risk_gradient(self.ctx.model)
        return self._risk_gradient

    def extractor(self):
        """The model's extractor Φ as forward/backward functions (``mlp_extractor``) for an
        MLP, else ``None``: for methods that write out the gradient of their own terms on
        Φ(x) (FedSR, FedIIR, FedPIN, FedSDR)."""
        if not hasattr(self, "_extractor"):
            self._extractor = mlp_extractor(self.ctx.model)
        return self._extractor

    def head_risk(self, params: Tree, x, y, w):
        """Φ(x) through the MLP extractor (``extractor()``), the linear head's risk and
        ∂risk/∂logits: ``(z, cache, risk, δ)``, the common start of a written gradient (for
        one client or, with a leading client axis on every tensor, the cohort)."""
        z, cache = self.extractor().forward(params, x)
        logits = linear(z, params["head.weight"], params["head.bias"])
        risk, d_logits, _ = cross_entropy_gradient(logits, y, w)
        return z, cache, risk, d_logits

    def head_risk_backward(self, params: Tree, cache, z, d_logits, d_z):
        """Every gradient of the extractor and the linear head from ∂/∂logits plus the
        objective's own ∂/∂Φ(x) ``d_z`` (``None`` when it has none)."""
        through_head = d_logits @ params["head.weight"]
        d_z = through_head if d_z is None else through_head + d_z
        grads = self.extractor().backward(params, cache, d_z)
        grads["head.weight"], grads["head.bias"] = linear_grads(d_logits, z)
        return grads

    def has_risk_gradient(self) -> bool:
        return self.risk_gradient() is not None

    @abstractmethod
    def configure(self, server: Tree, cohort: Cohort) -> Payload: ...

    @abstractmethod
    def client_update(self, payload: Payload, state: Tree, cohort: Cohort) -> ClientResult: ...

    @abstractmethod
    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree: ...

    @abstractmethod
    def predictor(self, server: Tree, state: Tree, cohort: Cohort) -> Prediction: ...
