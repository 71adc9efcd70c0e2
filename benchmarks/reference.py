"""Sequential references for the speed benchmarks: how most FL simulators run a round.

Two of them, both one client at a time in a Python loop, with one ``nn.Module`` per client,
autograd and the standard ``torch.optim.SGD``, and minibatches served by a
``torch.utils.data.DataLoader`` (per-sample ``__getitem__`` + default collate):

* :func:`classic_fedavg_round` — a self-contained FedAvg round (W1, W2): copy the global
  module for each client, shuffle its data with a seeded ``DataLoader``, train, average the
  state dicts with weights ``n_i``. It shares no code with fedshift's engine.
* :func:`pfllib_evaluate` — the evaluation PFLlib's server runs every round (``eval_gap =
  1``): each client's test accuracy and its training loss, client by client, through
  ``DataLoader`` batches of the training batch size (``clientbase.test_metrics`` and
  ``train_metrics``). With :func:`classic_fedavg_round` it is the round a user of a
  per-client-loop library pays for (W2-cli).
* :class:`SequentialTrainer` — a drop-in for fedshift's ``LocalTrainer`` (W3): any
  algorithm's own per-client loss function is run client by client with autograd on that
  client's module, so methods with several objectives (FedPIN, Ditto) are measured against
  a sequential run of exactly the same mathematics, with the same minibatch order.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedshift.data.federated import FederatedData, Split
from fedshift.engine.local import LocalTrainer, TrainResult
from fedshift.engine.rng import torch_seed
from fedshift.engine.rule import is_batched_rule, is_update_rule, update_rule


def classic_fedavg_round(
    global_model: nn.Module,
    data: FederatedData,
    ids: list[int],
    *,
    lr: float,
    batch_size: int,
    epochs: int,
    seed: int,
    round_: int,
) -> float:
    """One FedAvg round, client after client; updates ``global_model`` in place and returns
    the sample-weighted mean training loss."""
    states, weights, losses = [], [], []
    for cid in ids:
        model = copy.deepcopy(global_model)  # the client's own module
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        x, y = data.train.client(cid)
        gen = torch.Generator().manual_seed(torch_seed(seed, round_, cid, "reference"))
        loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=gen)
        total, count = 0.0, 0
        for _ in range(epochs):
            for xb, yb in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
                total, count = total + loss.item(), count + 1
        states.append(model.state_dict())
        weights.append(float(len(y)))
        losses.append(total / max(count, 1))
    tot = sum(weights)
    avg = {}
    for k, first in states[0].items():
        mix = sum(w / tot * s[k].double() for w, s in zip(weights, states, strict=True))
        avg[k] = mix.to(first.dtype)
    global_model.load_state_dict(avg)
    return sum(w / tot * loss for w, loss in zip(weights, losses, strict=True))


@torch.no_grad()
def pfllib_evaluate(model: nn.Module, data: FederatedData, ids: list[int], batch_size: int):
    """Test accuracy (percent, Σ correct / Σ samples) and training loss (per sample) of the
    global model over every client, one client and one ``DataLoader`` at a time."""
    model.eval()
    correct = seen = 0
    loss_sum = loss_n = 0.0
    for cid in ids:
        for split, is_test in ((next(iter(data.test.values())), True), (data.train, False)):
            x, y = split.client(cid)
            for xb, yb in DataLoader(TensorDataset(x, y), batch_size=batch_size):
                out = model(xb)
                if is_test:
                    correct += int((out.argmax(1) == yb).sum())
                    seen += len(yb)
                else:
                    loss_sum += float(F.cross_entropy(out, yb, reduction="sum"))
                    loss_n += len(yb)
    model.train()
    return 100.0 * correct / max(seen, 1), loss_sum / max(loss_n, 1)


class _Rows(TensorDataset):
    """The training split as a dataset of (x, y, env, *row extras) rows."""

    def __init__(self, split: Split, row_extras: dict | None = None) -> None:
        env = split.env if split.env is not None else torch.zeros_like(split.y)
        super().__init__(split.x, split.y, env, *(row_extras or {}).values())


class SequentialTrainer(LocalTrainer):
    """``LocalTrainer`` interface, sequential execution: for each client of the cohort, a
    fresh copy of the model holding that client's parameters, ``torch.optim.SGD`` over its
    trainable ones, and a ``DataLoader`` whose batch sampler replays the client's minibatch
    order from fedshift's schedule (so both executions see the same batches)."""

    def train(
        self,
        loss_fn,
        params,
        buffers,
        split,
        schedule,
        sgd,
        shared=None,
        per_client=None,
        trainable=None,
        noise=None,
        generators=None,
        row_extras=None,
    ) -> TrainResult:
        n = int(schedule.steps.numel())
        rule = is_update_rule(loss_fn)
        if is_batched_rule(loss_fn):
            raise ValueError(
                "the reference runs each client's own step: give it a per-client library's "
                "step for a rule written for the whole cohort (as reference_runner does for "
                "pFedMe's)"
            )
        dataset = _Rows(split, row_extras)
        row_names = list(row_extras or {})
        out_p = {k: v.detach().clone() for k, v in params.items()}
        out_b = {k: v.detach().clone() for k, v in buffers.items()}
        losses = torch.zeros(n)
        for i in range(n):
            model = copy.deepcopy(self.model)  # one module per client
            mine = dict(model.named_parameters())
            with torch.no_grad():
                for k, v in params.items():  # extra trained tensors (e.g. FedPIN's ω_a) too
                    if k not in mine:
                        mine[k] = torch.nn.Parameter(v[i].clone())
                    mine[k].copy_(v[i])
                    mine[k].requires_grad_(trainable is None or trainable(k))
            mine = {k: mine[k] for k in params}
            opt = torch.optim.SGD(
                [p for p in mine.values() if p.requires_grad],
                lr=sgd.lr,
                momentum=sgd.momentum,
                weight_decay=sgd.weight_decay,
            )
            bufs = {k: v[i].clone() for k, v in buffers.items()}
            steps = int(schedule.steps[i])
            batches = [
                schedule.index[i, s][schedule.weight[i, s] > 0].tolist() for s in range(steps)
            ]
            loader = DataLoader(dataset, batch_sampler=batches)
            extras_c = {**(shared or {}), **{k: v[i] for k, v in (per_client or {}).items()}}
            total = 0.0
            for xb, yb, eb, *rows in loader:
                extras = dict(extras_c)
                if split.env is not None:
                    extras["env"] = eb
                extras.update(zip(row_names, rows, strict=True))
                for name, shape in (noise or {}).items():
                    extras[name] = torch.randn(shape, generator=generators[i]).to(yb.device)
                if rule:  # the method's own update (pFedMe, CGPFL, PerInvFL): no optimiser
                    new, loss = loss_fn(
                        mine, bufs, extras, xb, yb, torch.ones(len(yb), device=yb.device)
                    )
                    with torch.no_grad():
                        for k, v in new.items():
                            if mine[k].requires_grad:
                                mine[k].copy_(v)
                    total += loss.item()
                    continue
                opt.zero_grad()
                loss = loss_fn(mine, bufs, extras, xb, yb, torch.ones(len(yb), device=yb.device))
                loss.backward()
                opt.step()
                total += loss.item()
            for k, p in mine.items():
                out_p[k][i] = p.detach()
            for k, b in bufs.items():
                out_b[k][i] = b
            losses[i] = total / max(steps, 1)
        return TrainResult(out_p, out_b, losses, schedule.steps.clone())


