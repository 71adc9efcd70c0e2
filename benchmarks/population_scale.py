"""W4: time per round and peak memory against the population size, at a fixed cohort.

    python benchmarks/population_scale.py [--quick] [--json] [--threads 1]

FedAvg, MLP 32-100-10 on a synthetic source: every client holds 10 training and 5 test
samples of a 10-class Gaussian mixture with a client-specific label skew (so a client's
work is the same whatever the population). Each point (population N, cohort C) runs in a
fresh process: build the scenario and the runner, one warm-up round, then timed rounds of
C sampled clients; it reports the median seconds per round, the peak RSS, the bytes of the
scenario's tensors, and the time of one full evaluation of all N clients (kept out of the
per-round figure: evaluation cadence is the ``eval_every`` setting).

Default sweep: N ∈ {100, 1k, 10k, 100k} at C = 100, and C ∈ {10, 30, 100, 300} at N = 100k.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see round_speed.py

import torch  # noqa: E402

DIM, CLASSES, TRAIN, TEST = 32, 10, 10, 5


def synthetic(num_clients: int, seed: int = 0):
    from fedshift.data.federated import FederatedData, Split

    g = torch.Generator().manual_seed(seed)
    means = torch.randn(CLASSES, DIM, generator=g) * 1.5
    favourite = torch.randint(0, CLASSES, (num_clients,), generator=g)

    def split(per_client: int) -> Split:
        n = num_clients * per_client
        owner = torch.arange(num_clients).repeat_interleave(per_client)
        skew = torch.rand(n, generator=g) < 0.7  # 70 % of a client's labels: its favourite
        y = torch.where(skew, favourite[owner], torch.randint(0, CLASSES, (n,), generator=g))
        x = means[y] + torch.randn(n, DIM, generator=g)
        offsets = torch.arange(num_clients + 1) * per_client
        return Split(x, y, offsets)

    return FederatedData(
        name=f"synthetic-{num_clients}",
        num_classes=CLASSES,
        input_shape=(DIM,),
        train=split(TRAIN),
        test={"test": split(TEST)},
        default_model="mlp",
    )


def rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def status_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) from /proc (MB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Restart VmHWM from the current RSS (Linux ≥ 4.0), so the rounds' peak is seen alone."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def point(population: int, cohort: int, rounds: int, threads: int) -> dict:
    """One measurement, in this process."""
    import fedshift as fs
    from fedshift.experiment import build_experiment

    torch.set_num_threads(threads)
    base = rss_mb()
    t0 = time.perf_counter()
    data = synthetic(population)
    build_s = time.perf_counter() - t0
    data_mb = (
        sum(
            t.numel() * t.element_size()
            for s in (data.train, *data.test.values())
            for t in (s.x, s.y, s.offsets)
        )
        / 2**20
    )
    cfg = fs.make_config(
        algorithm="fedavg",
        model="mlp",
        model_options={"hidden": [100]},
        lr=0.05,
        batch_size=10,
        local_epochs=1,
        rounds=rounds + 1,
        clients_per_round=cohort,
        seed=0,
    )
    runner = build_experiment(cfg, data=data).runner
    before = status_mb("VmRSS")
    reset_peak()
    runner.train_round(0)
    times, cpu = [], []
    for r in range(1, rounds + 1):
        t, c = time.perf_counter(), time.process_time()
        runner.train_round(r)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    rounds_peak = status_mb("VmHWM")
    t = time.perf_counter()
    runner.counts(data.test, rounds)  # every client on its test splits
    eval_s = time.perf_counter() - t
    return {
        "population": population,
        "cohort": cohort,
        "round_s": statistics.median(times),
        "round_all_s": [round(v, 4) for v in times],
        "round_cpu_s": statistics.median(cpu),
        "peak_rss_mb": rss_mb(),
        "rss_before_rounds_mb": before,
        "rounds_peak_rss_mb": rounds_peak,
        "rounds_rss_growth_mb": rounds_peak - before,
        "rss_after_import_mb": base,
        "data_mb": data_mb,
        "build_s": build_s,
        "eval_all_clients_s": eval_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--point", nargs=2, type=int, metavar=("N", "C"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    if args.point:
        print(json.dumps(point(*args.point, rounds, args.threads)))
        return
    grid = [(n, 100) for n in (100, 1_000, 10_000, 100_000)]
    grid += [(100_000, c) for c in (10, 30, 300)]
    points = []
    for n, c in grid:
        cmd = [sys.executable, __file__, "--point", str(n), str(c), "--rounds", str(rounds)]
        cmd += ["--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        points.append(json.loads(out.strip().splitlines()[-1]))
        if not args.json:
            p = points[-1]
            print(
                f"N={n:>7} C={c:>4}: {p['round_s']:.3f} s/round, peak RSS "
                f"{p['peak_rss_mb']:.0f} MB (data {p['data_mb']:.0f} MB; rounds add "
                f"{p['rounds_rss_growth_mb']:.1f} MB), "
                f"evaluating all clients {p['eval_all_clients_s']:.2f} s"
            )
    by = {(p["population"], p["cohort"]): p for p in points}
    small, large = by[(100, 100)], by[(100_000, 100)]
    summary = {
        "w4.round_s_100": small["round_s"],
        "w4.round_s_100000": large["round_s"],
        "w4.time_ratio": large["round_s"] / small["round_s"],
        "w4.cpu_time_ratio": large["round_cpu_s"] / small["round_cpu_s"],
        "w4.peak_rss_mb_100": small["peak_rss_mb"],
        "w4.peak_rss_mb_100000": large["peak_rss_mb"],
        "w4.data_mb_100000": large["data_mb"],
        "w4.rounds_rss_growth_mb_100": small["rounds_rss_growth_mb"],
        "w4.rounds_rss_growth_mb_100000": large["rounds_rss_growth_mb"],
        "w4.points": points,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            if k != "w4.points":
                print(f"{k:32s} {v:.4g}")


if __name__ == "__main__":
    main()
