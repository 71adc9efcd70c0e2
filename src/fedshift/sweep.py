"""Hyper-parameter sweeps: a grid of config values × seeds, every run recorded in the run
store, the grid point chosen by **validation** accuracy (thesis §4.5.2: never by test).

``fedshift sweep --set algorithm=fedprox --grid algorithm.mu=0.001,0.01,0.1 --seeds 0,1``
runs 3 × 2 configurations. For each grid point the sweep reports the mean ± std over seeds
of the validation accuracy (the scenario's validation environments, averaged over clients
and environments at the last round) and of every test metric; the selected point is the
one with the highest mean validation accuracy (ties: the earliest point in grid order)
among the points whose models are not degenerate (a constant predictor can score chance on
validation environments that a shortcut model fails: on CMNIST, 49 % against a colour
model's 20 %), and its test metrics are the sweep's result. Degeneracy is read from the
models' predictions, not from test labels. When every point is degenerate the best one
by validation is still reported, with ``all_degenerate`` set. A point whose run diverges
(``Diverged``: non-finite state, or too many rounds without a usable upload) is marked
``diverged`` with the reason, its remaining seeds are skipped, and the sweep goes on: a
learning rate too large for the model is a result of the sweep, not the end of it. A
diverged point is never selected; when every point diverged the sweep fails with one
sentence.

``--folds scenario.held_out=0,15,30`` sweeps a leave-one-domain-out table as the table is
scored: every grid point runs every fold for every seed; a seed's validation score is the
mean over its folds (each fold's validation rows come from its own training domains, the
training-domain validation of DomainBed, Gulrajani & Lopez-Paz 2021) and its test metrics
are combined as ``reproduce`` combines the table's folds (each fold's average accuracy an
environment: worst = the lowest fold, average = their mean); mean ± std are then over
seeds. Without it, selecting on one held-out domain would tune for that fold only.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import canonical, resolve
from .errors import FedshiftError
from .eval.metrics import combine_folds, mean_std, over_seeds

# the settings that make a run's scale: a sweep of a table's row that changes any of them
# selects at another scale than the table runs, which can rank settings differently
# (docs/reproduce.md: FedPIN's reduced-scale choice is a colour reader at the table's)
SCALE_KEYS = (
    "rounds",
    "scenario.samples",
    "scenario.test_samples",
    "scenario.clients",
    "local_epochs",
    "local_steps",
    "participation",
    "batch_size",
)


def scale_changes(row: Any, swept: dict[str, Any]) -> dict[str, dict]:
    """The scale settings (``SCALE_KEYS``) in which a sweep of a table's ``row`` differs
    from the row as its table runs it: ``{key: {"sweep": value, "table": value}}``.
    ``swept``: a sweep run's flat config (its fold's value of the table's own fold key is
    the one the table's run is built with). Values compare by meaning (``--set`` gives
    ``"16000"``, a table file the number)."""
    key = row.table.sweep_key
    own = row.config({key: swept[key]} if key in swept else {}).flat()
    return {
        k: {"sweep": swept.get(k), "table": own.get(k)}
        for k in SCALE_KEYS
        if canonical(swept.get(k)) != canonical(own.get(k))
    }


def select_point(points: list[dict[str, Any]]) -> tuple[int, bool]:
    """Index of the point with the best mean validation accuracy among the non-degenerate
    ones (ties: the earliest), and whether there was any non-degenerate point."""
    finished = [i for i, p in enumerate(points) if not p.get("diverged")]
    if not finished:
        raise FedshiftError(
            "every grid point diverged (first: "
            f"{points[0]['diverged']}); try smaller learning rates or step sizes"
        )
    usable = [i for i in finished if not points[i]["metrics"].get("degenerate")]
    best = max(usable or finished, key=lambda i: (points[i]["val"], -i))
    return best, bool(usable)


def split_values(text: str) -> list[str]:
    """``"0.1,0.01"`` → ``["0.1", "0.01"]``; commas inside brackets stay, so list-valued
    options sweep too: ``"[0.9,0.8],[0.95,0.85]"`` → two values."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """``["algorithm.mu=0.1,0.01", "lr=0.05,0.1"]`` → ``{key: [values]}`` (order kept)."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, eq, values = item.partition("=")
        key = key.strip()
        vals = split_values(values) if eq else []
        if not eq or not key or not all(vals):
            raise FedshiftError(f"--grid {item!r} is not of the form key=value1,value2,…")
        if key in grid:
            raise FedshiftError(f"--grid {key} is given twice; list all its values once")
        if len(set(vals)) != len(vals):
            raise FedshiftError(f"--grid {item!r} repeats a value")
        grid[key] = vals
    return grid


def fold_overrides(folds: dict[str, list], grid: dict[str, list[str]]) -> list[dict]:
    """The config values of each fold (``[{}]``: no folds). One key, not also swept."""
    if not folds:
        return [{}]
    if len(folds) > 1:
        raise FedshiftError(f"--folds takes one key (got {', '.join(folds)}); list its values once")
    key, values = next(iter(folds.items()))
    if key in grid or key in ("seed", "seeds"):
        raise FedshiftError(f"--folds {key} cannot also be swept or be the seed; name it once")
    return [{key: v} for v in values]


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Cartesian product in the order given (the last key varies fastest)."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


