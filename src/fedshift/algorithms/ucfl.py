"""User-centric FL (UCFL) — Mestoukirdi, Zecchin, Gesbert, Li, "User-Centric Federated
Learning: Trading off Wireless Resources for Personalization", IEEE journal (TMLCN) 2023;
Algorithms 1–2.

Objective: for each user i, min_θ Σ_j w_ij R_j(θ) with collaboration weights (eq. 9)
w_ij ∝ (n_j/n_i)·exp(−Δ_ij / (2σ_i²)), Δ_ij = ‖∇R_i(θ⁰) − ∇R_j(θ⁰)‖², σ_i² the variance of
minibatch gradients of user i at θ⁰ (eq. 10), normalised over j.

Before training (Alg. 1, statistics round) every user computes its full gradient and σ_i² at
θ⁰ (minibatches of ``stat_batch`` samples: the paper's 100 for label shift, or n_i/3); the
server forms W. Streams (§IV-B): k-means on the rows w_i into m_t clusters; a cluster's users
share the model aggregated with the centroid's weights (group broadcast); m_t is chosen by
Alg. 2: argmax_k c(k, s_k), s_k the silhouette score, c(k, s) = s − γ·k/N (γ = ``stream_cost``;
s_1 := 0 by convention, since the silhouette is undefined for one cluster). Each round user k
trains E local epochs from its stream's model and the server sets θ_n ← Σ_j c_nj θ_j (eq. 8).
``parallel`` is the exact variant of eq. (12): every user trains every stream's model.

Communication-time model (§V-D): downlink T_dl per stream (group broadcast), uplink
T_ul = ρ·T_dl (per model uploaded), computing time E[max of m shifted exponentials]
= T_min + H_m/μ. The simulated time of each round is logged (``sim_time``, ``sim_time_total``).

Defaults: LeNet-5, SGD lr 0.1, momentum 0.9, E = 1 (the run's settings); ρ = 4,
T_min = T_dl = 1/μ = 1 (the paper's "slow uplink, unreliable nodes" system).
Choices: with partial participation the centroid weights are renormalised over the round's
participants; σ_i² uses only full minibatches (the partition's remainder is dropped unless it
is the only batch) and is floored at 1e-12; k runs over 2..min(N − 1, ``max_streams``).

Server state: ``{"s": {"p": …, "b": …} (the stream models, stacked [m_t, …]), "centroids",
"stream", "silhouette", "time"}`` and, after the statistics round, ``"W"``. With ``parallel``
a client uploads ``{"0": {"p": …, "b": …}, "1": …}``, one model per stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..engine.contract import Tree, flatten, leaves, stack, take, unflatten
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.clustering import kmeans, silhouette_curve
from .common.global_model import model_state, split_state
from .common.local_stats import step_gradients

UNDEFINED = -2.0  # silhouette slot with no score (scores lie in [-1, 1]); state stays finite


@dataclass(frozen=True)
class UCFLHyper:
    stat_batch: int = opt(100, "n_k: minibatch size for σ_i² of eq. (10) (0 = n_i/3)")
    streams: int = opt(0, "personalized streams m_t (0 = chosen by silhouette, Alg. 2; N = all)")
    stream_cost: float = opt(0.0, "γ of the trade-off c(k, s) = s − γ·k/N of Alg. 2")
    max_streams: int = opt(0, "largest m_t tried by Alg. 2 (0 = N − 1)")
    parallel: bool = opt(False, "exact variant of eq. (12): every user trains every stream")
    rho: float = opt(4.0, "ρ = T_ul / T_dl, uplink/downlink time ratio")
    t_dl: float = opt(1.0, "T_dl: downlink time of one model")
    t_min: float = opt(1.0, "T_min: minimum computing time of a user")
    mean_delay: float = opt(1.0, "1/μ: mean extra computing delay (shifted exponential)")

    def __post_init__(self) -> None:
        require(self.stat_batch >= 0, "algorithm.stat_batch must be >= 0 (0 = n_i/3)")
        require(self.streams >= 0, "algorithm.streams must be >= 0 (0 = silhouette)")
        require(self.stream_cost >= 0, "algorithm.stream_cost must be >= 0")
        require(self.max_streams >= 0, "algorithm.max_streams must be >= 0 (0 = N − 1)")
        for name in ("rho", "t_dl", "t_min", "mean_delay"):
            require(getattr(self, name) >= 0, f"algorithm.{name} must be >= 0")


def collaboration_weights(grads: Tensor, sigma2: Tensor, sizes: Tensor) -> Tensor:
    """W of eq. (9): W[i, j] ∝ (n_j/n_i)·exp(−‖g_i − g_j‖² / (2σ_i²)), rows sum to 1."""
    g = grads.double()
    delta = ((g[:, None, :] - g[None, :, :]) ** 2).sum(-1)
    logits = (
        torch.log(sizes.to(g.device, torch.float64))[None, :]
        - delta / (2 * sigma2.double().clamp(min=1e-12))[:, None]
    )
    return torch.softmax(logits, dim=1)  # n_i cancels in the normalisation


def simulated_round_time(streams: int, uploads: int, users: int, hp: UCFLHyper) -> float:
    """Downlink (one broadcast per stream) + uplink + E[max of ``users`` computing times]."""
    harmonic = sum(1.0 / k for k in range(1, users + 1))
    return streams * hp.t_dl + uploads * hp.rho * hp.t_dl + hp.t_min + harmonic * hp.mean_delay


@register_algorithm("ucfl")
class UCFL(Algorithm):
    Hyper = UCFLHyper
    personalized = True

    def init(self) -> Tree:
        n = self.ctx.data.num_clients
        sizes = self.ctx.data.train.sizes().double()
        model = model_state(self.ctx.initial_params, self.ctx.initial_buffers)
        return {  # one FedAvg-like stream until the statistics round has run
            "s": stack(model, 1),
            "centroids": (sizes / sizes.sum().clamp(min=1)).view(1, n),
            "stream": torch.zeros(n, dtype=torch.int64),
            "silhouette": torch.full((n + 1,), UNDEFINED, dtype=torch.float64),
            "time": torch.zeros((), dtype=torch.float64),
        }

    # ---- Alg. 1 lines 1–6: the statistics round at θ⁰ --------------------------------
    def gradient_statistics(self) -> tuple[Tensor, Tensor]:
        """Full gradient g_i [N, d] and σ_i² [N] (eq. 10) of every user at θ⁰: one pass over
        a random partition of each user's data into minibatches of ``stat_batch`` (0: a
        third of the user's data), cohort by cohort (the run's ``cohort_size``)."""
        ctx, data = self.ctx, self.ctx.data.train
        params, buffers = ctx.initial_params, ctx.initial_buffers

        def batch_sum(p, b, x, y, w):  # Σ_x w·ℓ(x), differentiated per user
            return (F.cross_entropy(ctx.forward(p, b, x), y, reduction="none") * w).sum()

        grads, sigma2 = [], []
        ctx.model.train()  # batch-norm statistics of each minibatch, from θ⁰'s every time
        sizes = data.sizes()
        for cohort in ctx.cohorts(torch.arange(ctx.data.num_clients), 0):
            ns = sizes[cohort.ids].tolist()
            batch = [self.hp.stat_batch or max(1, math.ceil(n / 3)) for n in ns]
            sched = ctx.schedule(cohort, "ucfl-stats", epochs=1, batch_size=batch)
            g = step_gradients(ctx, batch_sum, params, buffers, sched)
            c, k_max = len(cohort), sched.max_steps
            sums_t = torch.cat([v.reshape(c, k_max, -1) for v in g.values()], 2).double()
            counts = sched.weight.to(data.x.device).sum(-1).double()  # [c, K]
            n_i = counts.sum(1).clamp(min=1)
            full = sums_t.sum(1) / n_i[:, None]
            means = sums_t / counts.clamp(min=1)[..., None]
            dev = ((means - full[:, None, :]) ** 2).sum(-1)  # [c, K]
            use = counts == torch.tensor(batch, dtype=torch.float64, device=counts.device)[:, None]
            use = torch.where(use.any(1, keepdim=True), use, counts > 0)  # full minibatches only
            sigma2.append((dev * use).sum(1) / use.sum(1).clamp(min=1))
            grads.append(full)
        return torch.cat(grads), torch.cat(sigma2)

    def before_training(self, server: Tree) -> Tree:
        grads, sigma2 = self.gradient_statistics()
        n = self.ctx.data.num_clients
        w = collaboration_weights(grads, sigma2, self.ctx.data.train.sizes())  # eq. (9)
        points = w.cpu().numpy()
        silhouette = torch.full((n + 1,), UNDEFINED, dtype=torch.float64)
        chosen = self.choose_streams(points, silhouette)  # Alg. 2 (its curve is always logged)
        if self.hp.streams >= n:
            m, labels, cents = n, np.arange(n), w  # full personalization: one stream per user
        else:
            m = self.hp.streams or chosen
            labels, _ = kmeans(points, m, self.ctx.seed)
            m = int(labels.max()) + 1
            cents = torch.stack([w[torch.as_tensor(labels == c)].mean(0) for c in range(m)])
        model = take(server["s"], 0)
        return {
            "s": stack(model, m),
            "centroids": cents.to(torch.float64),
            "stream": torch.as_tensor(labels, dtype=torch.int64),
            "silhouette": silhouette,
            "time": server["time"],
            "W": w,
        }

    def choose_streams(self, points: np.ndarray, silhouette: Tensor) -> int:
        n = len(points)
        if n < 3:
            return 1
        top = min(n - 1, self.hp.max_streams or n - 1)
        scores = silhouette_curve(points, list(range(2, top + 1)), self.ctx.seed)
        utility = {1: 0.0 - self.hp.stream_cost / n}  # s_1 := 0
        for k, s in scores.items():
            silhouette[k] = s
            utility[k] = s - self.hp.stream_cost * k / n
        return max(utility, key=lambda k: (utility[k], -k))

    # ---- Alg. 1 lines 7–12: rounds -----------------------------------------------------
    def configure(self, server: Tree, cohort) -> Payload:
        models = server["s"]
        if self.hp.parallel:  # every user receives every stream
            return Payload(broadcast=models)
        own = server["stream"][cohort.ids.to(server["stream"].device)]
        return Payload(per_client=take(models, own))

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        if not self.hp.parallel:
            params, buffers = split_state(payload.per_client)
            out = self.ctx.train(self.loss, params, buffers, cohort)
            return ClientResult(
                model_state(out.params, out.buffers), {}, cohort.num_examples, out.loss
            )
        upload, losses = {}, []
        m = next(leaves(payload.broadcast)).shape[0]
        for s in range(m):  # eq. (12): user j also trains the other streams' models
            params, buffers = split_state(take(payload.broadcast, s))
            out = self.ctx.train(
                self.loss,
                stack(params, len(cohort), copy=False),  # views: train copies
                stack(buffers, len(cohort), copy=False),
                cohort,
                f"train/{s}",
            )
            upload[str(s)] = model_state(out.params, out.buffers)
            losses.append(out.loss)
        return ClientResult(upload, {}, cohort.num_examples, torch.stack(losses).mean(0))

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        ids = info.ids.to(server["centroids"].device)
        c = server["centroids"][:, ids]  # eq. (8): θ_n ← Σ_j c_nj θ_j over participants
        total = c.sum(1, keepdim=True)
        c = torch.where(total > 0, c / total.clamp(min=1e-300), c)
        m = c.shape[0]
        new = dict(server)
        streams = flatten(server["s"])  # "p/<name>" → [m, …]
        received = flatten(uploads)  # "p/<name>", or "<stream>/p/<name>" with ``parallel``
        for key, old in list(streams.items()):
            if not old.is_floating_point():
                continue
            if self.hp.parallel:
                mixed = torch.stack(
                    [
                        torch.einsum("p,p...->...", c[s].to(old.dtype), received[f"{s}/{key}"])
                        for s in range(m)
                    ]
                )
            else:
                mixed = torch.einsum("mp,p...->m...", c.to(old.dtype), received[key])
            keep = (total.view(-1) > 0).view(-1, *([1] * (old.dim() - 1)))
            streams[key] = torch.where(keep, mixed, old)
        new["s"] = unflatten(streams)
        dt = simulated_round_time(m, m if self.hp.parallel else 1, len(info.ids), self.hp)
        new["time"] = server["time"] + dt
        info.log["streams"] = m
        info.log["sim_time"] = dt
        info.log["sim_time_total"] = float(new["time"])
        if info.round == 0:
            s = server["silhouette"]
            info.log["silhouette"] = [None if v == UNDEFINED else v for v in s[2:-1].tolist()]
        return new

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        own = server["stream"][cohort.ids.to(server["stream"].device)]
        params, buffers = split_state(take(server["s"], own))
        return Prediction(params, buffers, shared=False)
