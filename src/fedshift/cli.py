"""The ``fedshift`` command. Its command names, options and JSON keys are a contract that
scripts rely on (checked by ``shared/tools/contract-smoke``): keep them stable."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .cli_errors import user_errors
from .cli_once import OnceCommand
from .cli_options import (  # noqa: F401  (fedshift.cli names)
    DataDirOption,
    DbOption,
    DeviceOption,
    ExportOption,
    ImportOption,
    JsonOption,
    MethodOption,
    ResumeOption,
    RoundsOption,
    SeedOption,
    SeedsOption,
    SetOption,
    SourceArgument,
    import_first,
)
from .cli_output import (  # noqa: F401
    err,
    fmt,
    out,
    print_json,
    print_run_summary,
    progress_bar,
    say,
    summary_table,
)
from .cli_reproduce import reproduce
from .cli_store import export_, import_, rescore, runs, show
from .errors import FedshiftError, FedshiftWarning
from .flower.cli import app as flower_app
from .results.store import DEFAULT_DB

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Federated learning under distribution shift: personalized, invariant and "
    "shortcut-removing methods on one batched-cohort engine.",
)
app.add_typer(flower_app, name="flower")  # fedshift flower run … (Flower imported when run)
data_app = typer.Typer(no_args_is_help=True, help="Prepare dataset folders from raw files.")
app.add_typer(data_app, name="data")  # fedshift data build-waterbirds …


def _print_version(value: bool) -> None:
    if value:
        from ._version import __version__

        out.print(f"fedshift {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Options of ``fedshift`` itself (before the command)."""


@app.command(cls=OnceCommand)
@user_errors
def run(
    source: SourceArgument = None,
    method: MethodOption = None,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    seed: SeedOption = None,
    seeds: SeedsOption = None,
    cohort_size: Annotated[
        int | None, typer.Option(help="clients trained together in one batch (0 = all)")
    ] = None,
    db: DbOption = DEFAULT_DB,
    json_: JsonOption = False,
    device: DeviceOption = None,
    data_dir: DataDirOption = None,
    threads: Annotated[
        int | None,
        typer.Option(help="intra-op threads (default: the cores; 1 on a busy shared machine)"),
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option(help="continue an interrupted run (RUN_ID or a unique prefix of it)"),
    ] = None,
    imports: ImportOption = None,
) -> None:
    """Run one experiment (or one per seed) and record it in the run store: a run preset
    or TOML file, or one method of a paper table (`TABLE --method NAME`)."""
    from .config import add_options, command_configs, parse_set
    from .tables import table_row

    specs = import_first(imports)  # with --resume: besides the run's recorded imports
    if resume is not None:
        given = [source, method, seed, seeds, cohort_size, device]
        if any(v for v in given if v is not None):
            raise FedshiftError(
                "--resume continues a run with its recorded config; give only --db, --json, "
                "--data-dir, and --set / --rounds for the keys a resume may change"
            )
        changes = add_options(parse_set(set_ or []), {"rounds": rounds, "threads": threads})
        return _resume(resume, db, json_, data_dir, changes)
    row = table_row(source, method)  # a paper table's method, else None
    configs = command_configs(
        source,
        set_,
        {
            "rounds": rounds,
            "seed": seed,
            "cohort_size": cohort_size,
            "device": device,
            "data_dir": data_dir,
            "threads": threads,
            "imports": specs,
        },
        seeds,
        build=row.config if row else None,
    )
    from .jobs import Job, run_jobs
    from .results.store import new_group

    group = new_group("seeds") if len(configs) > 1 else None  # the seeds, stored together
    what = f"{row.method.name} of {row.table.id}" if row else None
    jobs = [
        Job(
            cfg,
            f"{what or cfg.algorithm} on {cfg.scenario} (seed {cfg.seed})",
            functools.partial(row.data, cfg) if row else None,  # a table's fixed partition, if any
        )
        for cfg in configs
    ]
    done = [f.summary for f in run_jobs(jobs, db=db, group=group, progress=progress_bar)]
    name = f"{row.method.name} ({row.table.id})" if row else None
    print_run_summary(done, db, json_, name=name, group=group)


