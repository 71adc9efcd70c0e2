"""Local training for a whole cohort at once.

The client step is written once for a single client — ``grad`` of the algorithm's loss, or
an update rule's new values (``rule.py``) — and ``vmap``-ed over the cohort; the SGD update
(or the rule's values) is then applied in place to the stacked parameters (one pass per
tensor, no copies: large models are memory-bound here). Clients
are sorted by their step counts, so at step ``s`` the clients still training are a prefix
of the cohort: the step runs on that prefix only (finished clients are dropped from the
batch, not masked into it). The step is a pure tensors-in/tensors-out function, so
``torch.compile`` can take it whole; compiled, it runs at power-of-two widths (the extra
finished clients' results are dropped) so that it needs a logarithmic number of graphs.

When the loss is the engine's own risk (``Algorithm.loss`` kept) and the model is an MLP, a
fused in-place step replaces ``vmap(grad)`` (see ``fused.py``; equal up to float32 rounding).

``execution`` chooses how the general step runs: ``batched`` (the ``vmap`` above),
``sequential`` (the same un-``vmap``-ped step, each client's whole schedule in turn, client
groups on ``workers`` threads with one intra-op thread each: a batch of ten images uses one
core poorly, and the kernels release the GIL), or ``auto`` (the default: both are timed on
the first step of the first call for each objective and cohort width, on copies, and the
faster is kept for the rest of the process; see ``execution.py``). Both give the same
numbers up to float32 rounding (tests/engine/test_execution.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from ..data.federated import Split
from ..models.base import FedModel
from .allocator import keep_freed_memory
from .execution import (
    EXECUTIONS,
    Choice,
    ExecutionChoice,
    balanced_groups,
    choose,
    default_workers,
    replica,
    time_pair,
    worker_thread,
)
from .fused import FusedMLPStep, declares_corrected_cross_entropy, proximal_weight
from .fused_conv import FusedConvStep
from .fused_heads import FusedGroupedHeads
from .risk import written_gradient
from .rule import is_batched_rule, is_update_rule, update_rule
from .schedule import Schedule
from .sgd import SGDConfig, sgd_update_
from .tree import Tree, clone, flatten, take, unflatten

# loss_fn(params, buffers, extras, x, y, w) -> scalar, for ONE client (vmapped by the trainer)
LossFn = Callable[[Tree, Tree, Tree, Tensor, Tensor, Tensor], Tensor]


def on_flat_trees(loss_fn: LossFn) -> LossFn:
    """``loss_fn`` of nested trees as a loss of their flattened forms (what the trainer
    stacks and steps), its written gradient (``gradient_by``) and marks carried over; an
    update rule's new values are flattened back."""
    rule = is_update_rule(loss_fn)

    def loss(params, buffers, extras, x, y, w):
        out = loss_fn(unflatten(params), unflatten(buffers), unflatten(extras), x, y, w)
        if rule:
            new, value = out
            return flatten(new), value
        return out

    if rule:
        update_rule(loss, batched=is_batched_rule(loss_fn))

    written = written_gradient(loss_fn)
    if written is not None:

        def gradient(params, buffers, extras, x, y, w):
            args = unflatten(params), unflatten(buffers), unflatten(extras)
            grads, value = written(*args, x, y, w)
            return flatten(grads), value

        loss.gradient = gradient
        loss.gradient_batched = getattr(loss_fn, "gradient_batched", False)
    loss.__qualname__ = getattr(loss_fn, "__qualname__", type(loss_fn).__name__)
    loss.single_threaded = getattr(loss_fn, "single_threaded", False)
    loss.client_by_client = getattr(loss_fn, "client_by_client", False)
    return loss


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


def apply_step_(params: Tree, out: Tree, momentum: Tree, sgd: SGDConfig, rule: bool) -> None:
    """One step's result into (views of) the stacked ``params``, in place: an update rule's
    new values as they are, a loss's gradients by the SGD step."""
    if rule:
        for k, v in out.items():
            params[k].copy_(v)
    else:
        sgd_update_(params, out, momentum, sgd)


