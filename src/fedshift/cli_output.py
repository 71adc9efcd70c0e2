"""What the commands print: the two consoles, the accuracy table, the JSON summary line and
the progress line, shared by ``fedshift`` and ``fedshift flower`` (so neither imports the
other's command module)."""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Written to a file or a pipe (a log of a long table), rich would wrap every table at 80
# columns and cut run ids, methods and states to "…"; there a table takes the width it
# needs (up to LOG_WIDTH). A terminal, or COLUMNS when set, keeps its own width.
LOG_WIDTH = 200


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty())
    width = LOG_WIDTH if piped and "COLUMNS" not in os.environ else None
    # no ":name:" emoji codes: user text (keys, values, paths) is printed as written, and
    # markup in it is escaped (rich.markup.escape) wherever it is interpolated
    return Console(stderr=stderr, emoji=False, width=width)


err = _console(stderr=True)
out = _console(stderr=False)


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fmt(v) -> str:
    return "—" if v is None else f"{v:.1f}"


def summary_table(title: str, rows: list[tuple[str, dict]], std: list[dict] | None = None) -> Table:
    """Accuracy (%) per test environment, then worst, average and worst client; one column
    per run (environments are rows, so eleven of them still fit a terminal). With ``std``
    (one dict per column, same shape as the metrics) cells read ``mean ± std``."""
    envs = list(dict.fromkeys(e for _, m in rows for e in m["per_env"]))  # every run's
    table = Table(title=title)
    table.add_column("test environment")
    for name, m in rows:
        mark = " †" if m.get("degenerate") and "†" not in name else ""
        table.add_column(escape(name) + mark, justify="right")

    def cell(i: int, m: dict, get) -> str:
        if std is None:
            return fmt(get(m))
        return f"{fmt(get(m))} ± {fmt(get(std[i]))}"

    for e in envs:
        table.add_row(
            escape(e),
            *[cell(i, m, lambda d, e=e: d["per_env"].get(e)) for i, (_, m) in enumerate(rows)],
        )
    table.add_section()
    for key, label in (
        ("worst", "worst"),
        ("average", "average"),
        ("worst_client", "worst client"),
    ):
        table.add_row(
            label,
            *[cell(i, m, lambda d, key=key: d[key]) for i, (_, m) in enumerate(rows)],
            style="bold",
        )
    if any(m.get("degenerate") for _, m in rows):
        table.caption = (
            "† degenerate: the model answers one class everywhere, never left chance-level "
            "training loss, or scores under the majority class on its own training data; its "
            "accuracies are no result"
        )
    return table


def say(line: str) -> None:
    """One plain line on stderr (progress notes: never markup, never highlighted)."""
    err.print(escape(line), highlight=False, soft_wrap=True)


def progress_bar(total: int, label: str):
    """The run's progress line on stderr (``fedshift.progress``) and its ``on_round``."""
    from .progress import progress_bar as bar

    return bar(total, label, err)


def print_run_summary(
    summaries: list[dict], db, json_: bool, *, name: str | None = None, group: str | None = None
) -> None:
    """What ``fedshift run`` and ``fedshift flower run`` print when their runs end: the
    run's accuracy table (several seeds: mean ± std over them), its costs and client
    faults, and with ``--json`` the summary line."""
    from .jobs import seeds_summary

    if len(summaries) == 1:
        summary, std = summaries[0], None
        title = f"run {summary['run_id']} — accuracy % (seed {summary['seed']})"
    else:
        summary = seeds_summary(summaries)
        std = [summary["metrics_std"]]
        title = f"accuracy %, mean ± std over seeds {summary['seeds']}"
        if group is not None:
            summary["group"] = group
            title += f" (group {group})"
    table = summary_table(title, [(name or summary["algorithm"], summary["metrics"])], std=std)
    (err if json_ else out).print(table)
    err.print(
        f"time {summary['time_s']:.1f}s, up {summary['bytes_up'] / 1e6:.2f} MB,"
        f" down {summary['bytes_down'] / 1e6:.2f} MB; recorded in {escape(str(db))}"
    )
    if summary.get("events"):
        kinds = ", ".join(f"{k} ×{n}" for k, n in sorted(summary["events"].items()))
        err.print(f"client faults (excluded from aggregation or late): {kinds}")
    if json_:
        print_json(summary)
