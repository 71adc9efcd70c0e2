"""``fedshift reproduce``: a paper table's runs and report, its ``--estimate`` and its
``--status`` (registered on the ``fedshift`` app by ``cli.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .cli_errors import user_errors
from .cli_options import (
    DataDirOption,
    DbOption,
    DeviceOption,
    ExportOption,
    ImportOption,
    JsonOption,
    ResumeOption,
    import_first,
)
from .cli_output import err, fmt, out, print_json, progress_bar, say
from .errors import FedshiftError
from .results.store import DEFAULT_DB


@user_errors
def reproduce(
    table: Annotated[str, typer.Argument(help="table id (fedshift list presets) or TOML file")],
    seeds: Annotated[
        int | None, typer.Option(help="seeds per method (default: the table's)")
    ] = None,
    first_seed: Annotated[
        int | None,
        typer.Option(
            help="run seeds first-seed … first-seed + seeds − 1 (fresh seeds after a "
            "selection; default: the table's, 0 unless it says otherwise)"
        ),
    ] = None,
    rounds: Annotated[int | None, typer.Option(help="override the table's rounds")] = None,
    quick: Annotated[
        bool, typer.Option(help="smoke-sized run: the table's [quick] settings")
    ] = False,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="override a config key of every method: key=value"),
    ] = None,
    methods: Annotated[
        str | None,
        typer.Option(help="run only these methods: names or algorithms, comma-separated"),
    ] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="report folder")] = None,
    db: DbOption = DEFAULT_DB,
    json_: JsonOption = False,
    skip_missing: Annotated[
        bool, typer.Option(help="run the methods whose algorithm is registered, skip the rest")
    ] = False,
    device: DeviceOption = None,
    data_dir: DataDirOption = None,
    resume: ResumeOption = False,
    export_to: ExportOption = None,
    imports: ImportOption = None,
    estimate: Annotated[
        bool,
        typer.Option(
            help="run nothing to the end: time a few rounds of each method at the table's "
            "scale and print the estimated wall time of the whole table on this machine"
        ),
    ] = False,
    status: Annotated[
        bool,
        typer.Option(
            help="train nothing: say which of the table's runs the store holds done (with "
            "their figures), running or stopped, and which have not started"
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            help="train the table's runs in this many processes at once (one thread each "
            "unless threads is set; output in the report folder's workers/ logs), then "
            "report as one process would"
        ),
    ] = 1,
    worker_claims: Annotated[
        Path | None, typer.Option(hidden=True, help="internal: a --workers worker's claims")
    ] = None,
) -> None:
    """Re-run a paper table: every method, same partitions, K seeds; report beside the
    published numbers with the ordering compared."""
    from .config import add_options, parse_set
    from .reproduce import reproduce as reproduce_table

    given = {"device": device, "data_dir": data_dir, "imports": import_first(imports)}
    extra = add_options(parse_set(set_ or []), given)
    add_options(extra, {"rounds": rounds})  # --set rounds=5 --rounds 3: an error, not a choice
    chosen = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    if estimate and status:
        raise FedshiftError("--estimate times the table and --status reads the store: pick one")
    if (estimate or status) and workers != 1:
        raise FedshiftError(
            "--workers shares out training runs; --estimate and --status train none"
        )
    if estimate:
        _estimate(table, seeds, rounds, quick, extra, chosen, json_)
        return
    if status:
        _status(table, db, seeds, first_seed, rounds, quick, extra, chosen, skip_missing, json_)
        return

    def run(**more) -> dict:
        return reproduce_table(
            table,
            seeds=seeds,
            rounds=rounds,
            quick=quick,
            db=db,
            skip_missing=skip_missing,
            extra=extra,
            progress=progress_bar,
            methods=chosen,
            first_seed=first_seed,
            export_to=export_to,
            **more,
        )

    if worker_claims is not None:  # one of --workers' processes: its share, no report
        from .table_workers import as_worker

        as_worker()
        run(resume=resume, claims=worker_claims)
        return
    if workers != 1:
        from .table_workers import common_args, run_workers
        from .tables import load_table

        args = [table] + (["--first-seed", str(first_seed)] if first_seed is not None else [])
        args += ["--seeds", str(seeds)] if seeds is not None else []
        args += ["--rounds", str(rounds)] if rounds is not None else []
        args += ["--quick"] if quick else []
        args += ["--skip-missing"] if skip_missing else []
        args += ["--methods", methods] if methods else []
        given = {"device": device, "data_dir": data_dir, "export_to": export_to}
        args += common_args(
            workers, db=db, sets=set_ or [], threads_given="threads" in extra, resume=resume,
            imports=imports, **given,
        )  # fmt: skip
        folder = out_dir if out_dir is not None else Path("reproduce") / load_table(table).id
        run_workers("reproduce", args, workers, folder / "workers", say)
        resume = True  # every run is in the store now (the newest of its config): reused
    else:
        _hint_workers(
            table, db, seeds, first_seed, rounds, quick, extra, chosen, skip_missing, resume
        )
    result = run(out_dir=out_dir, resume=resume)
    metrics = list(result["comparison"])
    rows = Table(title=f"{result['table']}: published / ours (accuracy %)")
    rows.add_column("method")
    for m in metrics:
        rows.add_column(m, justify="right")
    for r in result["methods"]:
        cells = []
        for m in metrics:
            pub, ours, sd = r["published"].get(m), r["ours"][m], r["ours_std"][m]
            spread = "" if sd is None else f" ± {fmt(sd)}"
            cells.append(f"{fmt(pub)} / {fmt(ours)}{spread}")
        rows.add_row(escape(r["name"]) + (" †degenerate" if r["degenerate"] else ""), *cells)
    (err if json_ else out).print(rows)
    for m, c in result["comparison"].items():
        rho = "—" if c["spearman"] is None else f"{c['spearman']:.2f}"
        err.print(
            f"{m}: Spearman {rho} (non-degenerate methods); published gaps held beyond seed "
            f"noise {c['gaps_held']}/{len(c['gaps'])}"
        )
    err.print(f"report written to {escape(str(result['report']))}")
    if json_:
        print_json(result)


def _estimate(table, seeds, rounds, quick, extra, methods, json_) -> None:
    """``reproduce --estimate``: the table's wall time, measured method by method."""
    from .budget import estimate

    result = estimate(
        table,
        seeds=seeds,
        rounds=rounds,
        quick=quick,
        extra=extra,
        methods=methods,
        progress=lambda name: err.print(f"timing {escape(name)} …", highlight=False),
    )
    rows = Table(title=f"{result['table']}: estimated wall time on this machine")
    for col in ("method", "s/round", "first round s", "eval s", "rounds", "runs", "hours"):
        rows.add_column(col, justify="left" if col == "method" else "right")
    for m in result["methods"]:
        rows.add_row(
            escape(m["method"]),
            f"{m['round_s']:.2f}",
            f"{m['first_round_s']:.1f}",
            f"{m['eval_s']:.1f}",
            str(m["rounds"]),
            str(m["runs"]),
            f"{m['total_s'] / 3600:.2f}",
        )
    rows.add_row("total", "", "", "", "", "", f"{result['total_h']:.2f}")
    (err if json_ else out).print(rows)
    if result["skipped"]:
        err.print(f"not timed (algorithm not registered): {escape(', '.join(result['skipped']))}")
    if json_:
        print_json(result)