class TrainingAbandoned(Exception):
    """Local training stopped between two steps on request (``LocalTrainer.should_stop``)."""


@dataclass
class _Call:
    """The state of one ``train`` call, in cohort (descending-steps) order, and the inputs
    of a step cut from it: batched over a prefix of clients, or for one client."""

    split: Split
    idx: Tensor  # [C, S, B]
    wgt: Tensor  # [C, S, B]
    per_client: Tree
    shared: Tree
    trained: Tree  # stacked, updated in place
    frozen: Tree
    bufs: Tree  # stacked, updated in place by steps (batch-norm statistics)
    noise: dict[str, tuple[int, ...]] | None
    row_extras: Tree  # name → [M, …] aligned with the split's rows, gathered per step

    @property
    def width(self) -> int:
        return len(self.idx)

    def copy(self, width: int) -> _Call:
        """The first ``width`` clients, with copies of what a step may change."""
        cut = slice(0, width)
        return _Call(
            self.split,
            self.idx[cut],
            self.wgt[cut],
            take(self.per_client, cut),
            self.shared,
            clone(take(self.trained, cut)),
            take(self.frozen, cut),
            clone(take(self.bufs, cut)),
            self.noise,
            self.row_extras,
        )

    def _noise(self, generator: torch.Generator | None) -> Tree:
        # no generator: zeros (timing runs draw nothing, dropped slots take no draws)
        return {
            name: torch.randn(shape, generator=generator) if generator else torch.zeros(shape)
            for name, shape in (self.noise or {}).items()
        }

    def batch_args(self, kw: int, s: int, generators: list[torch.Generator] | None = None):
        """Arguments of the batched step for the first ``kw`` clients at step ``s``; noise
        from ``generators`` (one per active client, the rest of the ``kw`` slots get zeros)."""
        rows = self.idx[:kw, s]
        x = self.split.x
        xb = gather_rows(x, rows)
        extras = take(self.per_client, slice(0, kw))
        if self.split.env is not None:
            extras["env"] = gather_rows(self.split.env, rows)  # [kw, B] environment ids
        extras.update({name: gather_rows(v, rows) for name, v in self.row_extras.items()})
        if self.noise:
            gens = list(generators or [])
            draws = [self._noise(g) for g in gens] + [self._noise(None)] * (kw - len(gens))
            for name in self.noise:
                extras[name] = torch.stack([d[name] for d in draws]).to(x.device)
        cut = slice(0, kw)
        return (
            take(self.trained, cut),
            take(self.frozen, cut),
            take(self.bufs, cut),
            self.shared,
            extras,
            xb,
            gather_rows(self.split.y, rows),
            self.wgt[:kw, s],
        )

    def client_state(self, j: int) -> Tree:
        """Client ``j``'s trained tensors: views of the stack."""
        return take(self.trained, j)

    def client_args(self, j: int, s: int, work: Tree, generator: torch.Generator | None = None):
        """Arguments of the un-batched step for client ``j`` at step ``s``."""
        rows = self.idx[j, s]
        xb = self.split.x.index_select(0, rows)
        extras = take(self.per_client, j)
        if self.split.env is not None:
            extras["env"] = self.split.env[rows]
        extras.update({name: v[rows] for name, v in self.row_extras.items()})
        extras.update({k: v.to(xb.device) for k, v in self._noise(generator).items()})
        return (
            work,
            take(self.frozen, j),
            take(self.bufs, j),
            self.shared,
            extras,
            xb,
            self.split.y[rows],
            self.wgt[j, s],
        )


def gather_rows(v: Tensor, rows: Tensor) -> Tensor:
    """``v[rows]`` for a [kw, B] index by ``index_select`` on the flat index: the same rows,
    2.7× faster than advanced indexing for a step's [8, 64] rows of a [54000, 100] table
    (41 against 15 µs)."""
    return v.index_select(0, rows.reshape(-1)).view(*rows.shape, *v.shape[1:])