@dataclass
class GridPoint:
    params: dict[str, str]
    run_ids: list[str | None] = field(default_factory=list)
    val: list[float | None] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)  # each seed's final metrics
    diverged: str | None = None  # why one of its runs diverged (its other seeds not run)

    def result(self) -> dict[str, Any]:
        if self.diverged is not None:
            return {
                "params": dict(self.params),
                "run_ids": list(self.run_ids),
                "val": None,
                "val_std": None,
                "metrics": {},
                "metrics_std": {},
                "diverged": self.diverged,
            }
        vm, vs = mean_std(self.val)
        mean, std = over_seeds(self.metrics)
        return {
            "params": dict(self.params),
            "run_ids": list(self.run_ids),
            "val": vm,
            "val_std": vs,
            "metrics": mean,
            "metrics_std": std,
            "diverged": None,
        }


def run_sweep(
    source: str | None,
    overrides: dict[str, Any],
    grid: dict[str, list[str]],
    seeds: list[int],
    db: str | Path | None,
    progress: Callable | None = None,
    resume: bool = False,
    export_to: str | Path | None = None,
    claims: Path | None = None,
    folds: dict[str, list] | None = None,
    row: Any = None,
) -> dict[str, Any]:
    """Run every grid point with every seed and select by validation accuracy.

    ``progress(total_rounds, label) -> (bar, on_round)`` shows a bar per run (the CLI's).
    ``resume``: a run of the same configuration already in ``db`` stands in (a finished
    one as it is, a stopped one continued from its checkpoint), so a long sweep that was
    stopped continues where it was. ``export_to``: each run ends also as a file there
    (``fedshift export``). ``folds``: one key whose values every grid point runs, scored
    per seed by the mean over them (see the module docstring). Returns the JSON summary of
    ``fedshift sweep --json`` (an empty one for a worker of ``sweep --workers``: ``claims``,
    see ``table_workers``). ``row``: a paper table's method (``tables.Row``), whose settings
    every run takes as ``fedshift run TABLE --method NAME`` would (``source`` unused).
    """
    from .experiment import check_options

    if not seeds:
        raise FedshiftError("a sweep needs at least one seed")
    for key in grid:
        if key in ("seed", "seeds"):
            raise FedshiftError("sweep seeds with --seeds, not --grid seed=…")
    fold_sets = fold_overrides(folds or {}, grid)
    points = grid_points(grid) if grid else [{}]
    build = row.config if row is not None else functools.partial(resolve, source)
    configs = []  # per point: seed-major, then fold
    for params in points:
        per_run = [
            build({**overrides, **params, **fold, "seed": s}) for s in seeds for fold in fold_sets
        ]
        check_options(per_run[0])  # before anything runs
        configs.append(per_run)

    from .jobs import Job, run_jobs
    from .results.store import new_group

    group = new_group("sweep")  # every run of this sweep: fedshift runs --sweep ID
    point_jobs = []  # each grid point's runs, one per seed and fold
    folds_of = ["".join(f"{k}={v}, " for k, v in fold.items()) for fold in fold_sets]
    for params, per_run in zip(points, configs, strict=True):
        name = ", ".join(f"{k}={v}" for k, v in params.items())
        what = name or (row.method.name if row is not None else per_run[0].algorithm)
        point_jobs.append(
            [
                Job(
                    cfg,
                    f"{what} ({folds_of[i % len(fold_sets)]}seed {cfg.seed})",
                    functools.partial(row.data, cfg) if row is not None else None,
                )
                for i, cfg in enumerate(per_run)
            ]
        )
    if claims is not None:  # a worker: the runs it claims, no summary
        from .table_workers import train_claimed

        keyed = [
            (f"{p}-{i}", job) for p, jobs in enumerate(point_jobs) for i, job in enumerate(jobs)
        ]
        run = {"db": db, "group": group, "progress": progress, "export_to": export_to}
        train_claimed(keyed, claims, reuse=resume, **run)
        return {}
    done = []
    for params, jobs in zip(points, point_jobs, strict=True):
        point = GridPoint(params)
        runs = run_jobs(
            jobs,
            db=db,
            group=group,
            progress=progress,
            keep_diverged=True,
            reuse=resume,
            export_to=export_to,
        )
        vals: list[float] = []
        metrics: list[dict] = []
        for run in runs:
            point.run_ids.append(run.run_id)
            if run.diverged:
                point.diverged = run.diverged
                break  # the point is out of the selection: its other seeds would not count
            if run.val is None:
                raise FedshiftError(
                    f"scenario {run.job.config.scenario!r} has no validation environment, and "
                    "a sweep selects by validation accuracy only (never by test)"
                )
            vals.append(run.val)
            metrics.append(run.metrics)
            if len(vals) == len(fold_sets):  # a seed's folds are done: its score
                point.val.append(sum(vals) / len(vals))
                point.metrics.append(
                    combine_folds(metrics, *next(iter(folds.items()))) if folds else metrics[0]
                )
                vals, metrics = [], []
        done.append(point.result())

    best, usable = select_point(done)
    first = configs[0][0]
    return {
        "table": None if row is None else {"id": row.table.id, "method": row.method.name},
        "scale": None if row is None else scale_changes(row, first.flat()),
        "algorithm": first.algorithm,
        "scenario": first.scenario,
        "rounds": first.rounds,
        "seeds": list(seeds),
        "grid": {k: list(v) for k, v in grid.items()},
        "folds": {k: [str(x) for x in v] for k, v in (folds or {}).items()},
        "selection": (
            "validation accuracy (mean over seeds), degenerate and diverged points excluded"
        ),
        "all_degenerate": not usable,
        "points": done,
        "selected": best,
        "selected_params": done[best]["params"],
        "val": done[best]["val"],
        "metrics": done[best]["metrics"],
        "metrics_std": done[best]["metrics_std"],
        "run_ids": [r for p in done for r in p["run_ids"]],
        "group": group,
    }
