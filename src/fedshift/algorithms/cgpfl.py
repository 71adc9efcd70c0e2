"""CGPFL — Personalized FL with Contextualized Generalization (thesis "Causally Motivated
Collaborative Learning", ch. 3, Algorithm 1; Tang, Guo, Zhao, Qi, ... IJCAI 2022).

Objective (eq. 3.3): min_Θ (1/N) Σ_i R_i(θ_i) + (λ/2)‖θ_i − ω_{k(i)}‖², where the K context
models Ω = [ω_1..ω_K] and the contexts C_K minimise the k-means objective
Σ_k (|C_k|/N)(1/|C_k|) Σ_{j∈C_k} ‖θ_j − ω_k‖². K = 1 is pFedMe's objective.

Per round (Alg. 1): the server sends each client the model of its context (assignment P^t);
the client runs R local iterations of S steps θ ← θ − η∇[R(θ) + (λ/2)‖θ − ω̃‖²] followed by
ω̃ ← ω̃ − βc(ω̃ − θ) (common/moreau.py, as an update rule) and uploads ω̃; the server
clusters the uploads with k-means++ into K contexts (P^{t+1}) and sets
Ω ← Ω − α(Ω − Ω̃P^{t+1}), Ω̃P = per-context mean.
Server state: ``{"ctx": Ω ({"p", "b"} stacked over contexts), "assign": P, "k": contexts
in use, "round"}``; client state: θ_i as ``{"p", "b"}``.

Defaults (§3.8): K = 4, λ = 12, S = 5, R = 10, α = 1, lr = 0.005 (the run's ``lr``, used
as β, the lr of ω̃), N = 40, T = 200 (MNIST/FMNIST). Departures and choices where the
thesis is silent (measurements in docs/methods/personalization.md, "Issue 19"):
* the ω̃ step (a departure, kept by measurement): line 10 and eq. (3.6) write
  ∇_ω G = (2/N)(ω̃ − θ̃), i.e. c = 2/N; we use pFedMe's c = λ (its Alg. 1 line 8 and code,
  on which the thesis builds). With β = the run's lr the literal step is λN/2 = 240× smaller
  (λ = 12, N = 40) and the context models barely leave their initialisation: on the
  pathological split (40 rounds, seed 0, lr 0.05) 47.7 % against 90.9 % with c = λ.
  Table 3.2's caption sets β = 1, under which β·2/N = 0.05 ≈ pFedMe's β·λ = 0.06 at the
  thesis's lr 0.005: the two readings agree in step size only then. ``omega_step =
  "thesis"`` runs line 10 literally (β = the run's lr).
* the lr η of the S steps on θ_i is ``personal_lr`` = 0.09, pFedMe's personal learning
  rate for its MNIST DNN (its README: 0.1 for MLR, 0.09 for the DNN, with R = 20, K = 5;
  its stored results include R = 10, K = 5 at 0.09); the Table 3.1 presets set 0.1 for MLR
  and 0.09 for the DNN, for pFedMe and CGPFL alike. θ_i persists across rounds (Alg. 1 never
  resets it; pFedMe's code restarts it from w each round) and is what client i is
  evaluated with (line 16 returns Θ). Local work is set by R and S (each local iteration
  draws one minibatch of the run's ``batch_size``); the run's ``local_epochs`` is not used,
  so a comparison with FedAvg at ``local_epochs = 1`` gives FedAvg far more local steps
  (pathological split, 40 rounds, seed 0: CGPFL 90.9 at R = 10, 96.1 at R = 40; FedAvg 91.5
  at one epoch, 86.9 at 10 steps). The Table 3.1 presets give every method R = 10
  minibatch steps, as pFedMe's code does.
* k-means numbers clusters arbitrarily; new clusters are matched to the previous context
  models by a Hungarian assignment on centroid distances, so α < 1 mixes the right models.
* Ω̃P averages a context's uploads uniformly (P's columns are 1/|C_k|, §3.5.2); with partial
  participation only the round's participants are clustered, into min(K, participants)
  contexts; contexts with no participant keep their model; absent clients keep their context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..engine.contract import Tree, cross_entropy, flatten, stack, take, tree_map, update_rule
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.clustering import centroids, flatten_rows, kmeans, match_to_previous
from .common.global_model import model_state, split_state
from .common.moreau import moreau_iteration


@dataclass(frozen=True)
class ContextHyper:
    """Hyper-parameters CGPFL and CGPFL-Heur share (thesis §3.8.1 defaults)."""

    lambda_: float = opt(12.0, "regularisation weight λ pulling θ_i towards its context model")
    inner_steps: int = opt(5, "S: steps on θ_i per local iteration (same minibatch)")
    local_iterations: int = opt(10, "R: local iterations (ω̃ updates) per round")
    alpha: float = opt(1.0, "server step α of Ω ← Ω − α(Ω − Ω̃P)")
    personal_lr: float = opt(0.09, "η: lr of the S steps on θ_i (pFedMe's MNIST value)")
    omega_step: str = opt(
        "pfedme",
        "ω̃ ← ω̃ − βc(ω̃ − θ): c = 2/N (thesis line 10) or c = λ (pFedMe's line 8)",
        choices=("thesis", "pfedme"),
    )

    def __post_init__(self) -> None:
        require(self.lambda_ >= 0, f"algorithm.lambda_ must be >= 0, got {self.lambda_}")
        require(self.inner_steps >= 1, "algorithm.inner_steps must be >= 1")
        require(self.local_iterations >= 1, "algorithm.local_iterations must be >= 1")
        require(0 < self.alpha <= 1, f"algorithm.alpha must lie in (0, 1], got {self.alpha}")
        require(self.personal_lr > 0, "algorithm.personal_lr must be positive")


@dataclass(frozen=True)
class CGPFLHyper(ContextHyper):
    K: int = opt(4, "number of context models K (K = 1: pFedMe's objective)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.K >= 1, f"algorithm.K must be >= 1, got {self.K}")


@register_algorithm("cgpfl")
class CGPFL(Algorithm):
    Hyper = CGPFLHyper
    personalized = True

    def max_contexts(self) -> int:
        return self.hp.K

    def init(self) -> Tree:
        model = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        n = self.ctx.data.num_clients
        return {
            "ctx": stack(model, self.max_contexts()),  # Ω, one row per context
            "assign": torch.arange(n) % self.max_contexts(),  # P^0: all Ω^0 are equal
            "k": torch.tensor(self.initial_contexts()),  # contexts in use
            "round": torch.zeros((), dtype=torch.int64),
        }

    def initial_contexts(self) -> int:
        return self.hp.K

    def init_client_state(self, server: Tree) -> Tree:
        return model_state(self.ctx.initial_params, self.ctx.initial_buffers)  # θ_i

    def configure(self, server: Tree, cohort) -> Payload:
        # Alg. 1 line 2: send Ω^t to the clients according to P^t
        ctx_of = server["assign"][cohort.ids.to(server["assign"].device)]
        return Payload(per_client=take(server["ctx"], ctx_of))

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        theta, buffers = split_state(state)
        omega, _ = split_state(payload.per_client)  # line 4: ω̃_{i,0} = ω_{k(i)}
        iterations = self.hp.local_iterations  # lines 5–11: R iterations, one minibatch each
        out = self.ctx.train(
            self.local_step, {"theta": theta, "omega": omega}, buffers, cohort, steps=iterations
        )
        # line 12: upload ω̃_{i,R} (with the context model's buffers)
        upload = model_state(out.params["omega"], split_state(payload.per_client)[1])
        state = model_state(out.params["theta"], out.buffers)
        return ClientResult(upload, state, cohort.num_examples, out.loss)

    @update_rule
    def local_step(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """One local iteration (lines 6–10, ``common.moreau``): new θ_i and ω̃_i; logs the
        mean of F(θ; ω̃) over the S steps."""

        def risk(theta: Tree):
            return cross_entropy(self.ctx.forward(theta, buffers, x), y, w)

        theta, omega, value = moreau_iteration(
            risk,
            params["theta"],
            params["omega"],
            lambda_=self.hp.lambda_,
            inner_steps=self.hp.inner_steps,
            inner_lr=self.hp.personal_lr,
            omega_lr=self.ctx.sgd.lr,
            omega_weight=self.omega_weight(),
        )
        return {"theta": theta, "omega": omega}, value

    def omega_weight(self) -> float:
        """c of ω̃ ← ω̃ − βc(ω̃ − θ): line 10's ∇_ω G = (2/N)∇r, or pFedMe's λ."""
        if self.hp.omega_step == "pfedme":
            return self.hp.lambda_
        return 2.0 / self.ctx.data.num_clients

    def choose_contexts(self, server: Tree, points: np.ndarray, info: RoundInfo) -> int:
        return int(server["k"])

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        points = flatten_rows(split_state(uploads)[0])
        chosen = self.choose_contexts(server, points, info)
        k = min(chosen, len(points))
        seed = self.ctx.seed * 100_003 + info.round
        labels, inertia = kmeans(points, k, seed)  # line 13: k-means++ → P^{t+1}
        k = int(labels.max()) + 1
        previous = flatten_rows(split_state(server["ctx"])[0])
        target = match_to_previous(
            centroids(points, labels, k), previous[: max(k, int(server["k"]))]
        )
        labels_t = torch.as_tensor(target[labels])
        new = {key: tree_map(torch.clone, v) if key == "ctx" else v for key, v in server.items()}
        # flat views of Ω (old and new) and of the uploads: the same tensors, written in place
        old_omega, new_omega = flatten(server["ctx"]), flatten(new["ctx"])
        for c in target.tolist():  # line 14: Ω ← Ω − α(Ω − Ω̃P) for contexts with uploads
            members = (labels_t == c).nonzero().view(-1)
            for key, v in flatten(uploads).items():
                mean = v[members.to(v.device)].double().mean(0).to(v.dtype)
                old = old_omega[key][c]
                upd = old - self.hp.alpha * (old - mean) if v.is_floating_point() else mean
                new_omega[key][c] = upd
        assign = server["assign"].clone()
        assign[info.ids.to(assign.device)] = labels_t.to(assign.device)
        new["assign"] = assign
        new["k"] = torch.tensor(chosen)
        new["round"] = server["round"] + 1
        info.log["contexts"] = k
        info.log["kmeans_cost"] = inertia / len(points)
        return new

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        params, buffers = split_state(state)  # θ_i, the personalized model
        return Prediction(params, buffers, shared=False)
