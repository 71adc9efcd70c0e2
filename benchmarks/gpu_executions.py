"""Every registered algorithm on a CUDA device: batched and sequential executions against
each other there, and the device against the CPU, on the engine tests' tiny problem
(tests/toy.py) and on small images through convolutions. One JSON line per case, then a
summary line; run by ``benchmarks/gpu_check.sh``.

    python benchmarks/gpu_executions.py [--device cuda]

What must hold: the same numbers up to float32 rounding between executions on the device
(the CPU suite's tolerance, ``tests/engine/test_execution.py``), and between CPU and device
up to the rounding of different kernels (looser: reported, not asserted here), with every
tensor of the trained state on the device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))

from toy import algorithm_test_data  # noqa: E402

import fedshift as fs  # noqa: E402
from fedshift.algorithms import ALGORITHMS  # noqa: E402
from fedshift.engine.tree import flatten  # noqa: E402

SETTINGS = dict(lr=0.05, batch_size=32, rounds=2, model_options={"hidden": [8]})


def rel_diffs(a: dict, b: dict) -> dict[str, float]:
    """‖a − b‖ / ‖a‖ of each floating tensor of the server state (b moved to a's device)."""
    fa, fb = flatten(a), flatten(b)
    out = {}
    for k, v in fa.items():
        if torch.is_floating_point(v):
            w = fb[k].to(v.device, v.dtype)
            out[k] = float((v - w).norm() / v.norm().clamp_min(1e-12))
    return out


def rel_diff(a: dict, b: dict) -> float:
    return max(rel_diffs(a, b).values(), default=0.0)


def worst_key(a: dict, b: dict) -> str | None:
    d = rel_diffs(a, b)
    return max(d, key=d.get) if d else None


def devices_of(state: dict) -> set[str]:
    return {t.device.type for t in flatten(state).values()}


def case(name: str, device: str, **kw) -> dict:
    t = time.perf_counter()
    batched = fs.run(device=device, execution="batched", **kw)
    sequential = fs.run(device=device, execution="sequential", **kw)
    cpu = fs.run(device="cpu", execution="batched", **kw)
    acc_b, acc_s = batched.result.accuracy, sequential.result.accuracy
    return {
        "case": name,
        "state_devices": sorted(devices_of(batched.result.server)),
        "batched_vs_sequential": rel_diff(batched.result.server, sequential.result.server),
        "device_vs_cpu": rel_diff(batched.result.server, cpu.result.server),
        "device_vs_cpu_worst": worst_key(batched.result.server, cpu.result.server),
        "accuracy_vs_cpu": float((acc_b.cpu() - cpu.result.accuracy.cpu()).abs().max()),
        "accuracy_gap": float((acc_b.cpu() - acc_s.cpu()).abs().max()),
        "finite": bool(
            all(
                torch.isfinite(v).all()
                for v in flatten(batched.result.server).values()
                if torch.is_floating_point(v)
            )
        ),
        "seconds": round(time.perf_counter() - t, 2),
    }


def failure(name: str, exc: Exception) -> dict:
    """The error and the fedshift frames that led to it (where a device mix-up happened)."""
    frames = [
        f"{Path(f.filename).name}:{f.lineno} {f.line}"
        for f in traceback.extract_tb(exc.__traceback__)
        if "fedshift" in f.filename
    ]
    return {"case": name, "error": f"{type(exc).__name__}: {exc}"[:300], "where": frames[-4:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="", help="comma-separated algorithms (default: all)")
    ap.add_argument("--rounds", type=int, default=SETTINGS["rounds"])
    args = ap.parse_args()
    SETTINGS["rounds"] = args.rounds
    from test_execution import tiny_images

    names = args.only.split(",") if args.only else ALGORITHMS.names()
    rows = []
    for alg in names:
        try:
            row = case(alg, args.device, algorithm=alg, data=algorithm_test_data(alg)(), **SETTINGS)
        except Exception as exc:  # noqa: BLE001 - a report: one failing method must not hide the rest
            row = failure(alg, exc)
        rows.append(row)
        print(json.dumps(row), flush=True)
    for alg, model in (("fedavg", "fedavg-cnn"), ("fedbn", "dfl-cnn"), ("ditto", "lenet5")):
        name = f"{alg}+{model}"
        try:
            row = case(
                name,
                args.device,
                algorithm=alg,
                model=model,
                data=tiny_images(),
                lr=0.05,
                batch_size=8,
                rounds=2,
            )
        except Exception as exc:  # noqa: BLE001
            row = failure(name, exc)
        rows.append(row)
        print(json.dumps(row), flush=True)
    ok = [r for r in rows if "error" not in r]
    print(
        json.dumps(
            {
                "summary": True,
                "cases": len(rows),
                "errors": [r["case"] for r in rows if "error" in r],
                "not_on_device": [
                    r["case"]
                    for r in ok
                    if set(r["state_devices"]) - {torch.device(args.device).type}
                ],
                "max_batched_vs_sequential": max(
                    (r["batched_vs_sequential"] for r in ok), default=None
                ),
                "max_device_vs_cpu": max((r["device_vs_cpu"] for r in ok), default=None),
                "non_finite": [r["case"] for r in ok if not r["finite"]],
            }
        )
    )


if __name__ == "__main__":
    main()
