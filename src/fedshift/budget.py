"""Plan a paper table's compute before running it (``fedshift reproduce TABLE --estimate``).

Each method is built at the table's full scale (its data, model, rounds and settings, and
any ``--set``), trained for a few rounds on this machine and evaluated once; its wall time
is then ``setup + first round + (rounds − 1) × median later round + evaluations ×
evaluation``, times the seeds and the table's sweep values. The first round is timed alone
because it carries one-off costs (compilation, caches, algorithms' statistics rounds).
Nothing is written to a run store. An estimate on a shared machine is as noisy as the
machine: the measured rounds are listed so a reader can judge it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

from .config import apply
from .reproduce import plan_table
from .tables import ScenarioCache, Table, load_table, method_config, select_methods


def time_method(cfg, data, rounds_timed: int) -> dict[str, Any]:
    """Setup, first-round, later-round and evaluation seconds of one method's run."""
    from .experiment import build_experiment

    t = time.perf_counter()
    runner = build_experiment(cfg, data=data).runner
    runner.server = runner.alg.before_training(runner.server)
    setup_s = time.perf_counter() - t
    times = []
    for r in range(min(cfg.rounds, 1 + rounds_timed)):
        t = time.perf_counter()
        runner.train_round(r)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    runner.evaluate(len(times) - 1)
    eval_s = time.perf_counter() - t
    later = statistics.median(times[1:]) if len(times) > 1 else times[0]
    every = cfg.eval_every
    # evaluated every eval_every rounds and after the last one (eval_every = 0: the last)
    evaluations = cfg.rounds // every + (cfg.rounds % every != 0) if every else 1
    run_s = setup_s + times[0] + (cfg.rounds - 1) * later + evaluations * eval_s
    return {
        "setup_s": setup_s,
        "first_round_s": times[0],
        "round_s": later,
        "rounds_timed_s": times[1:],
        "eval_s": eval_s,
        "evaluations": evaluations,
        "rounds": cfg.rounds,
        "run_s": run_s,
    }


def estimate_table(
    table: Table,
    overrides: dict[str, Any],
    seeds: int,
    rounds_timed: int = 2,
    progress=None,
) -> dict[str, Any]:
    """Estimated wall time of every method of ``table`` (already restricted to the methods
    wanted and validated by the caller) at ``overrides``; ``progress(label)`` is told which
    method is being timed."""
    runs_per_seed = len(table.sweep_values) if table.sweep_key else 1
    data_for = ScenarioCache(table)
    rows = []
    for m in table.methods:
        cfg = method_config(table, m, {**overrides, "seed": 0})
        if table.sweep_key:  # the sweep's first value stands for all of them
            apply(cfg, {table.sweep_key: table.sweep_values[0]})
        if progress is not None:
            progress(m.name)
        timing = time_method(cfg, data_for(cfg), rounds_timed)
        runs = seeds * runs_per_seed
        rows.append({"method": m.name, "algorithm": m.algorithm, "runs": runs, **timing,
                     "total_s": runs * timing["run_s"]})  # fmt: skip
    total = sum(r["total_s"] for r in rows)
    return {
        "table": table.id,
        "seeds": seeds,
        "rounds_timed": rounds_timed,
        "methods": rows,
        "total_s": total,
        "total_h": total / 3600,
    }


def estimate(
    source: str,
    *,
    seeds: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    extra: dict[str, Any] | None = None,
    methods: list[str] | None = None,
    rounds_timed: int = 2,
    progress=None,
) -> dict[str, Any]:
    """:func:`estimate_table` for a table id or file, with ``fedshift reproduce``'s options
    and checks (methods whose algorithm is not registered are left out, listed as
    ``skipped``)."""
    table = select_methods(load_table(source), methods)
    plan = plan_table(
        table, seeds=seeds, rounds=rounds, quick=quick, extra=extra, skip_missing=True
    )
    table = replace(table, methods=plan.methods)
    out = estimate_table(table, plan.overrides, plan.seeds, rounds_timed, progress)
    return {**out, "skipped": plan.skipped}
