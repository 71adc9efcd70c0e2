"""Shared pieces of methods that keep one global model on the server (FedAvg and kin).

Server state: ``{"p": parameters, "b": buffers}`` (the model's own names inside).
"""

from __future__ import annotations

from ...engine.contract import Tree, stack, weighted_mean
from ..base import Algorithm, Payload, Prediction, RoundInfo


def model_state(params: Tree, buffers: Tree) -> Tree:
    return {"p": dict(params), "b": dict(buffers)}


def split_state(state: Tree) -> tuple[Tree, Tree]:
    """(parameters, buffers) of a model state; a model without buffers has no ``b`` after a
    checkpoint (an empty sub-tree has nothing to save)."""
    return dict(state.get("p", {})), dict(state.get("b", {}))


class GlobalModelAlgorithm(Algorithm):
    """Server holds one model; clients receive it, train locally and upload it back;
    the server takes the ``num_examples``-weighted average (McMahan et al., 2017)."""

    def init(self) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)

    def configure(self, server: Tree, cohort) -> Payload:
        return Payload(broadcast=server)

    def start_from_broadcast(self, payload: Payload, n: int) -> tuple[Tree, Tree, Tree]:
        """The received model stacked for ``n`` clients (read-only views: ``ctx.train``
        copies what it trains), and the model itself."""
        params, buffers = split_state(payload.broadcast)
        return stack(params, n, copy=False), stack(buffers, n, copy=False), params

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        return weighted_mean(uploads, info.num_examples)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(server)
        return Prediction(params, buffers, shared=True)
