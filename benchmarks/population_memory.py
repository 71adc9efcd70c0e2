"""Peak memory of `fedshift run` with a large population, as a user runs it (issue 22).

    python benchmarks/population_memory.py [--json]

Two cases, each `fedshift run` in a fresh process, one round (two for the second), peak
resident memory read from the child's rusage:

* ``dirichlet-10k``: all of MNIST over 10,000 clients (Dir 0.4, ≥ 2 images each), full
  participation, `--cohort-size 1000`, MLP 784-100-10. The round's 10,000 uploads are
  79,510 float32 parameters each (3.2 GB together): the figure to compare the peak with is
  that size, since the server must see every upload of a round before it screens them
  (faults.max_norm is relative to the round's median norm).
* ``scm-100k``: the synthetic SCM over 100,000 clients at participation 0.01 (1,000 a round).

Reported: peak RSS (MB), the round's upload bytes, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {
    "dirichlet-10k": [
        "run", "--set", "scenario=dirichlet", "--set", "scenario.clients=10000",
        "--set", "scenario.samples=0", "--set", "scenario.min_samples=2",
        "--rounds", "1", "--cohort-size", "1000",
    ],
    "scm-100k": [
        "run", "--set", "scenario=scm", "--set", "scenario.clients=100000",
        "--set", "scenario.participation=0.01", "--set", "scenario.samples_per_env=40000",
        "--set", "scenario.test_envs=2", "--set", "scenario.test_samples_per_env=100000",
        "--set", "scenario.val_envs=2", "--rounds", "2",
    ],
}  # fmt: skip


def run_case(name: str) -> None:
    """In this (child) process: the CLI's run, then this process's peak RSS as a last line."""
    from fedshift.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        app([*CASES[name], "--json", "--db", str(Path(tmp) / "r.db")], standalone_mode=False)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def measure(name: str) -> dict:
    """One case in a fresh process: its peak RSS and the bytes it uploaded per round."""
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    cmd = [sys.executable, __file__, "--case", name]
    lines = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    lines = lines.strip().splitlines()
    summary, peak_mb = json.loads(lines[-2]), json.loads(lines[-1])["peak_rss_mb"]
    upload_mb = summary["bytes_up"] / summary["rounds"] / 2**20
    return {
        "case": name,
        "peak_rss_mb": peak_mb,
        "round_upload_mb": upload_mb,
        "peak_over_uploads": peak_mb / upload_mb,
        "worst": summary["metrics"]["worst"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        run_case(args.case)
        return
    points = [measure(name) for name in CASES]
    if args.json:
        print(json.dumps(points))
        return
    for p in points:
        print(
            f"{p['case']:14s} peak RSS {p['peak_rss_mb']:7.0f} MB, one round's uploads "
            f"{p['round_upload_mb']:7.0f} MB (ratio {p['peak_over_uploads']:.2f}), "
            f"worst {p['worst']:.1f} %"
        )


if __name__ == "__main__":
    main()
