"""The run store's commands: ``runs``, ``show``, ``rescore``, ``export`` and ``import``
(registered on the ``fedshift`` app by ``cli.py``, in the help's order)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from .cli_errors import user_errors
from .cli_options import DataDirOption, DbOption, JsonOption
from .cli_output import err, fmt, out, print_json, summary_table
from .errors import FedshiftError
from .results.store import DEFAULT_DB

RUN_ID_WIDTH = 10  # the store's ids: 10 hex digits, shown whole so they can be copied


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
