"""Re-score finished runs with the current degeneracy rules, from their final checkpoints.

The rules that keep a report from flattering a model grow (2026-11-26: the fit to its own
training data). A run finished before a rule existed carries no verdict under it; rather
than re-train it, ``fedshift rescore`` rebuilds its experiment from the recorded config,
loads its final checkpoint, evaluates once, and stores the new metrics — only if the
re-evaluation reproduces the stored headline numbers (else the data or the code changed,
and a new verdict would not be about the run that was recorded). What changed is kept in
the run's ``environment["rescored"]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .api import rebuild, reimport, training_lock
from .engine.checkpoint import load_checkpoint
from .errors import FedshiftError
from .eval.metrics import HEADLINE_METRICS, flag_chance_loss
from .results.store import RunStore, _now, checkpoint_path

TOLERANCE = 1e-6  # percentage points: the same model on the same rows gives the same counts


def rescore(db: str | Path, run_ids: list[str], data_dir: str | None = None) -> list[dict]:
    """Re-evaluate each finished run and store its metrics under the current rules; one
    entry per run: its id, method, and the degeneracy verdict before and after."""
    store = RunStore(db)
    return [_rescore_one(store, ref, data_dir) for ref in run_ids]


def _rescore_one(store: RunStore, ref: str, data_dir: str | None) -> dict[str, Any]:
    record = store.run(ref)
    run_id = record["run_id"]
    if record["status"] != "done" or not record["metrics"]:
        raise FedshiftError(
            f"run {run_id!r} is {record['status']}: only a finished run can be re-scored "
            "(resume it first)"
        )
    path = checkpoint_path(store.path, run_id)
    if not path.exists():
        raise FedshiftError(
            f"run {run_id!r}: its checkpoint {str(path)!r} is gone (pruned?), so its final "
            "model cannot be evaluated again"
        )
    with training_lock(store.path, run_id):
        reimport(record)
        cfg, exp = rebuild(record, record["config"], data_dir=data_dir)
        state = load_checkpoint(path)
        if state.get("rounds_done") != cfg.rounds:
            raise FedshiftError(
                f"run {run_id!r}: its checkpoint is of round {state.get('rounds_done')}, not "
                f"its last ({cfg.rounds}); it cannot be re-scored"
            )
        exp.runner.load_state_dict(state)
        _, metrics, _, _ = exp.runner.evaluate(cfg.rounds - 1)
        losses = [r["loss"] for r in record["round_metrics"]]
        flag_chance_loss(metrics, losses, exp.data.num_classes)
        old = record["metrics"]
        for key in HEADLINE_METRICS:
            a, b = old.get(key), metrics.get(key)
            if a is not None and (b is None or not math.isclose(a, b, abs_tol=TOLERANCE)):
                raise FedshiftError(
                    f"run {run_id!r}: evaluated again, its {key} is {b} where the store has "
                    f"{a}; the data or the code changed since it ran, so it is not re-scored"
                )
        new = {**old, **metrics}
        changed = {k: [old.get(k), new.get(k)] for k in sorted(new) if old.get(k) != new.get(k)}
        store.rescore(run_id, new, {"time": _now(), "changed": changed})
    return {
        "run_id": run_id,
        "algorithm": record["algorithm"],
        "degenerate_before": bool(old.get("degenerate")),
        "degenerate": bool(new.get("degenerate")),
        "degenerate_why": new.get("degenerate_why"),
        "changed": sorted(changed),
    }
