"""Quick start: two methods on the offline demo data, results as tables and DataFrames.

    python examples/quickstart.py [--rounds 20] [--out example-output/quickstart]

`digits-shortcut` is scikit-learn's bundled digits with a coloured border that agrees with
the label with probability p (0.95 and 0.85 in training, 0 … 1 in the test environments),
so it runs anywhere without a download. FEDSHIFT_EXAMPLE_SMALL=1 runs a 2-round smoke test.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import fedshift as fs

SMALL = os.environ.get("FEDSHIFT_EXAMPLE_SMALL") == "1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2 if SMALL else 20)
    parser.add_argument("--out", type=Path, default=Path("example-output/quickstart"))
    args = parser.parse_args()
    db = args.out / "runs.db"

    # 1. a scenario: clients, their training data and named test environments
    data = fs.scenario("digits-shortcut", clients=4)
    print(f"{data.num_clients} clients, test environments {data.test_env_names}")

    # 2. methods, each run recorded in the run store (fedshift runs --db ... lists them)
    for algorithm, options in [("fedavg", {}), ("fedprox", {"mu": 0.01})]:
        out = fs.run(
            algorithm=algorithm, data=data, rounds=args.rounds, db=db, algorithm_options=options
        )
        m = out.metrics
        print(f"{algorithm:8s} worst {m['worst']:5.1f}  average {m['average']:5.1f}  "
              f"worst client {m['worst_client']:5.1f}  (run {out.run_id})")  # fmt: skip

    # 3. the results as DataFrames: one row per client × test environment, and per run
    print(out.frame().pivot(index="client", columns="env", values="accuracy").round(1).to_string())
    runs = fs.load_runs(db)
    print(runs[["run_id", "algorithm", "status", "worst", "average"]].to_string())
    print(f"recorded in {db}; try: fedshift report {out.run_id} --db {db}")


if __name__ == "__main__":
    main()