def _hint_workers(table, db, seeds, first_seed, rounds, quick, extra, methods, skip, resume):
    """A table run in one process on a CPU with spare cores: say that --workers exists."""
    from .reproduce import planned_runs
    from .table_workers import hint_workers

    def configs() -> list:
        plan = dict(seeds=seeds, rounds=rounds, quick=quick, extra=extra, skip_missing=skip)
        return [r.config for r in planned_runs(table, methods, first_seed, **plan)[2]]

    hint_workers(configs, db, resume, say)


def _status(table, db, seeds, first_seed, rounds, quick, extra, methods, skip, json_) -> None:
    """``reproduce --status``: the table's runs in the store, run by run."""
    from .table_status import table_status

    result = table_status(
        table,
        db=db,
        seeds=seeds,
        first_seed=first_seed,
        rounds=rounds,
        quick=quick,
        extra=extra,
        methods=methods,
        skip_missing=skip,
    )
    rows = Table(title=f"{result['table']}: runs in {escape(result['db'])}")
    rows.add_column("method")
    rows.add_column("seed", justify="right")
    sweep = result["sweep_key"]
    if sweep:
        rows.add_column(escape(sweep.rsplit(".", 1)[-1]), justify="right")
    rows.add_column("state")
    rows.add_column("rounds", justify="right")
    for m in result["metrics"]:
        rows.add_column(m, justify="right")
    rows.add_column("hours", justify="right")
    rows.add_column("run")
    for r in result["runs"]:
        state = r["state"] + (" †degenerate" if r["degenerate"] else "")
        cells = [escape(r["method"]), str(r["seed"])]
        cells += [escape(str(r.get("value")))] if sweep else []
        cells += [state, f"{r['rounds_done']}/{r['rounds']}"]
        cells += [
            fmt(r["metrics"].get(m)) if r["state"] == "done" else "" for m in result["metrics"]
        ]
        hours = f"{r['time_s'] / 3600:.2f}" if r["time_s"] else ""
        if r["state"] != "done" and r.get("elapsed_s"):  # so far: its logged rounds
            hours = f"{r['elapsed_s'] / 3600:.2f}+"
        cells += [hours, r["run_id"] or ""]
        rows.add_row(*cells)
    (err if json_ else out).print(rows)
    if any(m["done"] for m in result["so_far"]):
        (err if json_ else out).print(_so_far_table(result))
    counts = ", ".join(f"{n} {state}" for state, n in result["counts"].items())
    unpaced = ", ".join(result["unpaced"])
    left = f"about {result['left_s'] / 3600:.1f} h of one process left at the finished runs' pace"
    if result.get("paced_by_rounds"):
        paced = ", ".join(result["paced_by_rounds"])
        left += f" ({paced}: at the median logged round of runs not yet finished)"
    if result["unpaced"]:
        left = (
            f"{left}, plus {unpaced} (no finished run to pace them)"
            if result["left_s"]
            else f"no finished run yet to pace {unpaced}"
        )
    err.print(
        f"{result['total']} runs: {counts}; {left}",
        highlight=False,
        soft_wrap=True,
    )
    if json_:
        print_json(result)


def _so_far_table(result: dict) -> Table:
    """Each method's finished seeds: mean ± std of every metric beside the published
    figure, and how many of its seeds they are (interim, not a verdict)."""
    rows = Table(title="finished seeds so far (mean ± std; published in brackets)")
    rows.add_column("method")
    sweep = result["sweep_key"]
    if sweep:
        rows.add_column(escape(sweep.rsplit(".", 1)[-1]), justify="right")
    rows.add_column("seeds", justify="right")
    for m in result["metrics"]:
        rows.add_column(m, justify="right")
    for entry in result["so_far"]:
        if not entry["done"]:
            continue
        name = escape(entry["method"]) + (" †degenerate" if entry["degenerate"] else "")
        cells = [name] + ([escape(str(entry.get("value")))] if sweep else [])
        cells.append(f"{entry['done']}/{entry['planned']}")
        for m in result["metrics"]:
            got, published = entry[m], entry["published"].get(m)
            text = fmt(got["mean"]) + (f" ± {fmt(got['std'])}" if got["std"] is not None else "")
            cells.append(text + (f" ({fmt(published)})" if published is not None else ""))
        rows.add_row(*cells)
    return rows
