"""Local training for a whole cohort at once.

The client step is written once for a single client — ``grad`` of the algorithm's loss —
and ``vmap``-ed over the cohort; the SGD update is then applied in place to the stacked
parameters (one pass per tensor, no copies: large models are memory-bound here). Clients
are sorted by their step counts, so at step ``s`` the clients still training are a prefix
of the cohort: the step runs on that prefix only (finished clients are dropped from the
batch, not masked into it). The step is a pure tensors-in/tensors-out function, so
``torch.compile`` can take it whole; compiled, it runs at power-of-two widths (the extra
finished clients' results are dropped) so that it needs a logarithmic number of graphs.

When the loss is declared plain cross-entropy and the model is an MLP, a fused in-place
step replaces ``vmap(grad)`` (see ``fused.py``; equal up to float32 rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from ..data.federated import Split
from ..models.base import FedModel
from .allocator import keep_freed_memory
from .fused import FusedMLPStep
from .schedule import Schedule
from .sgd import SGDConfig, sgd_update_
from .tree import Tree, take

# loss_fn(params, buffers, extras, x, y, w) -> scalar, for ONE client (vmapped by the trainer)
LossFn = Callable[[Tree, Tree, Tree, Tensor, Tensor, Tensor], Tensor]


# torch.compile: graphs allowed per step function (objectives × widths); the default (8)
# would send the rest back to eager
RECOMPILE_LIMIT = 64


def compiled_width(k: int, cohort: int) -> int:
    """Width a compiled step runs at when ``k`` of ``cohort`` clients are active: the next
    power of two, at most the cohort."""
    return min(cohort, 1 << (k - 1).bit_length())


@dataclass
class TrainResult:
    params: Tree  # stacked, cohort order
    buffers: Tree  # stacked, cohort order
    loss: Tensor  # [C] mean loss over each client's own steps
    steps: Tensor  # [C] steps each client took


class TrainingAbandoned(Exception):
    """Local training stopped between two steps on request (``LocalTrainer.should_stop``)."""


class LocalTrainer:
    def __init__(self, model: FedModel, compile: bool = False, fused: bool = True) -> None:
        self.model = model
        self.compile = compile
        self.fused = fused  # allow the fused cross-entropy MLP step where it applies
        self.bucket_widths = compile  # run general steps at power-of-two widths
        self._steps: dict = {}
        # asked between local steps: True abandons the training in progress (the runner
        # sets it while a stop was requested and the round has changed no state yet)
        self.should_stop: Callable[[], bool] = lambda: False
        keep_freed_memory()

    def between_steps(self) -> None:
        if self.should_stop():
            raise TrainingAbandoned

    def forward(self, params: Tree, buffers: Tree, x: Tensor) -> Tensor:
        """The model as a pure function of its parameters and buffers."""
        return functional_call(self.model, (params, buffers), (x,))

    def _step_fn(self, loss_fn: LossFn, sgd: SGDConfig, train_keys: tuple[str, ...]):
        key = (loss_fn, sgd, train_keys)
        if key in self._steps:
            return self._steps[key]

        def objective(trained, frozen, buffers, extras, x, y, w):
            loss = loss_fn({**frozen, **trained}, buffers, extras, x, y, w)
            return loss, loss

        def step(trained, frozen, buffers, shared, per_client, x, y, w):
            return grad(objective, has_aux=True)(
                trained, frozen, buffers, {**shared, **per_client}, x, y, w
            )

        fn = vmap(step, in_dims=(0, 0, 0, None, 0, 0, 0, 0))
        if self.compile:
            # one static graph per bucket of active clients (see ``compiled_width``); every
            # objective and bucket is a separate entry of the same cache
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
            fn = torch.compile(fn, dynamic=False)
        self._steps[key] = fn
        return fn

    def train(
        self,
        loss_fn: LossFn,
        params: Tree,
        buffers: Tree,
        split: Split,
        schedule: Schedule,
        sgd: SGDConfig,
        shared: Tree | None = None,
        per_client: Tree | None = None,
        trainable: Callable[[str], bool] | None = None,
        noise: dict[str, tuple[int, ...]] | None = None,
        generators: list[torch.Generator] | None = None,
    ) -> TrainResult:
        """Run every client's own schedule; returns new stacked params and buffers.

        When ``split`` has environment ids, each client's extras carry ``env`` ([B], the
        environment of each minibatch sample) for methods that need them (FedSDR, DRFA …).
        ``noise`` (name → shape) adds fresh standard-normal tensors to each client's extras
        at every step, drawn from that client's own ``generators[i]`` (one per client, in
        cohort order), so stochastic objectives (e.g. FedSR's sampled representation) stay
        independent of the cohort size: vmap itself forbids random ops in the step.
        """
        device = next(iter(params.values())).device
        order = torch.argsort(schedule.steps, descending=True, stable=True)
        inverse = torch.argsort(order)
        steps = schedule.steps[order]
        idx = schedule.index[order].to(device)
        wgt = schedule.weight[order].to(device)
        train_keys = tuple(k for k in params if trainable is None or trainable(k))
        trained = {k: params[k][order.to(device)].clone() for k in train_keys}
        frozen = {k: v[order.to(device)] for k, v in params.items() if k not in trained}
        bufs = {k: v[order.to(device)].clone() for k, v in buffers.items()}
        momentum = {k: torch.zeros_like(v) for k, v in trained.items()}
        pc = take(per_client or {}, order.to(device))
        loss_sum = torch.zeros(len(order), device=device)
        self.model.train()
        # active clients at step s: those with steps > s (a prefix: steps sort descending)
        steps_np = steps.numpy()
        active = (steps_np[None, :] > np.arange(schedule.max_steps)[:, None]).sum(1).tolist()
        layers = FusedMLPStep.applies(loss_fn, self.model, buffers, noise) if self.fused else None
        if layers is not None:
            fused = FusedMLPStep(layers, sgd, train_keys)
            x_flat = split.x.reshape(split.x.shape[0], -1)
            every = {**trained, **frozen}
            loss_sum += fused.train(
                every, momentum, x_flat, split.y, idx, wgt, active, self.between_steps
            )
            active = []
        step = self._step_fn(loss_fn, sgd, train_keys) if active else None
        cohort = len(order)
        for s, k in enumerate(active):
            self.between_steps()
            # compiled: run a bucketed width (finished clients' slots have zero weight and
            # their results are dropped), so the number of graphs stays logarithmic; not
            # with buffers, which a step may update in place (batch-norm statistics)
            kw = compiled_width(k, cohort) if self.bucket_widths and not bufs else k
            rows = idx[:kw, s]
            xb = split.x.index_select(0, rows.reshape(-1)).view(*rows.shape, *split.x.shape[1:])
            extras = take(pc, slice(0, kw))
            if split.env is not None:
                extras["env"] = split.env[rows]  # [kw, B] environment id of each sample
            for name, shape in (noise or {}).items():
                draws = [torch.randn(shape, generator=generators[int(order[j])]) for j in range(k)]
                draws += [torch.zeros(shape)] * (kw - k)  # dropped slots: no draws
                extras[name] = torch.stack(draws).to(device)
            grads, loss = step(
                take(trained, slice(0, kw)),
                take(frozen, slice(0, kw)),
                take(bufs, slice(0, kw)),
                shared or {},
                extras,
                xb,
                split.y[rows],
                wgt[:kw, s],
            )
            if kw > k:
                grads, loss = take(grads, slice(0, k)), loss[:k]
            mine = take(trained, slice(0, k))  # views: updated in place
            sgd_update_(mine, grads, take(momentum, slice(0, k)), sgd)
            loss_sum[:k] += loss.detach()
        out = {**trained, **frozen}
        mean_loss = loss_sum / steps.clamp(min=1).to(device)
        inv = inverse.to(device)
        return TrainResult(
            params={k: out[k][inv] for k in params},
            buffers={k: v[inv] for k, v in bufs.items()},
            loss=mean_loss[inv],
            steps=steps[inverse],
        )
