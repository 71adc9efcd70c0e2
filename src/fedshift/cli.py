"""The ``fedshift`` command. Its command names, options and JSON keys are a contract that
scripts rely on (checked by ``shared/tools/contract-smoke``): keep them stable."""

from __future__ import annotations

import errno
import functools
import sqlite3
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from .cli_once import OnceCommand
from .cli_options import (  # noqa: F401  (fedshift.cli names)
    DataDirOption,
    DbOption,
    DeviceOption,
    ExportOption,
    ImportOption,
    JsonOption,
    MethodOption,
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
    summary_table,
)
from .errors import Diverged, FedshiftError, RunStopped
from .flower.cli import app as flower_app
from .results.store import DEFAULT_DB, lock_error

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
RUN_ID_WIDTH = 10  # the store's ids: 10 hex digits, shown whole so they can be copied


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


def user_errors(fn):
    """Bad input → one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Diverged as e:
            hint = f" ({e.hint})" if e.hint else ""
            err.print(
                f"[red]diverged:[/red] {escape(f'{e}{hint}')}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(3) from None
        except FedshiftError as e:
            err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except RunStopped as e:
            hint = getattr(e, "hint", "")
            err.print(
                f"stopped after round {e.rounds_done}; a checkpoint was written; {escape(hint)}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(130) from None
        except KeyboardInterrupt:
            err.print("interrupted; the run store keeps the rounds finished so far")
            raise typer.Exit(130) from None
        except sqlite3.DatabaseError as e:  # damaged, locked or read-only store
            err.print(f"[red]error:[/red] {store_sentence(e)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except OSError as e:
            if e.filename is None:  # not about a path the user gave: a real fault
                raise
            err.print(f"[red]error:[/red] {path_sentence(e)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def store_sentence(e: sqlite3.DatabaseError) -> str:
    """What is wrong with a run store SQLite could not use, and what to do (markup-safe)."""
    text = str(e)
    if lock_error(e):
        return (
            "the run store is locked by another process (waited 30 s); try again when it has "
            "finished, or give another --db"
        )
    if "readonly" in text:
        return "the run store is read-only here; give a --db you can write to"
    return (
        f"the run store cannot be read: {escape(text)}; restore it from a copy or give another --db"
    )


def path_sentence(e: OSError) -> str:
    """An OSError about a user's path (too long, below a file, read-only, full) as one
    sentence naming the path (markup-safe)."""
    name = str(e.filename)
    shown = escape(repr(name if len(name) <= 60 else f"{name[:40]}…{name[-15:]}"))
    if e.errno == errno.ENAMETOOLONG:
        return (
            f"file name too long: {shown} ({len(name)} characters); the file system allows "
            "255 bytes per name"
        )
    return f"cannot use {shown}: {escape(e.strerror or str(e))}"


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
    or TOML file, or one method of a paper table (``TABLE --method NAME``)."""
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
    source: Annotated[str | None, typer.Argument(help="preset name or TOML file")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="fixed config key: key=value")
    ] = None,
    grid: Annotated[
        list[str] | None, typer.Option("--grid", "-g", help="swept key: key=v1,v2,… (repeatable)")
    ] = None,
    seeds: Annotated[str, typer.Option(help="seeds per grid point, e.g. 0,1,2")] = "0",
    rounds: RoundsOption = None,
    db: DbOption = DEFAULT_DB,
    json_: JsonOption = False,
    device: DeviceOption = None,
    data_dir: DataDirOption = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="reuse the store's finished runs of the same configuration and continue "
            "its stopped ones from their checkpoints (a long sweep across sessions)"
        ),
    ] = False,
    export_to: ExportOption = None,
    imports: ImportOption = None,
) -> None:
    """Grid × seeds; selects the grid point by validation accuracy, reports its test metrics."""
    from .config import add_options, parse_seeds, parse_set
    from .sweep import parse_grid, run_sweep

    given = {"rounds": rounds, "device": device, "data_dir": data_dir}
    overrides = add_options(parse_set(set_ or []), {**given, "imports": import_first(imports)})
    result = run_sweep(
        source,
        overrides,
        parse_grid(grid or []),
        parse_seeds(seeds),
        db,
        progress_bar,
        resume,
        export_to=export_to,
    )
    console = err if json_ else out
    table = Table(
        title=f"sweep: {result['algorithm']} on {result['scenario']}, seeds "
        f"{result['seeds']} (mean ± std; selected by validation accuracy)"
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
            "† degenerate (a constant predictor, or loss at chance level): never selected"
            + (every if result["all_degenerate"] else "")
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


def _resumable(db: Path, run: dict) -> bool:
    """Whether ``--resume`` can continue (or repair) a run: unfinished, or done without
    final metrics, with a checkpoint; a run id of a foreign format names no checkpoint."""
    from .results.store import RUN_ID, checkpoint_path

    unfinished = run["status"] != "done" or not run["metrics"]
    if not unfinished or not RUN_ID.fullmatch(str(run["run_id"])):
        return False
    return checkpoint_path(db, run["run_id"]).exists()


RUNS_FIXED = ("run_id", "status", "algorithm", "scenario", "seed", "rounds")
MAX_VARYING = 6  # more varying keys than this go to the caption (narrow with --where)


@app.command(cls=OnceCommand)
@user_errors
def runs(
    db: DbOption = DEFAULT_DB,
    where: Annotated[
        list[str] | None,
        typer.Option(
            help="keep runs whose config key (or status) has this value: key=value (repeatable)"
        ),
    ] = None,
    prune: Annotated[
        bool,
        typer.Option(
            help="delete the checkpoints of the listed runs that are done (never of interrupted,"
            " failed or running ones)"
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option(help="with --prune: name the checkpoints, delete nothing")
    ] = False,
    group: Annotated[
        str | None,
        typer.Option(
            help="keep the runs one command started together: a group id or its prefix "
            "(seeds-…, sweep-…, table-…; shown in the group column and the commands' --json)"
        ),
    ] = None,
    sweep: Annotated[
        str | None, typer.Option(help="keep one sweep's runs: its id, with or without sweep-")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="print one JSON line")] = False,
) -> None:
    """List the runs recorded in the run store, with the config keys that tell them apart."""
    from .results.select import matches, parse_where, varying_keys
    from .results.store import RunStore

    if not db.exists():
        raise FedshiftError(f"no run store at {str(db)!r}; run `fedshift run` first or pass --db")
    if dry_run and not prune:
        raise FedshiftError("--dry-run goes with --prune (it shows what --prune would delete)")
    if group and sweep:
        raise FedshiftError("give --group or --sweep, not both (a sweep is a group)")
    if sweep:
        group = sweep if sweep.startswith("sweep-") else f"sweep-{sweep}"
    stored = RunStore(db).runs()
    conditions = parse_where(where or [], stored)
    selected = [r for r in stored if matches(r, conditions)]
    if group:
        selected = [r for r in selected if (r["group"] or "").startswith(group)]
    if prune:
        return _prune(db, selected, dry_run, json_)
    rows = [
        {
            "run_id": r["run_id"],
            "status": r["status"],
            "algorithm": r["algorithm"],
            "scenario": r["scenario"],
            "seed": r["seed"],
            "rounds": r["rounds"],
            "rounds_done": r["rounds_done"],
            "resumable": _resumable(db, r),
            "created": r["created"],
            "metrics": {
                k: (r["metrics"] or {}).get(k)
                for k in ("worst", "average", "worst_client", "degenerate")
            },
            "config": r["config"],
            "group": r["group"],
        }
        for r in selected
    ]
    if json_:
        print_json(rows)
        return
    varying = varying_keys(selected, skip=RUNS_FIXED)
    shown = varying[:MAX_VARYING]
    # every cell, header and the title carry user text (paths, keys, values): escaped,
    # so "[/red]" in a --set value prints as written instead of raising a markup error
    title = escape(f"runs in {db}" + (f" where {', '.join(where or [])}" if where else ""))
    table = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    table.add_column("run_id", no_wrap=True, min_width=RUN_ID_WIDTH)  # never cut: it is copied
    for c in RUNS_FIXED[1:]:
        table.add_column(c)
    grouped = any(r["group"] for r in rows)
    if grouped:
        table.add_column("group", no_wrap=True)
    for k in shown:
        table.add_column(escape(k))
    for c in ("worst", "average"):
        table.add_column(c)
    for r in rows:
        config = r["config"] or {}
        table.add_row(
            r["run_id"],
            r["status"],
            escape(str(r["algorithm"])),
            escape(str(r["scenario"])),
            str(r["seed"]),
            f"{r['rounds_done']}/{r['rounds']}",
            *([r["group"] or "—"] if grouped else []),
            *[escape(str(config[k])) if k in config else "—" for k in shown],
            fmt(r["metrics"]["worst"]) + (" †" if r["metrics"]["degenerate"] else ""),
            fmt(r["metrics"]["average"]),
        )
    notes = []
    if len(varying) > len(shown):
        also = escape(", ".join(varying[len(shown) :]))
        notes.append(f"also varying: {also} (narrow with --where)")
    if any(r["metrics"]["degenerate"] for r in rows):
        notes.append("† degenerate: its accuracies are no result (fedshift show RUN_ID says why)")
    if notes:
        table.caption = "\n".join(notes)
    if not rows:
        table.caption = "no run matches" if where or group else "the store holds no runs"
    out.print(table)


def _prune(db: Path, runs: list[dict], dry_run: bool, json_: bool) -> None:
    from .results.prune import prune

    pruned = prune(db, runs, dry_run)
    total = sum(size for _, _, size in pruned)
    verb = "would delete" if dry_run else "deleted"
    for run_id, path, size in pruned:
        err.print(f"{verb} {path} ({size / 1e6:.1f} MB, run {run_id})", highlight=False)
    (err if json_ else out).print(
        f"{verb} {len(pruned)} checkpoint(s) of finished runs, {total / 1e6:.1f} MB",
        highlight=False,
    )
    if json_:
        files = [{"run_id": r, "path": str(p), "bytes": n} for r, p, n in pruned]
        print_json({"dry_run": dry_run, "checkpoints": files, "bytes": total})


@app.command(cls=OnceCommand)
@user_errors
def show(
    run_id: Annotated[str, typer.Argument(help="a run id or a unique prefix of one")],
    db: DbOption = DEFAULT_DB,
    all_rounds: Annotated[
        bool, typer.Option(help="every stored round, not only the evaluated ones")
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="print everything stored about the run as one JSON line")
    ] = False,
) -> None:
    """One run in full: status, every config key, final accuracies and the training curve."""
    from .results.show import config_table, curve_table, header
    from .results.store import RunStore

    if not db.exists():
        raise FedshiftError(f"no run store at {str(db)!r}; pass the --db the run was recorded in")
    record = RunStore(db).run(run_id)
    record["resumable"] = _resumable(db, record)
    if json_:
        print_json(record)
        return
    out.print(header(record), highlight=False, soft_wrap=True)
    out.print(config_table(record))
    if record["metrics"]:
        out.print(summary_table("final accuracy %", [(record["algorithm"], record["metrics"])]))
    else:
        out.print(f"no final metrics ({record['status']}); resumable: {record['resumable']}")
    out.print(curve_table(record, all_rounds))