@app.command(cls=OnceCommand)
@user_errors
def sweep(
    source: SourceArgument = None,
    method: MethodOption = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="fixed config key: key=value")
    ] = None,
    grid: Annotated[
        list[str] | None, typer.Option("--grid", "-g", help="swept key: key=v1,v2,… (repeatable)")
    ] = None,
    seeds: Annotated[str, typer.Option(help="seeds per grid point, e.g. 0,1,2")] = "0",
    folds: Annotated[
        str | None,
        typer.Option(
            help="a leave-one-domain-out table's folds, key=v1,v2,… (e.g. "
            "scenario.held_out=0,15,30): every point runs each, scored per seed by their mean"
        ),
    ] = None,
    rounds: RoundsOption = None,
    db: DbOption = DEFAULT_DB,
    json_: JsonOption = False,
    device: DeviceOption = None,
    data_dir: DataDirOption = None,
    resume: ResumeOption = False,
    export_to: ExportOption = None,
    imports: ImportOption = None,
    workers: Annotated[
        int,
        typer.Option(
            help="train the runs in this many processes at once (one thread each unless "
            "threads is set; output in STORE-workers/ logs), then summarise as one process"
        ),
    ] = 1,
    worker_claims: Annotated[
        Path | None, typer.Option(hidden=True, help="internal: a --workers worker's claims")
    ] = None,
) -> None:
    """Grid × seeds; selects the grid point by validation accuracy, reports its test
    metrics. SOURCE: a run preset or TOML file, or a paper table's method (`TABLE --method
    NAME`: every run takes that row's settings, and a table run once per fold is swept over
    its folds)."""
    from .config import add_options, parse_seeds, parse_set, resolve
    from .sweep import fold_overrides, grid_points, parse_grid, run_sweep
    from .tables import table_row

    given = {"rounds": rounds, "device": device, "data_dir": data_dir}
    overrides = add_options(parse_set(set_ or []), {**given, "imports": import_first(imports)})
    row = table_row(source, method)  # a paper table's method, else None

    fold_values = parse_grid([folds]) if folds else {}  # bad input: one sentence, first
    if row is not None and not folds and row.table.sweep_key not in (None, *overrides):
        fold_values = {row.table.sweep_key: list(row.table.sweep_values)}  # as reproduce's

    def build(values: dict):
        return row.config(values) if row is not None else resolve(source, values)

    def run(resume: bool, claims: Path | None = None) -> dict:
        points, seed_list = parse_grid(grid or []), parse_seeds(seeds)
        return run_sweep(
            source, overrides, points, seed_list, db, progress_bar, resume, export_to, claims,
            folds=fold_values, row=row,
        )  # fmt: skip

    if worker_claims is not None:  # one of --workers' processes: its share, no summary
        from .table_workers import as_worker

        as_worker()
        run(resume, worker_claims)
        return
    if workers != 1:
        from .table_workers import common_args, run_workers

        parse_grid(grid or [])  # bad input: one sentence here, not N workers' logs
        args = [source] if source else []
        args += ["--seeds", seeds] + (["--rounds", str(rounds)] if rounds is not None else [])
        for item in grid or []:
            args += ["--grid", item]
        args += ["--folds", folds] if folds else []
        args += ["--method", method] if method else []
        given = {"device": device, "data_dir": data_dir, "export_to": export_to}
        threads_given = build({**overrides, **fold_overrides(fold_values, {})[0]}).threads != 0
        args += common_args(
            workers, db=db, sets=set_ or [], threads_given=threads_given, resume=resume,
            imports=imports, **given,
        )  # fmt: skip
        run_workers("sweep", args, workers, Path(f"{Path(db).with_suffix('')}-workers"), say)
        resume = True  # every run is in the store now (the newest of its config): reused
    else:
        from .table_workers import hint_workers

        def configs() -> list:
            points = grid_points(parse_grid(grid or [])) if grid else [{}]
            in_folds = fold_overrides(fold_values, parse_grid(grid or []))
            each = [
                {**overrides, **p, **f, "seed": s}
                for p in points
                for s in parse_seeds(seeds)
                for f in in_folds
            ]
            return [build(values) for values in each]

        hint_workers(configs, db, resume, say)
    result = run(resume)
    console = err if json_ else out
    table = Table(
        title=f"sweep: {result['algorithm']} on {result['scenario']}, seeds "
        f"{result['seeds']}"
        + "".join(f", mean over {k} = {', '.join(v)}" for k, v in result["folds"].items())
        + " (mean ± std; selected by validation accuracy)"
    )
    for col in ("", "grid point", "val", "worst", "average"):
        table.add_column(col)
    for i, p in enumerate(result["points"]):
        m, s = p["metrics"], p["metrics_std"]
        name = escape(", ".join(f"{k}={v}" for k, v in p["params"].items()) or "—")
        if p["diverged"]:
            table.add_row("", name + " ‡", "diverged", "—", "—")
            continue
        table.add_row(
            "*" if i == result["selected"] else "",
            name + (" †" if m.get("degenerate") else ""),
            f"{fmt(p['val'])} ± {fmt(p['val_std'])}",
            f"{fmt(m['worst'])} ± {fmt(s['worst'])}",
            f"{fmt(m['average'])} ± {fmt(s['average'])}",
        )
    console.print(table)
    for p in result["points"]:
        if p["diverged"]:
            where = ", ".join(f"{k}={v}" for k, v in p["params"].items()) or "—"
            console.print(escape(f"‡ {where}: {p['diverged']} (never selected)"), soft_wrap=True)
    if any(p["metrics"].get("degenerate") for p in result["points"]):
        every = "; every point is degenerate, so the best one is shown"
        console.print(
            "† degenerate (one class everywhere, loss at chance, a fit to its own training "
            "rows near or under the majority share, or blown-up logits): never selected"
            + (every if result["all_degenerate"] else "")
        )
    if result.get("scale"):

        def shown(v: object) -> str:
            return "default" if v is None else str(v)

        changed = ", ".join(
            f"{k} {shown(v['sweep'])} (table: {shown(v['table'])})"
            for k, v in result["scale"].items()
        )
        console.print(
            escape(
                f"this sweep selects at another scale than table {result['table']['id']} runs "
                f"({changed}): its choice may not hold at the table's scale; check the leading "
                "points there on the selection seeds (docs/reproduce.md)"
            ),
            soft_wrap=True,
        )
    chosen = ", ".join(f"{k}={v}" for k, v in result["selected_params"].items()) or "—"
    console.print(
        summary_table(
            f"selected {escape(chosen)} — test accuracy %",
            [(result["algorithm"], result["metrics"])],
            std=[result["metrics_std"]],
        )
    )
    err.print(f"{len(result['run_ids'])} runs recorded in {escape(str(db))}")
    if json_:
        print_json(result)


