"""Fine-tuning at evaluation (FTFA; IRM†-FT): every client starts from the global model and
runs ``epochs`` epochs of local SGD on its own training data (purpose "finetune", seeded by
run seed, round and client); it is evaluated with the result, which is not kept."""

from __future__ import annotations

from dataclasses import replace

from ...engine.contract import Cohort, LossFn, Tree, stack
from ..base import Algorithm, Prediction
from .global_model import split_state


def finetuned_prediction(
    alg: Algorithm, server: Tree, cohort: Cohort, loss: LossFn, epochs: int, lr: float
) -> Prediction:
    """The global model of ``server`` fine-tuned on each client; ``epochs = 0`` → global
    model itself; ``lr = 0`` → the run's learning rate. ``loss`` receives the global
    model's parameters as extras."""
    params, buffers = split_state(server)
    if epochs == 0:
        return Prediction(params, buffers, shared=True)
    ctx = alg.ctx
    sgd = replace(ctx.sgd, lr=lr) if lr > 0 else ctx.sgd
    n = len(cohort)
    out = ctx.train(
        loss,
        stack(params, n, copy=False),  # views: train copies what it trains
        stack(buffers, n, copy=False),
        cohort,
        "finetune",
        epochs=epochs,
        sgd=sgd,
        shared=params,
    )
    return Prediction(out.params, out.buffers, shared=False)
