"""``fedshift reproduce TABLE --status``: where a long table stands in a run store.

A paper-scale table runs for many hours, across sessions and processes (``--resume``).
This reads the store, trains nothing and loads no data, and says run by run which of the
table's runs are done (with the table's metrics and the degeneracy check), which are
running or stopped (rounds done of rounds), and which have not started, with what is left
at the pace of the method's finished runs, or, for a method none of whose runs has finished,
at the median round of its running and stopped runs so far; and, method by method, the
mean and spread of the seeds finished so far beside the published figures, with how many
of the seeds they are (an interim figure, never a verdict: the report's seed-noise and
degeneracy rules are applied when the table is complete). The runs are the ones
``reproduce`` would make with the same arguments (``reproduce.method_runs``), matched as
``--resume`` matches them (``jobs.config_identity``: the machine's keys, such as threads,
aside).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from statistics import mean, median
from typing import Any

from .eval.metrics import mean_std
from .jobs import config_identity, runs_by_config
from .reproduce import planned_runs
from .results.store import RunStore

STOPPED = ("interrupted", "failed", "diverged")


def _current(runs: list[dict]) -> dict | None:
    """The run that stands for this configuration: the newest finished one, else the one
    running now, else the newest stopped one (``--resume`` continues it)."""
    for states in (("done",), ("running",), STOPPED):
        found = [r for r in runs if r["status"] in states]
        if found:
            return found[-1]
    return None


def _logged(db: str | Path, rows: list[dict]) -> dict[str, list[float]]:
    """The seconds of every round each unfinished row's run has logged so far; each such
    row gets ``elapsed_s``, their sum (the hours a running or stopped run has taken)."""
    ids = [r["run_id"] for r in rows if r["state"] != "done" and r["run_id"] and r["rounds_done"]]
    logged = RunStore(db).round_seconds(ids) if ids else {}
    for row in rows:
        if row["run_id"] in logged:
            row["elapsed_s"] = sum(logged[row["run_id"]])
    return logged


def _partial_pace(rows: list[dict], logged: dict[str, list[float]]) -> dict[str, float]:
    """Seconds per round of each method that has no finished run: the median of the rounds
    its running and stopped runs have logged (none for a method with no logged round)."""
    pooled: dict[str, list[float]] = {}
    for row in rows:
        pooled.setdefault(row["method"], []).extend(logged.get(row["run_id"], []))
    return {method: median(times) for method, times in pooled.items() if times}


def _so_far(rows: list[dict], metrics: list[str]) -> list[dict]:
    """Per method (and sweep value): its finished seeds' mean and standard deviation of
    each metric (no deviation from a single seed), how many of its planned seeds those
    are, whether any finished seed is degenerate, and the published figures."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["method"], row.get("value")), []).append(row)
    summary = []
    for (method, value), group in groups.items():
        done = [r for r in group if r["state"] == "done"]
        entry: dict[str, Any] = {"method": method, "done": len(done), "planned": len(group)}
        if value is not None:
            entry["value"] = value
        for m in metrics:
            got = [r["metrics"].get(m) for r in done]
            mu, sd = mean_std(got)  # the reports' mean and sample std
            n = sum(v is not None for v in got)
            entry[m] = {"mean": mu if n else None, "std": sd if n > 1 else None}
        entry["degenerate"] = any(r["degenerate"] for r in done)
        entry["published"] = group[0]["published"]
        summary.append(entry)
    return summary


def table_status(
    source: str,
    *,
    db: str | Path,
    seeds: int | None = None,
    first_seed: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    extra: dict[str, Any] | None = None,
    methods: list[str] | None = None,
    skip_missing: bool = False,
) -> dict:
    """One row per planned run (method, seed, sweep value), its state and figures, and the
    counts; ``left_s``: seconds of one process still to run, from each method's finished
    runs' seconds per round, else from the median logged round of its unfinished runs
    (methods paced so are listed in ``paced_by_rounds``; those with neither, in
    ``unpaced``); ``so_far``: each method's finished seeds summarised (``_so_far``)."""
    table, plan, planned_list = planned_runs(
        source,
        methods,
        first_seed,
        seeds=seeds,
        rounds=rounds,
        quick=quick,
        extra=extra,
        skip_missing=skip_missing,
    )
    stored = runs_by_config(db)
    rows = []
    for planned in planned_list:
        m = planned.method
        run = _current(stored.get(config_identity(planned.config), []))
        metrics = (run or {}).get("metrics") or {}
        row = {
            "method": m.name,
            "algorithm": m.algorithm,
            "seed": planned.seed,
            "state": run["status"] if run else "not started",
            "run_id": run["run_id"] if run else None,
            "rounds": planned.config.rounds,
            "rounds_done": run["rounds_done"] if run else 0,
            "time_s": run.get("time_s") if run else None,
            "metrics": {k: metrics.get(k) for k in table.metrics} if run else {},
            "degenerate": metrics.get("degenerate") if run else None,
            "published": dict(m.published),
        }
        if planned.value is not None:
            row["value"] = planned.value
        rows.append(row)
    pace: dict[str, list[float]] = {}
    for row in rows:
        if row["state"] == "done" and row["time_s"] and row["rounds"]:
            pace.setdefault(row["method"], []).append(row["time_s"] / row["rounds"])
    logged = _logged(db, rows)
    partial = _partial_pace([r for r in rows if r["method"] not in pace], logged)
    left, unpaced = 0.0, []
    for row in rows:
        if row["state"] == "done":
            continue
        method = row["method"]
        per_round = mean(pace[method]) if method in pace else partial.get(method)
        if per_round is not None:
            left += per_round * (row["rounds"] - row["rounds_done"])
        elif method not in unpaced:
            unpaced.append(method)
    return {
        "table": table.id,
        "db": str(db),
        "metrics": list(table.metrics),
        "sweep_key": table.sweep_key or None,
        "runs": rows,
        "so_far": _so_far(rows, list(table.metrics)),
        "total": len(rows),
        "counts": dict(Counter(row["state"] for row in rows)),
        "left_s": left,
        "unpaced": unpaced,
        "paced_by_rounds": list(partial),
        "skipped": plan.skipped,
    }
