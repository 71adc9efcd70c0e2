"""What an algorithm may use: the model as a pure function, the data, the training
settings, and one call that trains a cohort locally. Algorithms own no loop of their own,
and the context is frozen: it is shared by every method of the run's engine, so a method
that trains another model says so with ``Algorithm.wrap_model`` instead of replacing it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from ..data.federated import FederatedData, Split
from ..models.base import FedModel
from ..models.chain import Op, conv_chain
from .execution import replica
from .fused import declares_plain_cross_entropy
from .local import LocalTrainer, LossFn, TrainResult, on_flat_trees
from .rng import torch_seed
from .schedule import Schedule, make_schedule
from .sgd import SGDConfig
from .tree import Tree, flatten, is_nested, to_device, unflatten


@dataclass(frozen=True)
class Cohort:
    """The clients trained together in one chunk of a round (or evaluated together)."""

    ids: Tensor  # [C] int64 client ids
    round: int
    num_examples: Tensor  # [C] float training-set sizes (aggregation weights)

    def __len__(self) -> int:
        return int(self.ids.numel())


@dataclass(frozen=True)
class Context:
    model: FedModel
    data: FederatedData  # on `device`
    device: torch.device
    seed: int
    sgd: SGDConfig
    batch_size: int
    local_epochs: int | None
    local_steps: int | None
    trainer: LocalTrainer
    initial_params: Tree
    initial_buffers: Tree
    cohort_size: int = 0  # clients per batched call (0: all at once), the run's cohort_size
    # a loss of nested trees → its form on flattened trees (one per loss, so the trainer's
    # per-objective caches — compiled steps, auto's timings — see the same function)
    flat_losses: dict = field(default_factory=dict, repr=False, compare=False)

    def __getattribute__(self, name: str):
        # on a client-group thread (execution = sequential) ``ctx.model`` is that thread's
        # copy: functional_call swaps a module's tensors while it runs
        value = object.__getattribute__(self, name)
        return replica(value) if name == "model" else value

    @staticmethod
    def module(m: torch.nn.Module) -> torch.nn.Module:
        """The module a loss may ``functional_call``: ``m``, or on a client-group thread
        that thread's copy of it (for modules an algorithm holds besides ``ctx.model``)."""
        return replica(m)

    def forward(self, params: Tree, buffers: Tree, x: Tensor) -> Tensor:
        return self.trainer.forward(params, buffers, x)

    def fused_cnn(self) -> list[Op] | None:
        """The model's CNN chain (``models/chain.py``) where the engine trains it by hand
        (``engine/fused_conv.py``: a CPU, ``execution = auto``, no buffers, not compiled: a
        rule is compiled with its step, and this one calls ATen's kernels by hand), else
        ``None``: for methods with an update rule of their own on such a model (pFedMe)."""
        trainer = self.trainer
        if not trainer.fused or trainer.execution != "auto" or trainer.compile:
            return None
        if self.device.type != "cpu":
            return None
        return None if self.initial_buffers else conv_chain(self.model)

    def cohort(self, ids: Tensor, round_: int) -> Cohort:
        sizes = self.data.train.sizes()[ids.cpu()].to(torch.float32)
        return Cohort(ids.cpu(), round_, sizes)

    def cohorts(self, ids: Tensor, round_: int) -> list[Cohort]:
        """``ids`` as cohorts of at most ``cohort_size`` clients, for an algorithm's own
        passes over clients (a statistics round before training)."""
        size = self.cohort_size if self.cohort_size > 0 else max(int(ids.numel()), 1)
        return [self.cohort(chunk, round_) for chunk in ids.split(size)]

    def schedule(
        self,
        cohort: Cohort,
        purpose: str,
        epochs: int | None = None,
        steps: int | None = None,
        batch_size: int | list[int] | None = None,
        split: Split | None = None,
    ) -> Schedule:
        """Per-client minibatch order; defaults to the run's local_epochs / local_steps."""
        if epochs is None and steps is None:
            epochs, steps = self.local_epochs, self.local_steps
        return make_schedule(
            split if split is not None else self.data.train,
            cohort.ids,
            seed=self.seed,
            round_=cohort.round,
            purpose=purpose,
            batch_size=self.batch_size if batch_size is None else batch_size,
            epochs=epochs,
            steps=steps,
        )

    def train(
        self,
        loss_fn: LossFn,
        params: Tree,
        buffers: Tree,
        cohort: Cohort,
        purpose: str = "train",
        *,
        epochs: int | None = None,
        steps: int | None = None,
        sgd: SGDConfig | None = None,
        shared: Tree | None = None,
        per_client: Tree | None = None,
        trainable: Callable[[str], bool] | None = None,
        noise: dict[str, tuple[int, ...]] | None = None,
        batch_size: int | None = None,
        inputs: Tensor | None = None,
        row_extras: Tree | None = None,
    ) -> TrainResult:
        """Train stacked ``params`` of the cohort on each client's own training data.

        ``noise`` (name → shape): per-step standard-normal extras, seeded per client by
        (seed, round, client, purpose), for objectives that sample (see LocalTrainer.train).
        ``batch_size`` overrides the run's (<= 0: each step sees the client's whole split).
        ``inputs`` ([M, …], one per training row, e.g. features from ``client_rows``)
        replace the images as the loss's ``x``; ``row_extras`` (name → [M, …]) reach the
        loss's extras per minibatch. The minibatches are the same either way: the schedule
        depends on the rows' owners and the purpose only.
        """
        split = self.data.train
        for name, v in {"inputs": inputs, **flatten(row_extras or {})}.items():
            if v is not None and v.shape[0] != split.y.shape[0]:
                raise ValueError(
                    f"{name} has {v.shape[0]} rows; the training split has {split.y.shape[0]}"
                )
        if inputs is not None:
            if declares_plain_cross_entropy(loss_fn):
                raise ValueError(
                    "inputs= replaces the model's inputs, but the engine's risk runs the model "
                    "on x: give a loss written for the inputs (e.g. a head on features)"
                )
            split = Split(inputs, split.y, split.offsets, split.env)
        sched = self.schedule(cohort, purpose, epochs, steps, batch_size)
        generators = None
        if noise:
            generators = [
                torch.Generator().manual_seed(
                    torch_seed(self.seed, cohort.round, c, purpose + "/noise")
                )
                for c in cohort.ids.tolist()
            ]
        # what the method made on the CPU (per-client α, DRO weights) joins the cohort
        shared, per_client, row_extras = (
            to_device(t or {}, self.device) for t in (shared, per_client, row_extras)
        )
        parts = (params, buffers, shared, per_client, row_extras)
        nested = any(is_nested(t) for t in parts)
        if nested:  # the trainer steps flat trees: the loss gets the nesting back
            if loss_fn not in self.flat_losses:
                self.flat_losses[loss_fn] = on_flat_trees(loss_fn)
            loss_fn = self.flat_losses[loss_fn]
            params, buffers, shared, per_client, row_extras = (flatten(t) for t in parts)
        out = self.trainer.train(
            loss_fn,
            params,
            buffers,
            split,
            sched,
            sgd or self.sgd,
            shared=shared,
            per_client=per_client,
            trainable=trainable,
            noise=noise,
            generators=generators,
            row_extras=row_extras,
        )
        if nested:
            out = replace(out, params=unflatten(out.params), buffers=unflatten(out.buffers))
        return out
