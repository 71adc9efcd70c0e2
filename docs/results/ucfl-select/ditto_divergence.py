"""Why Ditto's personal models diverge at λ >= 0.5 with LeNet-5, lr 0.1, momentum 0.9.

Runs `ucfl-label-shift`'s Ditto row at the selection's reduced scale (10,000 MNIST images,
20 clients, seed 100) round by round and prints, after each round, the distance of every
personal model v_k from the global model w, and the sharpness of each client's own loss at
v_k (the largest Hessian eigenvalue of its cross-entropy, by power iteration on
Hessian-vector products), against heavy-ball SGD's stability limit 2(1 + β)/η.

    python docs/results/ucfl-select/ditto_divergence.py --lambda 1 --rounds 12
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from fedshift.algorithms.perfedavg import hvp
from fedshift.engine.tree import take
from fedshift.errors import Diverged
from fedshift.experiment import build_experiment
from fedshift.tables import find_method, load_table, method_config


def sharpness(ctx, params: dict, buffers: dict, x, y, iters: int) -> float:
    """Top eigenvalue of the Hessian of the mean cross-entropy at ``params`` (power iteration)."""

    def loss(p: dict):
        return F.cross_entropy(ctx.forward(p, buffers, x), y)

    gen = torch.Generator().manual_seed(0)  # the same start vector on every call and run
    u = {k: torch.randn(t.shape, generator=gen, dtype=t.dtype) for k, t in params.items()}
    value = 0.0
    for _ in range(iters):
        norm = torch.sqrt(sum((t**2).sum() for t in u.values()))
        u = {k: t / norm for k, t in u.items()}
        hu = hvp(loss, params, u)
        value = sum((hu[k] * u[k]).sum() for k in u).item()
        u = hu
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lambda", dest="lam", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--iters", type=int, default=20, help="power-iteration steps")
    ap.add_argument("--data-dir", default="../shared/datasets")
    a = ap.parse_args()
    table = load_table("ucfl-label-shift")
    overrides = {"scenario.samples": 10000, "threads": 1, "rounds": a.rounds, "seed": 100}
    overrides |= {"algorithm.lambda_": a.lam, "lr": a.lr, "momentum": a.momentum}
    cfg = method_config(table, find_method(table, "Ditto"), overrides)
    cfg.data_dir = a.data_dir
    ex = build_experiment(cfg)
    limit = 2 * (1 + a.momentum) / a.lr
    n = ex.data.num_clients
    print(f"Ditto λ = {a.lam}, lr {a.lr}, momentum {a.momentum}: limit 2(1+β)/η = {limit:.0f}")
    print("round  loss   |v_k - w| median / max (client)   sharpness max (client), above limit")
    for r in range(a.rounds):
        try:
            rec = ex.runner.train_round(r)
        except Diverged as e:
            print(f"{r + 1:5d}  diverged: {e}")
            return
        w = torch.cat([t.flatten() for _, t in sorted(ex.runner.server["p"].items())])
        state = ex.runner.store.take(torch.arange(n), torch.device("cpu"))
        v = torch.cat([t.flatten(1) for _, t in sorted(state["p"].items())], 1)
        dist = (v - w).norm(dim=1)
        sharp = []
        for c in range(n):
            x, y = ex.data.train.client(c)
            p, b = take(state["p"], c), take(state.get("b", {}), c)
            sharp.append(sharpness(ex.ctx, p, b, x, y, a.iters))
        s = torch.tensor(sharp)
        print(
            f"{r + 1:5d}  {rec.loss:.3f}  {dist.median():6.1f} / {dist.max():7.1f}"
            f" ({dist.argmax():2d})"
            f"        {s.max():7.1f} ({s.argmax():2d}), {(s > limit).sum().item()}",
            flush=True,
        )


if __name__ == "__main__":
    main()