def _resume(
    run_id: str, db: Path, json_: bool, data_dir: str | None, changes: dict[str, str]
) -> None:
    from .api import resume
    from .results.store import RunStore, check_run_id

    check_run_id(run_id, prefix=True)
    if not db.exists():
        raise FedshiftError(f"no run store at {str(db)!r}; pass the --db the run was recorded in")
    record = RunStore(db).run(run_id)  # a unique prefix names the run too
    run_id, total = check_run_id(record["run_id"]), record["rounds"]
    if str(changes.get("rounds", "")).isdigit():  # the bar's end (resume checks the value)
        total = int(changes["rounds"])
    progress, on_round = progress_bar(total, f"resuming {run_id}")
    try:
        outcome = resume(
            run_id, db, on_round=on_round, data_dir=data_dir, overrides=changes, progress=False
        )
    finally:
        progress.stop()
    summary = outcome.summary()
    title = f"run {run_id} (resumed) — accuracy % (seed {summary['seed']})"
    (err if json_ else out).print(
        summary_table(title, [(summary["algorithm"], summary["metrics"])])
    )
    if json_:
        print_json(summary)


@app.command("list", cls=OnceCommand)
@user_errors
def list_(
    what: Annotated[str, typer.Argument(help="algorithms, scenarios, presets or models")],
    json_: Annotated[bool, typer.Option("--json", help="print one JSON line")] = False,
    imports: ImportOption = None,
) -> None:
    """List registered algorithms, scenarios, presets or models, with their options."""
    from .catalog import catalog

    import_first(imports)
    items = catalog(what)
    if json_:
        print_json(items)
        return
    if what == "presets":
        return _list_presets(items)
    table = Table(title=what)
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("options")
    for it in items:
        opts = ", ".join(f"{o['name']}={o['default']}" for o in it.get("options", []))
        table.add_row(it["name"], it.get("help", ""), opts)
    out.print(table)


