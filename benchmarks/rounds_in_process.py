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

import torch

from fedshift.budget import time_method
from fedshift.reproduce import plan_table
from fedshift.tables import ScenarioCache, load_table, method_config, select_methods


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("methods", help="comma-separated method names of the table, timed in order")
    ap.add_argument("--table", default="thesis-5.1-cmnist8")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=6, help="rounds timed for the last method")
    ap.add_argument("--others", type=int, default=3, help="rounds timed for the others")
    args = ap.parse_args()
    torch.set_num_threads(1)
    table = load_table(args.table)
    plan = plan_table(table, extra={"device": args.device, "threads": 1}, skip_missing=True)
    data_for = ScenarioCache(table)
    names = args.methods.split(",")
    for i, name in enumerate(names):
        method = select_methods(table, [name]).methods[0]
        cfg = method_config(table, method, {**plan.overrides, "seed": 0})
        # the estimate's own timing (first round, then the rest), as `--estimate` measured it
        rounds = args.rounds if i == len(names) - 1 else args.others
        timing = time_method(cfg, data_for(cfg), rounds - 1)
        times = [timing["first_round_s"], *timing["rounds_timed_s"]]
        out = {"method": name, "position": i, "round_s": [round(t, 3) for t in times]}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