def pfllib_pfedme_step(algorithm, model: nn.Module):
    """pFedMe's step on one minibatch as PFLlib's ``clientpFedMe.train`` takes it, for the
    reference's pFedMe: K times a forward of the module, ``loss.backward()`` and the
    ``pFedMeOptimizer`` step θ ← θ − lr·(∇f(θ) + λ(θ − w_i)), then w_i ← w_i − ηλ(w_i − θ̃).
    Two departures, both to fedshift's rule and both making the reference no slower than
    PFLlib: PFLlib's optimiser also adds μ·θ (μ = 0.001 by default), which pFedMe's box
    has not, and steps out of place (``p.data = p.data − …``), where this one updates in
    place. It logs the last inner step's risk (fedshift's rule logs f(θ̃), one more
    forward: PFLlib takes none). An update rule for one client (``update_rule``); set as
    the reference algorithm's ``cohort_step``, it replaces the cohort rule whose written
    gradient no per-client library has."""
    hp, lam, eta = algorithm.hp, algorithm.prox_weight(), algorithm.ctx.sgd.lr
    named = dict(model.named_parameters())

    def step(params, buffers, extras, x, y, w):
        local = {k: params[k].detach() for k in named}
        with torch.no_grad():
            for k, p in named.items():
                p.copy_(params["pm"][k])
        risk = torch.zeros(())
        for _ in range(hp.inner_steps):
            model.zero_grad()
            risk = F.cross_entropy(model(x), y)
            risk.backward()
            with torch.no_grad():
                for k, p in named.items():
                    p.sub_(hp.personal_lr * (p.grad + lam * (p - local[k])))
        with torch.no_grad():
            solved = {k: p.detach().clone() for k, p in named.items()}
            moved = {k: v - eta * lam * (v - solved[k]) for k, v in local.items()}
        return {**moved, "pm": solved}, risk.detach()

    return update_rule(step)
