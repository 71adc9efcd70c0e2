"""The paper-scale budget: `fedshift reproduce TABLE --estimate` for every shipped table.

    python benchmarks/paper_budget.py [--tables A,B] [--threads N] [--note TEXT]
                                      [--out benchmarks/results/paper_budget.json]

Each table's methods are timed for a few rounds at the table's full scale (src/fedshift/
budget.py says how) and the whole table's wall time is multiplied out. Tables whose data
are not on this machine are listed with the reason. Writes the JSON and prints a markdown
table for docs/performance.md. Run it on a quiet machine: the estimate is wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as fedshift run sets it


def main() -> None:
    from fedshift.budget import estimate
    from fedshift.errors import FedshiftError
    from fedshift.tables import table_names

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", help="comma-separated table ids (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = default)")
    ap.add_argument("--note", default="", help="the conditions, kept with each table's figures")
    ap.add_argument("--out", default="benchmarks/results/paper_budget.json")
    args = ap.parse_args()
    names = args.tables.split(",") if args.tables else table_names()
    out_path = Path(args.out)
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    for name in names:
        t = time.perf_counter()
        try:
            extra = {"threads": args.threads} if args.threads else None
            results[name] = estimate(name, extra=extra)
        except (FedshiftError, FileNotFoundError, OSError) as e:
            results[name] = {"table": name, "error": str(e)}
        results[name]["measured_s"] = time.perf_counter() - t
        results[name]["threads"] = args.threads or "default"
        if args.note:
            results[name]["note"] = args.note
        out_path.write_text(json.dumps(results, indent=1))  # after each table: resumable
        print(f"{name}: {results[name].get('total_h', float('nan')):.2f} h", flush=True)
    print("| table | methods × seeds | slowest method (s/round) | estimated hours |")
    print("| --- | --- | --- | --- |")
    for name in names:
        r = results[name]
        if "error" in r:
            print(f"| `{name}` | — | — | not measured: {r['error'][:80]} |")
            continue
        slow = max(r["methods"], key=lambda m: m["round_s"])
        print(
            f"| `{name}` | {len(r['methods'])} × {r['seeds']} | {slow['method']} "
            f"({slow['round_s']:.2f}) | {r['total_h']:.1f} |"
        )


if __name__ == "__main__":
    main()