class LocalTrainer:
    def __init__(
        self,
        model: FedModel,
        compile: bool = False,
        fused: bool = True,
        execution: str = "auto",
        workers: int = 0,
    ) -> None:
        if execution not in EXECUTIONS:
            raise ValueError(f"execution must be one of {', '.join(EXECUTIONS)}, got {execution!r}")
        self.model = model
        self.compile = compile
        self.fused = fused  # allow the fused cross-entropy MLP step where it applies
        self.bucket_widths = compile  # run general steps at power-of-two widths
        self.execution = execution
        self.workers = workers  # client-after-client threads (0: default_workers)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self.choices = ExecutionChoice()  # what auto measured and chose, per objective/width
        shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
        conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
        self._convolutional = any(isinstance(m, conv) for m in model.modules())
        self._model_id = f"{type(model).__name__}#{zlib.crc32(repr(shapes).encode()):08x}"
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
        return functional_call(replica(self.model), (params, buffers), (x,))

    def _step_fn(
        self, loss_fn: LossFn, sgd: SGDConfig, train_keys: tuple[str, ...], batched: bool = True
    ):
        key = (loss_fn, sgd, train_keys, batched)
        if key in self._steps:
            return self._steps[key]

        def objective(trained, frozen, buffers, extras, x, y, w):
            loss = loss_fn({**frozen, **trained}, buffers, extras, x, y, w)
            return loss, loss

        rule = is_update_rule(loss_fn)
        written = written_gradient(loss_fn)
        if rule and is_batched_rule(loss_fn):  # new values, not gradients: the same call
            cohort_at_once = loss_fn
        elif written is not None and getattr(loss_fn, "gradient_batched", False):
            cohort_at_once = written
        else:
            cohort_at_once = None
        if cohort_at_once is not None:
            fn = self._batched_written_step(cohort_at_once, batched)
            self._steps[key] = fn
            return fn

        def step(trained, frozen, buffers, shared, per_client, x, y, w):
            # returns what ``apply_step_`` applies: new values (a rule) or gradients
            if rule:
                new, loss = loss_fn(
                    {**frozen, **trained}, buffers, {**shared, **per_client}, x, y, w
                )
                return {k: new[k] for k in trained}, loss
            if written is not None:
                grads, loss = written(
                    {**frozen, **trained}, buffers, {**shared, **per_client}, x, y, w
                )
                return {k: grads[k] for k in trained}, loss
            return grad(objective, has_aux=True)(
                trained, frozen, buffers, {**shared, **per_client}, x, y, w
            )

        fn = vmap(step, in_dims=(0, 0, 0, None, 0, 0, 0, 0)) if batched else step
        if self.compile:
            # one static graph per bucket of active clients (see ``compiled_width``); every
            # objective and bucket is a separate entry of the same cache
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
            fn = torch.compile(fn, dynamic=False)
        self._steps[key] = fn
        return fn

    @staticmethod
    def _batched_written_step(written, batched: bool):
        """The step of a gradient written for the whole cohort (``gradient_by(batched=True)``)
        or of a batched update rule (its new values in place of gradients): called on the
        stacked tensors as they are, shared extras given the client axis; the un-batched
        (client after client) step gives each tensor a client axis of one."""

        def step(trained, frozen, buffers, shared, per_client, x, y, w):
            n = x.shape[0]
            extras = {**{k: v.expand(n, *v.shape) for k, v in shared.items()}, **per_client}
            grads, loss = written({**frozen, **trained}, buffers, extras, x, y, w)
            return {k: grads[k] for k in trained}, loss

        if batched:
            return step

        def one(trained, frozen, buffers, shared, per_client, x, y, w):
            def add(t):
                return {k: v.unsqueeze(0) for k, v in t.items()}

            args = (add(trained), add(frozen), add(buffers), shared, add(per_client))
            grads, loss = step(*args, x[None], y[None], w[None])
            return {k: v[0] for k, v in grads.items()}, loss[0]

        return one

    def _runs_sequential(
        self, loss_fn: LossFn, sgd: SGDConfig, train_keys: tuple[str, ...], call: _Call, width: int
    ) -> bool:
        """Whether this call runs client after client (``execution``; ``auto`` measures)."""
        if getattr(loss_fn, "client_by_client", False):
            return True
        if self.execution != "auto":
            return self.execution == "sequential"
        if width == 1:  # nothing to batch over: vmap of one is the plain step, keep it
            return False
        if not self._convolutional:
            # without convolutions the batched step won every measurement (MLPs and
            # cmnist's perceptron: sequential 2–4× slower per client-step, docs/
            # performance.md); not timing them keeps such runs on one path whatever the load
            return False
        x = call.split.x
        signature = (  # printed in the round's record: short, and stable across processes
            getattr(loss_fn, "__qualname__", type(loss_fn).__name__),
            self._model_id,
            zlib.crc32(repr(train_keys).encode()),
            f"width<={1 << (width - 1).bit_length()}",
            f"x{list(x.shape[1:])}",
            f"batch {call.idx.shape[2]}",
            str(x.device),
            f"threads {torch.get_num_threads()}",
            "compiled" if self.compile else "eager",
        )
        made = self.choices.get(signature)
        if made is None:
            made = self._measure(loss_fn, sgd, train_keys, call, width)
            self.choices.record(signature, made)
        return made.mode == "sequential"

    def _measure(
        self, loss_fn: LossFn, sgd: SGDConfig, train_keys: tuple[str, ...], call: _Call, width: int
    ) -> Choice:
        """Seconds per client-step of the first step, batched and client after client, on
        copies of the state (gradients only: nothing is updated, no generator is drawn)."""
        kw = compiled_width(width, len(call.idx)) if self.bucket_widths and not call.bufs else width
        copy = call.copy(kw)
        batched = self._step_fn(loss_fn, sgd, train_keys, batched=True)
        single = self._step_fn(loss_fn, sgd, train_keys, batched=False)
        workers = self._workers(loss_fn, call)
        few = list(range(min(width, 4 * workers)))  # a few steps per thread: dispatch amortised
        ones = [1] * len(few)

        def one_each(j: int) -> Tensor:
            return single(*copy.client_args(j, 0, copy.client_state(j)))[1]

        t_batched, t_single = time_pair(
            lambda: batched(*copy.batch_args(copy.width, 0)),
            lambda: self._map_clients(one_each, few, ones, workers),
        )
        t_batched, t_single = t_batched / width, t_single / len(few)
        return Choice(choose(t_batched, t_single), t_batched, t_single)

    def _train_sequential(
        self,
        loss_fn: LossFn,
        sgd: SGDConfig,
        train_keys: tuple[str, ...],
        call: _Call,
        momentum: Tree,
        steps: Tensor,
        order: Tensor,
        generators: list[torch.Generator] | None,
        rule: bool,
    ) -> Tensor:
        """Each client's whole schedule in turn with the un-batched step, SGD (or the update
        rule's values) in place on its slice of the stacked state; returns the per-client
        loss sums."""
        step = self._step_fn(loss_fn, sgd, train_keys, batched=False)

        def run_client(j: int) -> Tensor:
            work = call.client_state(j)  # views: updated in place
            mom = take(momentum, j)
            gen = generators[int(order[j])] if call.noise else None
            total = torch.zeros((), device=call.idx.device)
            for s in range(int(steps[j])):
                self.between_steps()
                out, loss = step(*call.client_args(j, s, work, generator=gen))
                total += loss.detach()  # first: a rule's loss may be a view of its state
                apply_step_(work, out, mom, sgd, rule)
            return total

        clients = list(range(len(order)))
        return self._map_clients(run_client, clients, steps.tolist(), self._workers(loss_fn, call))

    def _train_fused_conv(
        self, step: FusedConvStep, call: _Call, momentum: Tree, steps: Tensor, extras: bool
    ) -> Tensor:
        """Each client's whole schedule in turn with the fused CNN step, in place on its
        slice of the stacked state (client groups on threads, as ``_train_sequential``);
        with ``extras``, the client's extras under the parameters' names are its anchors or
        corrections. Returns the per-client loss sums."""
        x, y = call.split.x, call.split.y

        def run_client(j: int) -> Tensor:
            every = {**take(call.frozen, j), **call.client_state(j)}  # views of the stack
            mom = take(momentum, j)
            anchor = {}
            if extras:
                mine = {**call.shared, **take(call.per_client, j)}
                anchor = {k: v for k, v in mine.items() if k in every}
            total = torch.zeros((), device=call.idx.device)
            for s in range(int(steps[j])):
                self.between_steps()
                rows = call.idx[j, s]
                xb, yb = x.index_select(0, rows), y[rows]
                total += step.step(every, mom, xb, yb, call.wgt[j, s], anchor)
            return total

        clients = list(range(call.width))
        workers = self.workers or default_workers(call.idx.device)
        return self._map_clients(run_client, clients, steps.tolist(), workers)

    def _workers(self, loss_fn: LossFn, call: _Call) -> int:
        if getattr(loss_fn, "single_threaded", False):
            return 1
        return self.workers or default_workers(call.idx.device)

    def _map_clients(
        self, fn: Callable[[int], Tensor], clients: list[int], steps: list[int], workers: int
    ) -> Tensor:
        """``fn`` of every client, stacked in order: a plain loop, or client groups of near-
        equal steps on threads with one intra-op thread each (a small batch's kernels use
        one core poorly, and they release the GIL; clients share no state)."""
        if workers <= 1 or len(clients) == 1:
            return torch.stack([fn(j) for j in clients])
        groups = balanced_groups(steps, workers)
        grad_mode = torch.is_grad_enabled()  # thread-local: carry the caller's over

        def run_group(group: list[int]) -> list[tuple[int, Tensor]]:
            with torch.set_grad_enabled(grad_mode):
                return [(j, fn(j)) for j in group]

        if self._pool is None or self._pool_size != workers:
            # kept for the trainer's life: its threads keep their model replicas
            self._pool, self._pool_size = ThreadPoolExecutor(workers), workers
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            done = self._pool.map(worker_thread(run_group), groups)
            out = dict(pair for group in done for pair in group)
        finally:
            torch.set_num_threads(threads)
        return torch.stack([out[j] for j in clients])

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
        row_extras: Tree | None = None,
    ) -> TrainResult:
        """Run every client's own schedule; returns new stacked params and buffers.

        When ``split`` has environment ids, each client's extras carry ``env`` ([B], the
        environment of each minibatch sample) for methods that need them (FedSDR, DRFA …).
        ``noise`` (name → shape) adds fresh standard-normal tensors to each client's extras
        at every step, drawn from that client's own ``generators[i]`` (one per client, in
        cohort order), so stochastic objectives (e.g. FedSR's sampled representation) stay
        independent of the cohort size: vmap itself forbids random ops in the step.
        ``row_extras`` (name → [M, …], one entry per row of ``split``) are gathered like
        ``env``: each step's extras carry the entries of its minibatch's rows.

        The trees are flat here: ``Context.train`` flattens nested ones (``on_flat_trees``).
        """
        device = next(iter(params.values())).device
        order = torch.argsort(schedule.steps, descending=True, stable=True)
        inverse = torch.argsort(order)
        steps = schedule.steps[order]
        idx = schedule.index[order].to(device)
        wgt = schedule.weight[order].to(device)
        train_keys = tuple(k for k in params if trainable is None or trainable(k))
        # cohort order; clients already in it (e.g. equal sizes) are not permuted: each
        # permutation is a pass over the cohort's whole state
        same = bool((order == torch.arange(len(order))).all())
        dev_order = order.to(device)

        def reorder(v: Tensor) -> Tensor:
            return v if same else v[dev_order]

        def own_copy(v: Tensor) -> Tensor:  # indexing copies already
            return v.clone() if same else v[dev_order]

        trained = {k: own_copy(params[k]) for k in train_keys}
        frozen = {k: reorder(v) for k, v in params.items() if k not in trained}
        bufs = {k: own_copy(v) for k, v in buffers.items()}
        # momentum buffers only where SGD keeps them (a pass over the cohort's state saved)
        rule = is_update_rule(loss_fn)
        keeps_momentum = sgd.momentum and not rule
        momentum = {k: torch.zeros_like(v) for k, v in trained.items()} if keeps_momentum else {}
        pc = {k: reorder(v) for k, v in (per_client or {}).items()}
        loss_sum = torch.zeros(len(order), device=device)
        self.model.train()
        # active clients at step s: those with steps > s (a prefix: steps sort descending)
        steps_np = steps.numpy()
        active = (steps_np[None, :] > np.arange(schedule.max_steps)[:, None]).sum(1).tolist()
        fusable = self.fused and self.execution != "sequential"
        layers = FusedMLPStep.applies(loss_fn, self.model, buffers, noise) if fusable else None
        if layers is not None:
            mu = proximal_weight(loss_fn)
            corrected = declares_corrected_cross_entropy(loss_fn)
            every = {**trained, **frozen}
            anchor = {}  # a proximal anchor or a linear term: extras under the params' names
            if mu is not None or corrected:
                anchor = {k: (shared[k], False) for k in every if shared and k in shared}
                anchor.update({k: (pc[k], True) for k in every if k in pc})
            fused = FusedMLPStep(layers, sgd, train_keys, mu or 0.0, corrected, anchor)
            x_flat = split.x.reshape(split.x.shape[0], -1)
            loss_sum += fused.train(
                every, momentum, x_flat, split.y, idx, wgt, active, self.between_steps
            )
            active = []
        extras = bool(shared or pc or row_extras)
        heads = (
            FusedGroupedHeads.applies(loss_fn, params, train_keys, split.env, noise, extras)
            if fusable and active
            else None
        )
        if heads is not None:  # FedSDR's environment classifiers (fused_heads.py)
            z = split.x.reshape(split.x.shape[0], -1)
            loss_sum += FusedGroupedHeads(heads, sgd).train(
                trained, momentum, z, split.y, split.env, idx, wgt, active, self.between_steps
            )
            active = []
        call = _Call(
            split, idx, wgt, pc, shared or {}, trained, frozen, bufs, noise, row_extras or {}
        )
        chain = (
            FusedConvStep.applies(loss_fn, self.model, buffers, noise, device)
            if active and self.fused and self.execution == "auto"
            else None
        )
        if chain is not None:  # a small CNN's clients one after another (fused_conv.py)
            mu, corrected = proximal_weight(loss_fn), declares_corrected_cross_entropy(loss_fn)
            fused_conv = FusedConvStep(chain, sgd, train_keys, mu or 0.0, corrected)
            extras = mu is not None or corrected  # the anchors or corrections, by name
            loss_sum += self._train_fused_conv(fused_conv, call, momentum, steps, extras)
            active = []
        if active and self._runs_sequential(loss_fn, sgd, train_keys, call, active[0]):
            loss_sum += self._train_sequential(
                loss_fn, sgd, train_keys, call, momentum, steps, order, generators, rule
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
            draws = [generators[int(order[j])] for j in range(k)] if noise else None
            out, loss = step(*call.batch_args(kw, s, draws))
            if kw > k:
                out, loss = take(out, slice(0, k)), loss[:k]
            loss_sum[:k] += loss.detach()  # first: a rule's loss may be a view of its state
            mine = take(trained, slice(0, k))  # views: updated in place
            apply_step_(mine, out, take(momentum, slice(0, k)), sgd, rule)
        out = {**trained, **frozen}
        mean_loss = loss_sum / steps.clamp(min=1).to(device)
        inv = inverse.to(device)

        def restore(v: Tensor) -> Tensor:
            return v if same else v[inv]

        return TrainResult(
            # (frozen tensors were not copied when not permuted: the result gets its own)
            params={k: out[k].clone() if same and k in frozen else restore(out[k]) for k in params},
            buffers={k: restore(v) for k, v in bufs.items()},
            loss=restore(mean_loss),
            steps=steps[inverse],
        )
