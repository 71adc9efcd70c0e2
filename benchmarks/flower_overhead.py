"""Seconds per round of the same workload in-process, on Flower's simulation engine and
deployed on 127.0.0.1 (a SuperLink and one SuperNode per client as subprocesses), and where
a Flower round's time goes on the nodes.

Workload: FedAvg on digits-shortcut (3 clients, its default model, batch 10, 1 local epoch),
evaluation only after the last round. A round's time is the server's wall time from
sampling to aggregation (the RoundRecord's ``time_s``, same definition for all three); the
first round is reported apart (warm-up: Ray workers or ClientApp processes, JIT caches).
Node-side parts per round (from the ClientApp's timings; the simulation's one Ray worker
runs the 3 clients one after another, so there they are summed over clients, while the
deployment's SuperNodes run in parallel and the per-client mean is shown): ``startup`` = process
start to handler (a fresh ``flwr-clientapp`` process per message in deployment),
``build`` = scenario + model + algorithm (cached in simulation workers), ``update`` =
the algorithm's client work; ``other`` = the rest (messages, serialisation, polling).

    python benchmarks/flower_overhead.py [--rounds 4] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import fedshift as fs
from fedshift.config import resolve


def config(rounds: int):
    return resolve(
        None,
        {
            "algorithm": "fedavg",
            "scenario": "digits-shortcut",
            "scenario.clients": "3",
            "rounds": str(rounds),
            "eval_every": str(rounds),
            "seed": "0",
        },
    )


def per_round(times: list[float], parts: list[dict] | None = None, serial: int = 1) -> dict:
    """``parts`` are per-client means; ``serial`` clients run one after another on a worker
    (the simulation's single Ray worker: 3; the deployment's parallel SuperNodes: 1)."""
    later = times[1:] or times
    out = {
        "first_round_s": round(times[0], 3),
        "s_per_round": round(sum(later) / len(later), 3),
        "rounds": [round(t, 3) for t in times],
    }
    if parts:
        later_parts = parts[1:] or parts
        mean = {k: sum(p.get(k, 0.0) for p in later_parts) / len(later_parts) for k in parts[0]}
        mean = {k: round(v * serial, 3) for k, v in mean.items()}
        mean["other_s"] = round(max(out["s_per_round"] - sum(mean.values()), 0.0), 3)
        out["parts"] = mean
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="fsbench", dir="/tmp")
    os.environ.update(
        FLWR_HOME=os.path.join(folder, "home"),
        RAY_TMPDIR=os.path.join(folder, "ray"),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
    )
    from fedshift.flower.local import LocalFederation
    from fedshift.flower.run import deploy, simulate

    results: dict = {}
    try:
        t0 = time.perf_counter()
        ref = fs.run(config(args.rounds))
        results["in-process"] = per_round([r.time_s for r in ref.result.rounds])
        results["in-process"]["total_s"] = round(time.perf_counter() - t0, 2)

        t0 = time.perf_counter()
        (sim,) = simulate([config(args.rounds)], actors=1)
        results["simulation"] = per_round(
            [r.time_s for r in sim.result.rounds],
            [r.extras["flower"] for r in sim.result.rounds],
            serial=3,
        )
        results["simulation"]["total_s"] = round(time.perf_counter() - t0, 2)

        rounds: list[dict] = []

        def line(text: str) -> None:
            if "fedshift-round " in text:
                rounds.append(json.loads(text.split("fedshift-round ", 1)[1]))

        t0 = time.perf_counter()
        with LocalFederation(3, Path(folder) / "fed") as fed:
            t_up = time.perf_counter() - t0
            (dep,) = deploy([config(args.rounds)], address=fed.address, insecure=True,
                            on_line=line, timeout=1200)  # fmt: skip
        results["deployment"] = per_round(
            [r["time_s"] for r in rounds], [r["flower"] for r in rounds]
        )
        results["deployment"]["total_s"] = round(time.perf_counter() - t0, 2)
        results["deployment"]["federation_start_s"] = round(t_up, 2)
        same = (
            dep["metrics"]["per_client"] == sim.metrics["per_client"] == ref.metrics["per_client"]
        )
        results["same_metrics"] = same
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flower_overhead.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "flower_overhead.png")
    print(json.dumps(results))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = ["in-process", "simulation", "deployment"]
    parts = ["update_s", "build_s", "startup_s", "other_s"]
    labels = {
        "update_s": "client update (incl. torch warm-up in a fresh process)",
        "build_s": "build scenario/model on node",
        "startup_s": "ClientApp process start + imports",
        "other_s": "messaging, serialisation, polling",
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(engines)
    for part in parts:
        vals = []
        for e in engines:
            r = results[e]
            vals.append(
                r["parts"][part]
                if "parts" in r
                else (r["s_per_round"] if part == "update_s" else 0.0)
            )
        ax.bar(engines, vals, bottom=bottom, label=labels[part])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, e in enumerate(engines):
        ax.text(i, bottom[i], f"{results[e]['s_per_round']:.2f} s", ha="center", va="bottom")
    ax.set_ylabel("seconds per round (rounds 2…R)")
    ax.set_title("FedAvg, digits-shortcut, 3 clients: in-process vs Flower")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