@app.command(cls=OnceCommand)
@user_errors
def rescore(
    run_ids: Annotated[list[str], typer.Argument(help="finished run ids (or unique prefixes)")],
    db: DbOption = DEFAULT_DB,
    data_dir: DataDirOption = None,
    json_: JsonOption = False,
) -> None:
    """Re-evaluate finished runs from their final checkpoints under the current degeneracy
    rules and store the new metrics (only where the stored accuracies are reproduced)."""
    from .rescore import rescore as rescore_runs

    if not db.exists():
        raise FedshiftError(f"no run store at {str(db)!r}; pass the --db the runs were recorded in")
    rows = rescore_runs(db, run_ids, data_dir)
    if json_:
        print_json({"rescored": rows})
        return
    for r in rows:
        verdict = "degenerate" if r["degenerate"] else "not degenerate"
        was = " (was not)" if r["degenerate"] and not r["degenerate_before"] else ""
        why = f": {r['degenerate_why']}" if r["degenerate"] else ""
        out.print(f"{r['run_id']}  {r['algorithm']}  {verdict}{was}{why}", highlight=False)


@app.command("export", cls=OnceCommand)
@user_errors
def export_(
    run_ids: Annotated[
        list[str] | None, typer.Argument(help="finished run ids (or unique prefixes)")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="folder for the run files")] = Path(
        "exported-runs"
    ),
    group: Annotated[
        str | None,
        typer.Option(help="also every finished or diverged run of this group (id or prefix)"),
    ] = None,
    db: DbOption = DEFAULT_DB,
    json_: JsonOption = False,
) -> None:
    """Write finished runs as files (one JSON each: config, rounds, per-client accuracies;
    no checkpoint) to keep, commit or share; `fedshift import` reads them back."""
    from .results.archive import EXPORTABLE, export_runs
    from .results.store import RunStore

    if not db.exists():
        raise FedshiftError(f"no run store at {str(db)!r}; pass the --db the runs were recorded in")
    refs = list(run_ids or [])
    if group:
        found = [r for r in RunStore(db).runs() if (r["group"] or "").startswith(group)]
        if not found:
            raise FedshiftError(f"no run of group {group!r} in {str(db)!r} (see `fedshift runs`)")
        kept = [r["run_id"] for r in found if r["status"] in EXPORTABLE and r["metrics"]]
        if len(kept) < len(found):
            err.print(
                f"group {escape(group)}: {len(found) - len(kept)} unfinished run(s) not exported",
                highlight=False,
            )
        refs += [r for r in kept if r not in refs]
    if not refs:
        raise FedshiftError("name the runs to export: run ids, or --group")
    paths = export_runs(db, refs, out_dir)
    if json_:
        print_json({"exported": [str(p) for p in paths]})
        return
    err.print(f"wrote {len(paths)} run file(s) to {escape(str(out_dir))}", highlight=False)


