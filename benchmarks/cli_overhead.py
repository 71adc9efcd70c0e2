"""What the run path adds to training: evaluation, the run store, checkpoints, the progress line.

    python benchmarks/cli_overhead.py [--rounds 5] [--only w1,w2] [--json]

For each workload, the same rounds run three ways in this process, alternating round by
round: ``train`` (``Runner.train_round`` only), ``eval`` (plus the evaluation of every
client each round), and ``cli`` (``fedshift.run`` with a run store, ``eval_every = 1``,
``checkpoint_every = 1`` and the progress line drawn to a throw-away console: what
``fedshift run`` does, at its most frequent settings). Reported: median seconds per round
and each path's share above ``train``. The ``cli`` rounds run after the others, so on a
noisy machine their difference from ``eval`` mixes the machine's drift with the run path's
cost; ``path_s`` measures that cost inside the same rounds instead: each round's time from
one report to the next, less the time its ``train_round`` and ``evaluate`` took (the store
row, the checkpoint, the progress line, the bookkeeping).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import fedshift as fs
from fedshift.engine.runner import Runner
from fedshift.experiment import build_experiment

WORKLOADS = {"w1": ("mlp", 0), "w2": ("fedavg-cnn", 1000)}


def case(model: str, samples: int, rounds: int) -> dict:
    data = fs.scenario(
        "dirichlet",
        dataset="mnist",
        clients=20,
        alpha=0.1,
        proportions="per-class",
        samples=samples,
        seed=0,
    )
    common = dict(algorithm="fedavg", model=model, lr=0.005, batch_size=10, seed=0)
    cfg = fs.make_config(rounds=rounds + 1, participation=1.0, **common)
    train = build_experiment(cfg, data=data).runner
    evals = build_experiment(cfg, data=data).runner
    t_train, t_eval = [], []
    for r in range(rounds + 1):
        t = time.perf_counter()
        train.train_round(r)
        a = time.perf_counter() - t
        t = time.perf_counter()
        evals.train_round(r)
        evals.evaluate(r)
        b = time.perf_counter() - t
        if r:  # round 0 warms up
            t_train.append(a)
            t_eval.append(b)

    from rich.console import Console

    from fedshift.progress import progress_bar

    with tempfile.TemporaryDirectory() as tmp:
        bar, tick = progress_bar(rounds + 1, "overhead", Console(file=io.StringIO(), width=80))
        stamps: list[float] = [time.perf_counter()]

        def on_round(rec) -> None:
            tick(rec)
            stamps.append(time.perf_counter())

        inside: list[float] = []  # per round: train_round + evaluate

        def timed(method):
            def wrapper(self, *args, **kwargs):
                t = time.perf_counter()
                try:
                    return method(self, *args, **kwargs)
                finally:
                    inside.append(time.perf_counter() - t)

            return wrapper

        patched = {name: getattr(Runner, name) for name in ("train_round", "evaluate")}
        for name, method in patched.items():
            setattr(Runner, name, timed(method))
        try:
            fs.run(
                data=data,
                rounds=rounds + 1,
                participation=1.0,
                eval_every=1,
                checkpoint_every=1,
                db=Path(tmp) / "runs.db",
                on_round=on_round,
                progress=False,
                **common,
            )
        finally:
            for name, method in patched.items():
                setattr(Runner, name, method)
        bar.stop()
    # from one round's report to the next: its training, evaluation, store row, checkpoint
    t_cli = [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]
    # two timed calls per round (train_round, evaluate), rounds 1… as t_cli
    own = [a + b for a, b in zip(inside[2::2], inside[3::2], strict=True)]
    t_path = [c - o for c, o in zip(t_cli, own, strict=True)]
    tr, ev, cl = (statistics.median(t) for t in (t_train, t_eval, t_cli))
    path = statistics.median(t_path)
    return {
        "train_s": tr,
        "eval_s": ev,
        "cli_s": cl,
        "eval_share": (ev - tr) / tr,
        "cli_share": (cl - tr) / tr,
        "path_s": path,
        "path_share": path / tr,
        "cli_all_s": [round(t, 4) for t in t_cli],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="w1,w2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = {"threads": torch.get_num_threads()}
    for w in args.only.split(","):
        res[w] = case(*WORKLOADS[w], args.rounds)
    if args.json:
        print(json.dumps(res))
        return
    for w, v in res.items():
        if isinstance(v, dict):
            print(
                f"{w}: train {v['train_s']:.3f} s, +evaluation {v['eval_share']:+.1%}, "
                f"fedshift.run with store/checkpoint/progress {v['cli_share']:+.1%} "
                f"(the run path's own cost, measured inside its rounds: "
                f"{v['path_s'] * 1000:.1f} ms, {v['path_share']:.1%} of training)"
            )


if __name__ == "__main__":
    main()