def _list_presets(items: list[dict]) -> None:
    """Run presets, then paper tables (with their methods), told apart by a kind column."""
    kinds = {"preset": "run preset", "table": "paper table"}
    table = Table(
        title="presets",
        caption="run preset: fedshift run NAME. paper table: fedshift run NAME --method "
        "METHOD (one method, with the table's settings) or fedshift reproduce NAME (all)",
    )
    table.add_column("name", style="bold")
    table.add_column("kind")
    table.add_column("description")
    table.add_column("methods")
    shown = None
    for it in items:
        kind = it.get("kind", "preset")
        if shown is not None and kind != shown:
            table.add_section()
        shown = kind
        methods = ", ".join(it.get("methods", []))
        about = it.get("title", it["help"])  # a table's commands are in the caption
        table.add_row(escape(it["name"]), kinds.get(kind, kind), escape(about), escape(methods))
    out.print(table)


# the run store's commands (cli_store.py), where the help lists them
app.command(cls=OnceCommand)(runs)
app.command(cls=OnceCommand)(show)
app.command(cls=OnceCommand)(rescore)
app.command("export", cls=OnceCommand)(export_)
app.command("import", cls=OnceCommand)(import_)


@app.command(cls=OnceCommand)
@user_errors
def describe(
    what: Annotated[str, typer.Argument(help="scenario")],
    name: Annotated[str, typer.Argument(help="scenario name")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="scenario option: key=value")
    ] = None,
    seed: Annotated[int, typer.Option(help="scenario seed")] = 0,
    data_dir: DataDirOption = None,
    json_: Annotated[bool, typer.Option("--json", help="print one JSON line")] = False,
    imports: ImportOption = None,
) -> None:
    """Per-client sizes, classes and environments of a scenario."""
    from .config import parse_set
    from .data import build_scenario
    from .data.describe import describe as describe_data

    import_first(imports)
    if what != "scenario":
        raise FedshiftError(f"cannot describe {what!r}; use: fedshift describe scenario NAME")
    options = {k.removeprefix("scenario."): v for k, v in parse_set(set_ or []).items()}
    info = describe_data(build_scenario(name, options, seed, data_dir))
    if json_:
        print_json(info)
        return
    out.print(
        f"[bold]{info['name']}[/bold]: {info['clients']} clients, {info['num_classes']} classes, "
        f"input {tuple(info['input_shape'])}, model {info['default_model']}, participation "
        f"{info['participation']}; train envs {info['train_envs'] or '—'}; val {info['val_envs']}; "
        f"test {info['test_envs']}"
    )
    table = Table()
    for col in ("client", "train", "classes", "train envs", "val", "test (per env)"):
        table.add_column(col)
    for c in info["per_client"]:
        tests = sorted(set(c["test"].values()))
        table.add_row(
            str(c["client"]),
            str(c["train"]),
            ",".join(map(str, c["classes"])),
            ",".join(c["train_envs"]) or "—",
            str(sum(c["val"].values())),
            "/".join(map(str, tests)),
        )
    out.print(table)


@app.command(cls=OnceCommand)
@user_errors
def report(
    run_ids: Annotated[list[str], typer.Argument(help="one or more run ids (or unique prefixes)")],
    db: DbOption = DEFAULT_DB,
    out_dir: Annotated[Path, typer.Option("--out", help="report folder")] = Path("fedshift-report"),
    format_: Annotated[str, typer.Option("--format", help="md or html")] = "md",
    force: Annotated[
        bool, typer.Option(help="overwrite files in --out that fedshift did not write")
    ] = False,
) -> None:
    """Write a Markdown or HTML report with plots for past runs (from the run store)."""
    from .results.report import write_report
    from .results.store import RunStore

    if not db.exists():
        raise FedshiftError(f"no run store at {str(db)!r}; pass the --db the runs were recorded in")
    path = write_report(RunStore(db), run_ids, out_dir, format_, force=force)
    out.print(f"report written to {escape(str(path))}")


