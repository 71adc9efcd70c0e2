"""The numbers every registered algorithm gives on the tiny problem, pinned before a
restructuring so that it can be shown to change none of them (issue 23).

``python tests/algorithms/pinned.py --write`` records them in
``tests/algorithms/pinned_numbers.json``; ``tests/algorithms/test_pinned_numbers.py``
re-runs every algorithm and compares: bit for bit when the machine matches the one that
wrote the file (same torch and CPU capability), to float32 rounding otherwise (other
kernels may sum in another order).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the toy problem
from toy import algorithm_test_data  # noqa: E402

import fedshift as fs  # noqa: E402
from fedshift.algorithms import ALGORITHMS  # noqa: E402
from fedshift.engine.tree import flatten  # noqa: E402
from fedshift.experiment import cpu_info  # noqa: E402

PINNED = Path(__file__).with_name("pinned_numbers.json")

# Partial participation (so sampling and the unsampled clients' updates count), momentum,
# three rounds, evaluation twice: more of each method's code than the 2-round smoke test.
SETTINGS = dict(
    lr=0.05,
    batch_size=8,
    rounds=3,
    participation=0.6,
    momentum=0.5,
    eval_every=2,
    model_options={"hidden": [8]},
    execution="batched",
    threads=1,
)


def builtin_algorithms() -> list[str]:
    """fedshift's own algorithms (other tests register users' methods in the same process)."""
    return [
        n
        for n in ALGORITHMS.names()
        if ALGORITHMS.get(n).__module__.startswith("fedshift.algorithms.")
    ]


def machine() -> dict:
    """What decides the last bits of a float result: torch, its kernels' instruction set and
    the CPU's maker (the same AVX-512 kernels round differently on AMD and Intel cores, 28 of
    35 pins by ≤ 1e-7 relative, 2026-11-26). Elsewhere the pins hold to a tolerance."""
    return {
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "vendor": cpu_info("vendor_id"),
    }


def _tensor(t: torch.Tensor) -> dict:
    t = t.detach().cpu()
    return {"dtype": str(t.dtype), "shape": list(t.shape), "values": t.double().flatten().tolist()}


def numbers(algorithm: str, seed: int = 0) -> dict:
    """What one run of ``algorithm`` gives: its server state, every client's accuracy per
    environment, the validation accuracies, each round's loss and test summary, and the bytes."""
    out = fs.run(algorithm=algorithm, data=algorithm_test_data(algorithm)(), seed=seed, **SETTINGS)
    res = out.result
    return {
        # flat "/"-joined names: nested state pins as the prefixed names it replaced
        "server": {k: _tensor(v) for k, v in sorted(flatten(res.server).items())},
        "accuracy": _tensor(res.accuracy),
        "val_accuracy": None if res.val_accuracy is None else _tensor(res.val_accuracy),
        "rounds": [
            dict(loss=r.loss, metrics=r.metrics, val=r.val, up=r.bytes_up, down=r.bytes_down)
            for r in res.rounds
        ],
        "metrics": res.metrics,
    }


def write() -> None:
    pins = {"machine": machine(), "settings": repr(SETTINGS), "algorithms": {}}
    for name in builtin_algorithms():
        print(name, flush=True)
        pins["algorithms"][name] = numbers(name)
    PINNED.write_text(json.dumps(pins, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/algorithms/pinned.py --write")
    write()
