"""Round times on a quiet machine and beside one competing CPU-bound process.

    python benchmarks/busy_machine.py [--rounds 6] [--json]

Each case runs in a fresh process (the OpenMP wait policy is read when torch loads):
``fedshift`` imports fedshift first, so its default ``OMP_WAIT_POLICY=PASSIVE`` applies;
``openmp-default`` imports torch first with no policy set (OpenMP's own default: spin, then
sleep), which is how fedshift ran before; ``spincount=N`` keeps OpenMP's default policy with
``GOMP_SPINCOUNT=N`` (a shorter spin before sleeping). The competitor is a pure-Python
busy loop (one core). Workloads: W1 (fused MLP step) and W2 (CNN, 1,000 MNIST images),
2 threads, the CLI's default execution. Reported: median seconds per round and busy / quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = """
import sys, time, json
first = sys.argv[1]
if first == "torch":
    import torch
import fedshift as fs
import torch
from fedshift.experiment import build_experiment
torch.set_num_threads(2)
model, samples, rounds = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = fs.scenario("dirichlet", dataset="mnist", clients=20, alpha=0.1,
                   proportions="per-class", samples=samples, seed=0)
cfg = fs.make_config(algorithm="fedavg", model=model, lr=0.005, batch_size=10,
                     rounds=rounds + 1, participation=1.0, seed=0)
runner = build_experiment(cfg, data=data).runner
runner.train_round(0)
times = []
for r in range(1, rounds + 1):
    t = time.perf_counter(); runner.train_round(r); times.append(time.perf_counter() - t)
print(json.dumps(times))
"""

WORKLOADS = {"w1": ("mlp", 0), "w2": ("fedavg-cnn", 1000)}


def measure(policy: str, workload: str, rounds: int, busy: bool) -> list[float]:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    if policy.startswith("spincount="):  # OpenMP's default policy with a shorter spin
        env["OMP_WAIT_POLICY"] = ""  # set (so fedshift keeps it), empty (OpenMP ignores it)
        env["GOMP_SPINCOUNT"] = policy.split("=", 1)[1]
    model, samples = WORKLOADS[workload]
    first = "torch" if policy == "openmp-default" else "fedshift"
    rival = None
    if busy:
        rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, first, model, str(samples), str(rounds)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--only", default="w1,w2")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--policies",
        default="fedshift,openmp-default",
        help="fedshift (its default, PASSIVE), openmp-default, spincount=N (GOMP_SPINCOUNT)",
    )
    args = ap.parse_args()
    res: dict = {}
    for workload in args.only.split(","):
        for policy in args.policies.split(","):
            quiet = measure(policy, workload, args.rounds, busy=False)
            busy = measure(policy, workload, args.rounds, busy=True)
            q, b = statistics.median(quiet), statistics.median(busy)
            res[f"{workload}.{policy}"] = {
                "quiet_s": q,
                "busy_s": b,
                "busy_over_quiet": b / q,
                "busy_max_over_quiet": max(busy) / q,
                "quiet_all_s": [round(t, 4) for t in quiet],
                "busy_all_s": [round(t, 4) for t in busy],
            }
    if args.json:
        print(json.dumps(res))
        return
    for k, v in res.items():
        print(
            f"{k:26s} quiet {v['quiet_s']:.3f} s  busy {v['busy_s']:.3f} s  "
            f"×{v['busy_over_quiet']:.2f} (worst round ×{v['busy_max_over_quiet']:.2f})"
        )


if __name__ == "__main__":
    main()