@app.command(cls=OnceCommand)
@user_errors
def compare(
    run_ids: Annotated[list[str], typer.Argument(help="two or more run ids (or unique prefixes)")],
    db: DbOption = DEFAULT_DB,
    out_dir: Annotated[Path, typer.Option("--out", help="where the plots go")] = Path(
        "fedshift-compare"
    ),
    force: Annotated[
        bool, typer.Option(help="overwrite plots in --out that fedshift did not write")
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="last stdout line: the compared runs as JSON")
    ] = False,
    csv: Annotated[
        Path | None, typer.Option(help="also write the table as CSV: one row per run")
    ] = None,
) -> None:
    """Several runs in one table (per test environment, worst, average) and plots: accuracy
    per test environment, and accuracy and training loss over rounds. Runs tested on
    different environments are plotted in separate panels; seeds of one configuration as
    their mean ± std."""
    from .results.frames import comparison_frame
    from .results.partial import partial_sentence
    from .results.plots import env_set_key, env_sets_note, seed_group_note
    from .results.report import COMPARE_FIGURES, claim_folder, load_runs, mark_written, run_label
    from .results.store import RunStore

    if not db.exists():
        raise FedshiftError(f"no run store at {str(db)!r}; pass the --db the runs were recorded in")
    if csv is not None and csv.is_dir():
        raise FedshiftError(f"--csv {str(csv)!r} is a folder; give a file path")
    runs = load_runs(RunStore(db), run_ids)
    names = [name for name, _ in COMPARE_FIGURES]
    claim_folder(out_dir, names, force)
    table = summary_table("accuracy %", [(run_label(r), r["metrics"]) for r in runs])
    partial = partial_sentence(runs)
    if partial:
        table.caption = f"{table.caption}\n{partial}" if table.caption else partial
    say = err if json_ else out
    say.print(table)
    for note in (env_sets_note(runs), seed_group_note(runs)):
        if note:
            say.print(f"note: {escape(note)}")
    plots = [str(fn(runs, out_dir / name)) for name, fn in COMPARE_FIGURES]
    plot = plots[0]
    for path in plots:
        say.print(f"plot written to {escape(path)}")
    mark_written(out_dir, names)
    if csv is not None:
        csv.parent.mkdir(parents=True, exist_ok=True)
        comparison_frame(runs).to_csv(csv, index=False)
        err.print(f"table written to {escape(str(csv))}")
    if json_:
        keys = ("run_id", "algorithm", "scenario", "seed", "status", "config", "metrics", "partial")
        rows = [{"label": run_label(r), **{k: r[k] for k in keys}} for r in runs]
        sets: dict[tuple, list[str]] = {}
        for r in runs:
            sets.setdefault(env_set_key(r), []).append(r["run_id"])
        print_json(
            {
                "runs": rows,
                "plot": plot,
                "csv": None if csv is None else str(csv),
                "plots": plots,
                "environment_sets": list(sets.values()),
            }
        )


@app.command(cls=OnceCommand)
@user_errors
def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="where the plot goes")] = Path(
        "fedshift-demo"
    ),
    db: DbOption = DEFAULT_DB,
    rounds: Annotated[int, typer.Option(help="rounds per method")] = 30,
    seed: Annotated[int, typer.Option(help="run seed")] = 0,
    scenario: Annotated[
        str,
        typer.Option(
            help="cmnist (Coloured MNIST from the data root) or digits-shortcut (bundled "
            "digits, no data root; does not show the invariant methods' point)"
        ),
    ] = "cmnist",
    data_dir: DataDirOption = None,
    force: Annotated[
        bool, typer.Option(help="overwrite a plot in --out that fedshift did not write")
    ] = False,
) -> None:
    """Offline demo: methods on data with a planted colour shortcut, table and plot."""
    from .demo import caveats, demo_spec, require_data, run_demo
    from .results.report import claim_folder, mark_written

    spec = demo_spec(scenario)
    require_data(spec, data_dir)  # one sentence, before the folder is claimed
    names = ["accuracy_per_env.png"]
    claim_folder(out_dir, names, force)  # before minutes of training, not after
    rows, plot = run_demo(
        out_dir, db, rounds, seed, progress=progress_bar, demo=spec, data_dir=data_dir
    )
    mark_written(out_dir, names)
    out.print(
        summary_table(f"{spec.scenario}: client-averaged test accuracy % per environment", rows)
    )
    out.print(spec.legend)
    for line in caveats(rows, spec):
        out.print(line)
    out.print(f"plot written to {escape(str(plot))}")


