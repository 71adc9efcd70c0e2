"""Seconds per round of FedAvg (MLP 784-100-10, MNIST, 20 clients, Dirichlet α = 0.1,
batch 10, 1 local epoch) with cohort size 1 (the sequential case) against one batched
cohort of all clients, measured in the same process on the same data.

    python benchmarks/engine_speed.py [--rounds 3] [--data-dir ../shared/datasets] [--compile]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import fedshift as fs
from fedshift.experiment import build_experiment


def seconds_per_round(data, cohort_size: int, rounds: int, compile_: bool) -> float:
    cfg = fs.make_config(
        algorithm="fedavg",
        model="mlp",
        model_options={"hidden": [100]},
        lr=0.05,
        batch_size=10,
        local_epochs=1,
        rounds=rounds,
        cohort_size=cohort_size,
        compile=compile_,
    )
    runner = build_experiment(cfg, data=data).runner
    runner.train_round(0)  # warm-up (and compilation, when enabled)
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        runner.train_round(r)
    return (time.perf_counter() - t0) / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    data = fs.scenario(
        "dirichlet",
        dataset="mnist",
        clients=20,
        alpha=0.1,
        proportions="per-class",
        samples=0,
        data_dir=args.data_dir,
    )
    sizes = data.train.sizes()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; client sizes "
        f"{int(sizes.min())}..{int(sizes.max())} (total {int(sizes.sum())})"
    )
    seq = seconds_per_round(data, 1, args.rounds, args.compile)
    bat = seconds_per_round(data, 0, args.rounds, args.compile)
    result = {
        "benchmark": "fedavg-mlp-mnist-dirichlet0.1-20clients",
        "compile": args.compile,
        "seconds_per_round_cohort_1": round(seq, 3),
        "seconds_per_round_cohort_all": round(bat, 3),
        "speedup": round(seq / bat, 2),
    }
    print(f"cohort size 1:   {seq:.3f} s/round")
    print(f"cohort size all: {bat:.3f} s/round  (speed-up ×{seq / bat:.2f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
