"""`fedshift show RUN`: one stored run laid out for reading — its header, every config key,
and the training curve as stored (the final accuracy table is the CLI's ``summary_table``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _cell(v: Any, digits: int = 1) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def header(record: dict) -> str:
    """One line a person reads first: what ran, how far it got, what it cost."""
    r = record
    mb = (r["bytes_up"] + r["bytes_down"]) / 1e6
    line = (
        f"run {r['run_id']}: {r['algorithm']} on {r['scenario']}, seed {r['seed']}; "
        f"status {r['status']}, rounds {r['rounds_done']}/{r['rounds']}; "
        f"created {r['created']}, finished {r['finished'] or '—'}; "
        f"time {_cell(r['time_s'])} s, {mb:.2f} MB communicated"
    )
    env = r.get("environment") or {}
    devices = [env.get("device")] + [e.get("device") for e in env.get("resumes", [])]
    devices = list(dict.fromkeys(d for d in devices if d))
    if devices:
        line += f"; on {', then '.join(devices)}"
    if env.get("cpu"):  # recorded since 2026-11-30: float rounding differs between CPUs
        line += f" (CPU {env['cpu']}, {env.get('cpu_capability') or '?'})"
    if r.get("val") is not None:
        line += f"; validation accuracy {r['val']:.1f} %"
    if r.get("error"):
        line += f"\nerror: {r['error']}"
    return line


def config_table(record: dict) -> Table:
    """Every key of the resolved config, in the order the store keeps it."""
    table = Table(title="config")
    table.add_column("key", no_wrap=True)
    table.add_column("value")
    for key, value in (record["config"] or {}).items():
        table.add_row(key, '""' if value == "" else str(value))
    return table


CURVE_COLUMNS = ("round", "loss", "val", "average", "worst", "worst_client", "MB", "time_s")


def curve_rows(record: dict, all_rounds: bool = False) -> tuple[list[dict], int]:
    """Per-round rows (accuracies %, MB communicated so far) and how many rounds are stored.
    Unless ``all_rounds``, only the evaluated rounds and the first and last are kept, so a
    600-round run still reads as its evaluation schedule."""
    stored = record["round_metrics"]
    rows, total = [], 0
    for i, r in enumerate(stored):
        total += r["bytes_up"] + r["bytes_down"]
        m = r["metrics"] or {}
        if not (all_rounds or m or i in (0, len(stored) - 1)):
            continue
        rows.append(
            {
                "round": r["round"],
                "loss": r["loss"],
                "val": r["val"],
                "average": m.get("average"),
                "worst": m.get("worst"),
                "worst_client": m.get("worst_client"),
                "MB": total / 1e6,
                "time_s": r["time_s"],
            }
        )
    return rows, len(stored)


def curve_table(record: dict, all_rounds: bool = False) -> Table:
    rows, stored = curve_rows(record, all_rounds)
    table = Table(title="training curve (accuracy %)")
    for c in CURVE_COLUMNS:
        table.add_column(c.replace("_", " "), justify="right")
    digits = {"loss": 4, "MB": 2, "time_s": 2}
    for r in rows:
        table.add_row(*[_cell(r[c], digits.get(c, 1)) for c in CURVE_COLUMNS])
    if len(rows) < stored:
        table.caption = (
            f"{len(rows)} of {stored} stored rounds shown (evaluated, first and last); "
            "--all-rounds shows every one"
        )
    return table
