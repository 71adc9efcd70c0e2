"""`fedshift reproduce TABLE_ID`: re-run one of the papers' tables and put our numbers
beside the published ones.

The table is data (its schema and loading: ``tables.py``); this module plans a table's
runs (:func:`plan_table`), trains every method for K seeds on the same partitions through
the one configs × seeds loop (``jobs.run_jobs``), and hands the results to the comparison
(``results/comparison.py``: rank correlation, published gaps against the seed noise) and
the report (``results/reproduction.py``: ``report.md``, plots, the JSON summary).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from .config import RunConfig, apply
from .errors import FedshiftError
from .eval.metrics import combine_folds
from .results.comparison import MethodResult, compare
from .results.reproduction import summary, write_reproduction_report
from .results.store import DEFAULT_DB
from .tables import (
    Method,
    ScenarioCache,
    Table,
    check_option_overrides,
    load_table,
    method_config,
    missing_algorithms,
    select_methods,
)


@dataclass
class TablePlan:
    """What a table command runs: its methods with a registered algorithm (the rest
    ``skipped``), the config overrides every method gets, and the seeds per method."""

    methods: list[Method]
    skipped: list[str]
    overrides: dict[str, Any]
    seeds: int


def plan_table(
    table: Table,
    *,
    seeds: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    extra: dict[str, Any] | None = None,
    skip_missing: bool = False,
) -> TablePlan:
    """Check a table before anything runs (user modules imported, scenario registered,
    every method's config valid) and say what runs: shared by ``reproduce`` and
    ``reproduce --estimate``."""
    from .data import SCENARIOS
    from .plugins import import_modules

    import_modules(table.run.get("imports"))  # a table of the user's own methods
    missing = missing_algorithms(table)
    if missing and not skip_missing:
        raise FedshiftError(
            f"table {table.id} needs algorithms that are not registered: {', '.join(missing)}; "
            "run the others with --skip-missing"
        )
    scenario = RunConfig().scenario if "scenario" not in table.run else table.run["scenario"]
    if scenario not in SCENARIOS:
        raise FedshiftError(
            f"table {table.id} needs scenario {scenario!r}, which is not registered; "
            f"available: {', '.join(SCENARIOS.names())}"
        )
    methods = [m for m in table.methods if m.algorithm not in missing]
    skipped = [m.name for m in table.methods if m.algorithm in missing]
    if not methods:
        raise FedshiftError(f"no method of table {table.id} has a registered algorithm")
    overrides = dict(table.quick) if quick else {}
    overrides.update(extra or {})
    if rounds is not None:
        overrides["rounds"] = rounds
    k = seeds if seeds is not None else (1 if quick else table.seeds)
    if k < 1:
        raise FedshiftError(f"--seeds {k} must be at least 1")
    for m in methods:  # validate every method's config before anything runs
        method_config(table, m, overrides)
    check_option_overrides(table, methods, overrides)
    return TablePlan(methods, skipped, overrides, k)


@dataclass(frozen=True)
class PlannedRun:
    """One run of a table: a method's seed (and sweep value), with its full config."""

    method: Method
    seed: int
    value: Any  # the sweep value, or None
    config: RunConfig
    label: str


def method_runs(table: Table, m: Method, plan: TablePlan, first_seed: int) -> list[PlannedRun]:
    """The method's runs in the order they are made: seed by seed, each sweep value within
    a seed (``run_table`` trains them; ``reproduce --status`` looks them up)."""
    out = []
    for seed in range(first_seed, first_seed + plan.seeds):
        for value in table.sweep_values if table.sweep_key else [None]:
            cfg = method_config(table, m, {**plan.overrides, "seed": seed})
            if value is not None:
                apply(cfg, {table.sweep_key: value})
            label = f"{m.name} (seed {seed}{'' if value is None else f', {value}'})"
            out.append(PlannedRun(m, seed, value, cfg, label))
    return out


def table_first_seed(table: Table, first_seed: int | None) -> int:
    """The first seed a table runs: ``--first-seed`` when given, else the table's."""
    start = table.first_seed if first_seed is None else first_seed
    if start < 0:
        raise FedshiftError(f"--first-seed {start} must be 0 or more")
    return start


def planned_runs(
    source: str, methods: list[str] | None = None, first_seed: int | None = None, **plan: Any
) -> tuple[Table, TablePlan, list[PlannedRun]]:
    """A table (id or file) narrowed to ``methods``, its plan (``plan_table``'s options) and
    every run it makes, method by method (``reproduce --status`` and the ``--workers``
    hint read them against the store)."""
    table = select_methods(load_table(source), methods)
    planned = plan_table(table, **plan)
    start = table_first_seed(table, first_seed)
    runs = [r for m in planned.methods for r in method_runs(table, m, planned, start)]
    return table, planned, runs


def run_table(
    table: Table,
    *,
    seeds: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    db: str | Path = DEFAULT_DB,
    skip_missing: bool = False,
    extra: dict[str, Any] | None = None,
    progress=None,
    resume: bool = False,
    first_seed: int | None = None,
    export_to: str | Path | None = None,
    claims: Path | None = None,
) -> tuple[list[MethodResult], list[str]]:
    """Run every method of ``table`` for ``seeds`` seeds; returns the results and the
    methods skipped because their algorithm is not registered. ``progress(total, label)
    -> (bar, on_round)`` shows a line per run (the CLI's ``progress_bar``). With
    ``resume``, a run of the same configuration already in the store is reused when done
    and continued from its checkpoint when stopped (``jobs.earlier_run``), so a
    paper-scale table spans sessions. Seeds are ``first_seed … first_seed + seeds − 1``: a
    table run on seeds other than the one its settings were selected with starts past it
    (``first_seed`` None: the table's own ``first_seed``).
    A diverged run is a result of the table (a degenerate seed), not the end of it.
    ``export_to``: each run ends also as a file there (``fedshift export``). ``claims``: a
    worker of ``reproduce --workers`` (``table_workers``): it trains the runs it claims
    there, one at a time, and returns no results (the parent reports)."""
    from .jobs import Job, run_jobs
    from .results.store import new_group

    first_seed = table_first_seed(table, first_seed)
    plan = plan_table(
        table, seeds=seeds, rounds=rounds, quick=quick, extra=extra, skip_missing=skip_missing
    )
    sweep = table.sweep_values if table.sweep_key else [None]
    data_for = ScenarioCache(table)

    def jobs(m: Method) -> list[Job]:
        """The method's runs: seed by seed, each sweep value within a seed."""
        return [
            Job(r.config, r.label, partial(data_for, r.config))  # data built when it runs
            for r in method_runs(table, m, plan, first_seed)
        ]

    group = new_group("table")  # the runs this command starts (reused ones keep theirs)
    if claims is not None:
        from .table_workers import train_claimed

        keyed = [
            (f"{i}-{j}", job) for i, m in enumerate(plan.methods) for j, job in enumerate(jobs(m))
        ]
        run = {"db": db, "group": group, "progress": progress, "export_to": export_to}
        train_claimed(keyed, claims, reuse=resume, **run)
        return [], plan.skipped
    results = []
    for m in plan.methods:
        done = list(
            run_jobs(
                jobs(m),
                db=db,
                group=group,
                progress=progress,
                keep_diverged=True,
                reuse=resume,
                export_to=export_to,
            )
        )
        per_seed = []
        for i in range(0, len(done), len(sweep)):  # one seed's runs
            metrics = [f.metrics for f in done[i : i + len(sweep)]]
            if table.sweep_key:
                per_seed.append(combine_folds(metrics, table.sweep_key, sweep))
            else:
                per_seed.append(metrics[0])
        results.append(MethodResult.from_seeds(m, [f.run_id for f in done], per_seed))
    return results, plan.skipped


def reproduce(
    source: str,
    *,
    seeds: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    out_dir: str | Path | None = None,
    db: str | Path = DEFAULT_DB,
    skip_missing: bool = False,
    extra: dict[str, Any] | None = None,
    progress=None,
    methods: list[str] | None = None,
    resume: bool = False,
    first_seed: int | None = None,
    export_to: str | Path | None = None,
    claims: Path | None = None,
) -> dict:
    """Run a table (or the ``methods`` of it named) and write its report; returns the
    :func:`summary` dict (an empty one for a worker of ``--workers``: ``claims``)."""
    full = load_table(source)
    table = select_methods(full, methods)
    results, skipped = run_table(
        table,
        seeds=seeds,
        rounds=rounds,
        quick=quick,
        db=db,
        skip_missing=skip_missing,
        extra=extra,
        progress=progress,
        resume=resume,
        first_seed=first_seed,
        export_to=export_to,
        claims=claims,
    )
    if claims is not None:
        return {}
    comparison = compare(table, results)
    first = method_config(
        table, results[0].method, {**(table.quick if quick else {}), **(extra or {})}
    )
    settings = {
        "scenario": first.scenario,
        "scenario_options": first.scenario_options,
        "rounds": rounds if rounds is not None else first.rounds,
        "quick": quick,
        "overrides": {k: v for k, v in (extra or {}).items() if k not in ("device", "data_dir")},
        "not_run": [m.name for m in full.methods if m not in table.methods],
        "first_seed": table_first_seed(table, first_seed),
    }
    out = Path(out_dir) if out_dir is not None else Path("reproduce") / table.id
    report = write_reproduction_report(table, results, skipped, comparison, out, db, settings)
    return summary(table, results, skipped, comparison, report)