app.command(cls=OnceCommand)(reproduce)  # cli_reproduce.py


@data_app.command("build-waterbirds", cls=OnceCommand)
@user_errors
def build_waterbirds(
    cub: Annotated[
        Path, typer.Option(help="CUB_200_2011/ (or its parent); segmentations/ inside or beside")
    ],
    places: Annotated[
        Path, typer.Option(help="Places365 folder with data_large/<letter>/<category>/")
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="where the WaterBirds folder goes")],
    seed: Annotated[int, typer.Option(help="seed of the split, place and background draws")] = 0,
) -> None:
    """Composite CUB-200-2011 birds onto Places365 backgrounds into the released WaterBirds
    layout (waterbird_complete95_forest2water2/, Sagawa et al. 2020)."""
    from .data.waterbirds_build import build_waterbirds_folder, stderr_progress

    folder = build_waterbirds_folder(
        cub, places, out_dir, seed=seed, progress=stderr_progress("WaterBirds")
    )
    err.print(f"WaterBirds written to {escape(str(folder))}", highlight=False, soft_wrap=True)


@data_app.command("export-partition", cls=OnceCommand)
@user_errors
def export_partition(
    out_path: Annotated[Path, typer.Argument(help="the file to write: .json or .npz")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="scenario=NAME or scenario.OPTION=VALUE"),
    ] = None,
    seed: Annotated[int, typer.Option(help="the run seed whose partition to write")] = 0,
    data_dir: DataDirOption = None,
    json_: JsonOption = False,
    imports: ImportOption = None,
) -> None:
    """Write which images each client of a scenario holds (index lists, JSON or NPZ), for
    the from-partition scenario or another framework (docs/partitions.md)."""
    from .config import RunConfig, parse_set
    from .data import build_scenario
    from .data.partition_file import export_partition as export

    if out_path.suffix not in (".json", ".npz"):
        raise FedshiftError(f"{str(out_path)!r}: a partition file ends in .json or .npz")
    keys = parse_set(set_ or [])
    other = [k for k in keys if k != "scenario" and not k.startswith("scenario.")]
    if other:
        raise FedshiftError(
            f"export-partition takes scenario keys only (scenario=NAME, scenario.OPTION=VALUE), "
            f"not {other[0]!r}"
        )
    import_first(imports)
    name = keys.pop("scenario", RunConfig().scenario)
    options = {k.removeprefix("scenario."): v for k, v in keys.items()}
    data = build_scenario(name, options, seed, data_dir)
    path = export(data, out_path)
    part = data.partition
    sizes = {s: int(p.sizes().sum()) for s, p in part.splits.items()}
    counts = ", ".join(f"{s} {n}" for s, n in sizes.items())
    err.print(
        f"wrote the index lists of {part.num_clients} clients of {part.dataset} ({counts}) "
        f"to {escape(str(path))}",
        highlight=False,
        soft_wrap=True,
    )
    if json_:
        print_json(
            {
                "path": str(path),
                "scenario": name,
                "seed": seed,
                "dataset": part.dataset,
                "pool": part.pool,
                "clients": part.num_clients,
                "indices": sizes,
            }
        )


def main() -> None:
    show_warnings_as_lines()
    app()


def show_warnings_as_lines() -> None:
    """fedshift's own warnings (``FedshiftWarning``) as one ``warning:`` line on stderr,
    without Python's file, line number and source line; other warnings as Python shows them."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, FedshiftWarning):
            err.print(
                f"[yellow]warning:[/yellow] {escape(str(message))}", highlight=False, soft_wrap=True
            )
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


if __name__ == "__main__":
    main()
