"""Per-FedAvg (HF) — Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020.

Objective (eq. 3): min_w (1/n) Σ_i F_i(w), F_i(w) = f_i(w − α ∇f_i(w)) — a global model that
does well after one local gradient step of size α. Algorithm 1, Hessian-free variant: each
local step draws three independent minibatches D, D', D'' and sets
w̃ = w − α ∇f_i(w; D), w ← w − β (∇f_i(w̃; D') − α d), d ≈ ∇²f_i(w; D'') ∇f_i(w̃; D').
The engine differentiates a surrogate whose value is f_i(w̃; D') and whose gradient is that
update direction. Server: FedAvg's average. Evaluation: each client takes one SGD step of
size α from the global model on a minibatch of its training data (purpose "adapt").

Defaults and choices: α = 0.05, δ = 0.001; β is the run's ``lr``. α sets how far the
evaluated model moves from the global one: at the former default α = 0.001 (with β = the
run's lr, 0.05 by default) one step changed a client's training loss by 0.1 % and the
"personalized" model was FedAvg's. The paper's text is not in papers/ and was not
consulted here, so α is not claimed to be the paper's. What was checked: the reference
code that Table 3.1 of the thesis builds on (pFedMe's repository) runs Per-FedAvg on MNIST
with α = 0.005 (its ``learning_rate``, the inner step) and β = 0.001 (its ``beta``),
α/β = 5 (its fine-tuned runs: α 0.01–0.03, β 0.001–0.003); ours had α/β = 0.02. α = 0.05
(α/β = 1 at the default lr) was chosen by validation accuracy among {0.001, 0.01, 0.05} on
the pathological split (40 rounds, seed 0, lr 0.05): val 89.2 / 90.0 / 91.5, test 89.5 /
90.8 / 91.6, worst client 82.0 / 84.8 / 61.2 (docs/methods/personalization.md). With another
run lr, scale α with it. Tested: one adaptation step at the default lowers the toy
clients' training loss by more than 2 % (tests/algorithms/test_perfedavg.py).
d is the exact Hessian-vector product (forward-over-reverse ``torch.func.jvp`` of the
gradient: no Hessian is formed) by default, or the paper's
finite difference [∇f(w + δg; D'') − ∇f(w − δg; D'')] / 2δ with ``hessian = "difference"``.
One local step reads one minibatch of 3·batch_size samples, split into D, D', D'' (each
``batch_size``); ``local_epochs`` counts passes over the data in such triples.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.func import grad, jvp

from ..engine.contract import SGDConfig, Tree, single_threaded, stack
from ..options import opt, require
from .base import ClientResult, Payload, Prediction, register_algorithm
from .common.global_model import GlobalModelAlgorithm, model_state, split_state
from .common.losses import cross_entropy


@dataclass(frozen=True)
class PerFedAvgHyper:
    alpha: float = opt(0.05, "step size α of the one-step personalisation (α = 0 → FedAvg's model)")
    hessian: str = opt("exact", "Hessian-vector product", choices=("exact", "difference"))
    delta: float = opt(0.001, "finite-difference width δ (hessian = difference)")

    def __post_init__(self) -> None:
        require(self.alpha >= 0, f"algorithm.alpha must be >= 0, got {self.alpha}")
        require(self.delta > 0, f"algorithm.delta must be > 0, got {self.delta}")


def hvp(f, params: Tree, vector: Tree) -> Tree:
    """∇²f(params)·vector by forward-over-reverse differentiation (no Hessian is formed)."""
    return jvp(grad(f), (params,), (vector,))[1]


def axpy(a: float, x: Tree, y: Tree) -> Tree:
    """y + a·x over the keys of ``y``."""
    return {k: y[k] + a * x[k] for k in y}


@register_algorithm("perfedavg")
class PerFedAvg(GlobalModelAlgorithm):
    Hyper = PerFedAvgHyper
    personalized = True

    def risk(self, params: Tree, buffers: Tree, x, y, w):
        return cross_entropy(self.ctx.forward(params, buffers, x), y, w)

    @single_threaded  # the exact Hessian-vector product is forward-mode AD
    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        b = x.shape[0] // 3
        parts = [slice(0, b), slice(b, 2 * b), slice(2 * b, None)]  # D, D', D''
        d1, d2, d3 = [(x[s], y[s], w[s]) for s in parts]
        w0 = {k: v.detach() for k, v in params.items()}
        a = self.hp.alpha

        def f(data):  # BatchNorm statistics of these inner passes are not kept
            return lambda p: self.risk(p, {k: v.clone() for k, v in buffers.items()}, *data)

        tilde = axpy(-a, grad(f(d1))(w0), w0)  # w̃ = w − α∇f(w; D)
        g = grad(f(d2))(tilde)  # ∇f(w̃; D')
        if self.hp.hessian == "exact":
            hg = hvp(f(d3), w0, g)
        else:
            dt = self.hp.delta
            plus, minus = grad(f(d3))(axpy(dt, g, w0)), grad(f(d3))(axpy(-dt, g, w0))
            hg = {k: (plus[k] - minus[k]) / (2 * dt) for k in w0}
        direction = axpy(-a, hg, g)  # (I − α∇²f(w; D'')) ∇f(w̃; D')
        value = self.risk(tilde, buffers, *d2).detach()  # updates running statistics
        linear = sum((params[k] * direction[k].detach()).sum() for k in params)
        return value + linear - linear.detach()  # value f(w̃; D'), gradient = direction

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        params, buffers, _ = self.start_from_broadcast(payload, len(cohort))
        out = self.ctx.train(self.loss, params, buffers, cohort, batch_size=3 * self.ctx.batch_size)
        upload = model_state(out.params, out.buffers)
        return ClientResult(upload, {}, cohort.num_examples, out.loss)

    def adapt_loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        return self.risk(params, buffers, x, y, w)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(server)
        if self.hp.alpha == 0:
            return Prediction(params, buffers, shared=True)
        n = len(cohort)
        sgd = SGDConfig(self.hp.alpha)
        out = self.ctx.train(
            self.adapt_loss,
            stack(params, n, copy=False),  # views: train copies
            stack(buffers, n, copy=False),
            cohort,
            "adapt",
            steps=1,
            sgd=sgd,
        )
        return Prediction(out.params, out.buffers, shared=False)
