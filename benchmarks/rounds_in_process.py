"""Round times of one table's methods, one by one, in one process (a `--workers` process
takes its runs in turn like this).

On an H200 (2026-12-01) FedSDR's Table 5.1 CMNIST-8 round took 4.09 s in a fresh process
and 6.69 s as the eleventh method of one `reproduce --estimate` process (its first round
there 4.94 s). This times every round, so a slowdown shows as a trend within a method or
as a gap between a method timed fresh and after others:

    python benchmarks/rounds_in_process.py FedSDR --device cuda --rounds 8
    python benchmarks/rounds_in_process.py FedAvg,FedSR,pFedMe,FedSDR --device cuda --rounds 8
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fedshift.experiment import build_experiment
from fedshift.reproduce import plan_table
from fedshift.tables import ScenarioCache, load_table, method_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("methods", help="comma-separated method names of the table, timed in order")
    ap.add_argument("--table", default="thesis-5.1-cmnist8")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=6, help="rounds timed for the last method")
    ap.add_argument("--others", type=int, default=3, help="rounds timed for the others")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    table = load_table(args.table)
    extra = {"device": args.device, "threads": 1}
    plan = plan_table(table, extra=extra, skip_missing=True)
    data_for = ScenarioCache(table)
    names = args.methods.split(",")
    for i, name in enumerate(names):
        method = next(m for m in table.methods if m.name == name)
        cfg = method_config(table, method, {**plan.overrides, "seed": 0})
        runner = build_experiment(cfg, data=data_for(cfg)).runner
        runner.server = runner.alg.before_training(runner.server)
        times = []
        for r in range(args.rounds if i == len(names) - 1 else args.others):
            sync()
            t = time.perf_counter()
            runner.train_round(r)
            sync()
            times.append(round(time.perf_counter() - t, 3))
        print(json.dumps({"method": name, "position": i, "round_s": times}), flush=True)


if __name__ == "__main__":
    main()