@app.command("import", cls=OnceCommand)
@user_errors
def import_(
    files: Annotated[
        list[Path], typer.Argument(help="run files written by `fedshift export`, or folders")
    ],
    db: DbOption = DEFAULT_DB,
    json_: JsonOption = False,
) -> None:
    """Put exported runs into a run store, where report, compare, show and `--resume` (of
    reproduce and sweep) find them as if they had run there."""
    from .results.archive import import_runs

    rows = import_runs(db, files)
    if json_:
        print_json({"imported": rows})
        return
    for r in rows:
        out.print(f"{r['run_id']}  {r['algorithm']}  {r['action']}", highlight=False)


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


@app.command(cls=OnceCommand)
@user_errors
def reproduce(
    table: Annotated[str, typer.Argument(help="table id (fedshift list presets) or TOML file")],
    seeds: Annotated[
        int | None, typer.Option(help="seeds per method (default: the table's)")
    ] = None,
    first_seed: Annotated[
        int,
        typer.Option(
            help="run seeds first-seed … first-seed + seeds − 1 (fresh seeds after a selection)"
        ),
    ] = 0,
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
    resume: Annotated[
        bool,
        typer.Option(
            help="reuse the store's finished runs of the same configuration and continue "
            "its stopped ones from their checkpoints (a long table across sessions)"
        ),
    ] = False,
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
    if estimate:
        _estimate(table, seeds, rounds, quick, extra, chosen, json_)
        return
    if status:
        _status(table, db, seeds, first_seed, rounds, quick, extra, chosen, skip_missing, json_)
        return

    result = reproduce_table(
        table,
        seeds=seeds,
        rounds=rounds,
        quick=quick,
        out_dir=out_dir,
        db=db,
        skip_missing=skip_missing,
        extra=extra,
        progress=progress_bar,
        methods=chosen,
        resume=resume,
        first_seed=first_seed,
        export_to=export_to,
    )
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
        cells += [f"{r['time_s'] / 3600:.2f}" if r["time_s"] else "", r["run_id"] or ""]
        rows.add_row(*cells)
    (err if json_ else out).print(rows)
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
