"""Run records as files: ``fedshift export`` writes a finished run of the store as one JSON
file (its row, every round, every client's accuracy per environment — no checkpoint), and
``fedshift import`` puts such files into a store.

Why: a run store is a working file. A paper-scale table takes days of runs on one machine;
its finished runs must outlive the store they ran in (a new machine, a lost folder) and be
committable beside the report they back (issue 18: the evidence behind a committed report
is committed with it). An imported run is the run: ``report``, ``compare``, ``show`` read
it, and ``reproduce --resume`` / ``sweep --resume`` reuse it instead of training it again.
Only finished (``done``) and ``diverged`` runs travel: an unfinished one needs its
checkpoint to continue, and a checkpoint is not a record. A record longer than
``COMPRESS_OVER`` is written gzip-compressed (``<run_id>.json.gz``): a run evaluated on
hundreds of environments × clients (``scm``'s 200 test environments × 100 clients: 1.4 MB
of JSON) shrinks about tenfold, so a table's evidence stays small enough to commit.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

from ..errors import FedshiftError
from .store import RUN_ID, RunStore, _appended, _now

FORMAT = "fedshift-run"
VERSION = 1
EXPORTABLE = ("done", "diverged")
COMPRESS_OVER = 256 * 1024  # bytes of JSON above which a record is written as .json.gz
SUFFIXES = (".json", ".json.gz")


def export_runs(db: str | Path, refs: Iterable[str], out_dir: str | Path) -> list[Path]:
    """Write each run ``refs`` names (ids or unique prefixes) to ``out_dir/<run_id>.json``;
    returns the paths. A file already there is replaced (the store is the newer truth)."""
    store = RunStore(db)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FedshiftError(f"{str(out)!r} is a file; --out takes a folder")
    records = [_raw(store, store.resolve(ref)) for ref in refs]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for record in records:
        data = _layout(record).encode()
        packed = len(data) > COMPRESS_OVER
        run_id = record["run"]["run_id"]
        path = out / f"{run_id}{SUFFIXES[packed]}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(gzip.compress(data, mtime=0) if packed else data)  # mtime 0: same bytes
        tmp.replace(path)  # never a half-written record in place of a whole one
        (out / f"{run_id}{SUFFIXES[not packed]}").unlink(missing_ok=True)  # the other form
        paths.append(path)
    return paths


def _layout(record: dict[str, Any]) -> str:
    """The file's text: one line per key of the run and one per round and accuracy row,
    so a file stays small (no indentation per number) and a change reads as a line diff."""

    def line(v: Any) -> str:
        return json.dumps(v, sort_keys=True, separators=(",", ":"))

    parts = []
    for key in sorted(record):
        value = record[key]
        if isinstance(value, list):
            body = ",\n".join(f"  {line(v)}" for v in value)
            parts.append(f" {line(key)}: [\n{body}\n ]" if value else f" {line(key)}: []")
        elif isinstance(value, dict):
            body = ",\n".join(f"  {line(k)}: {line(value[k])}" for k in sorted(value))
            parts.append(f" {line(key)}: {{\n{body}\n }}")
        else:
            parts.append(f" {line(key)}: {line(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _raw(store: RunStore, run_id: str) -> dict[str, Any]:
    """The run as ``RunStore.run`` reads it, laid out as the store's rows (its group under
    the column name ``grp``; no process id, no run id repeated per row)."""
    row = store.run(run_id)
    if row["status"] not in EXPORTABLE or row["status"] == "done" and not row["metrics"]:
        raise FedshiftError(
            f"run {run_id!r} is {row['status']}: only finished or diverged runs are exported "
            "(an unfinished run continues from its checkpoint; resume it first)"
        )
    rounds = [
        {**{k: v for k, v in r.items() if k != "run_id"}, "extras": r["extras"] or None}
        for r in row.pop("round_metrics")
    ]
    accuracy = sorted(row.pop("client_accuracy"), key=lambda r: (r["split"], r["client"], r["env"]))
    row["grp"] = row.pop("group")
    row["overrides"] = row["overrides"] or None
    if row["environment"] and "imported" in row["environment"]:
        # the store's note of the file it came from: a fact about that store, not the run,
        # so re-exporting an imported run (a resumed table's reused runs) rewrites its
        # committed file unchanged
        row["environment"] = {k: v for k, v in row["environment"].items() if k != "imported"}
    return {
        "format": FORMAT,
        "version": VERSION,
        "run": row,
        "rounds": rounds,
        "client_accuracy": accuracy,
    }


def import_runs(db: str | Path, files: Iterable[str | Path]) -> list[dict[str, str]]:
    """Put each exported run file (or every ``*.json`` / ``*.json.gz`` of a folder) into the
    store ``db``; one entry per run: its id, method and what happened (``imported``, or
    ``present`` when the store holds that run already with the same result)."""
    paths = _files(files)
    records = [_read(p) for p in paths]  # every file checked before anything is written
    store = RunStore(db)
    return [_import_one(store, rec, path) for rec, path in zip(records, paths, strict=True)]


def _files(files: Iterable[str | Path]) -> list[Path]:
    paths: list[Path] = []
    for f in files:
        p = Path(f)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith(SUFFIXES))
            if not found:
                raise FedshiftError(
                    f"the folder {str(p)!r} holds no exported run (*.json or *.json.gz)"
                )
            paths += found
        elif p.is_file():
            paths.append(p)
        else:
            raise FedshiftError(f"no file or folder {str(p)!r}")
    if not paths:
        raise FedshiftError("name at least one exported run file or folder to import")
    return paths


def _read(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
        record = json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FedshiftError(f"{str(path)!r} is not a readable exported run ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise FedshiftError(f"{str(path)!r} is not a run written by `fedshift export`")
    if record.get("version") != VERSION:
        raise FedshiftError(
            f"{str(path)!r} is an exported run of format version {record.get('version')}; "
            f"this fedshift reads version {VERSION}"
        )
    run = record.get("run")
    if (
        not isinstance(run, dict)
        or not RUN_ID.fullmatch(str(run.get("run_id")))
        or run.get("status") not in EXPORTABLE
        or not isinstance(run.get("config"), dict)
    ):
        raise FedshiftError(f"{str(path)!r}: its run record is incomplete (id, status or config)")
    return record


def _import_one(store: RunStore, record: dict[str, Any], path: Path) -> dict[str, str]:
    run = dict(record["run"])
    run_id = run["run_id"]
    out = {"run_id": run_id, "algorithm": str(run.get("algorithm")), "file": str(path)}
    with closing(store._connect()) as conn, conn:
        here = conn.execute("SELECT status, metrics FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if here is not None:
            same = here["status"] == run["status"] and _metrics(here["metrics"]) == run["metrics"]
            if not same:
                raise FedshiftError(
                    f"{str(path)!r}: the store already holds a different run {run_id!r} "
                    f"({here['status']}); import it into another --db"
                )
            return {**out, "action": "present"}
        cols = _columns(conn, "runs") - {"pid"}
        for key in ("config", "environment", "metrics", "overrides"):
            if run.get(key) is not None:
                run[key] = json.dumps(run[key])
        _insert(conn, "runs", {k: v for k, v in run.items() if k in cols})
        note = {"time": _now(), "from": path.name}
        conn.execute(
            "UPDATE runs SET environment=? WHERE run_id=?",
            (json.dumps(_appended(conn, run_id, "imported", note)), run_id),
        )
        round_cols = _columns(conn, "rounds")
        for r in record.get("rounds") or []:
            r = {**r, "run_id": run_id}
            for key in ("metrics", "extras"):
                r[key] = json.dumps(r[key]) if r.get(key) else None
            _insert(conn, "rounds", {k: v for k, v in r.items() if k in round_cols})
        accuracy_cols = _columns(conn, "client_accuracy")
        for r in record.get("client_accuracy") or []:
            r = {**r, "run_id": run_id}
            _insert(conn, "client_accuracy", {k: v for k, v in r.items() if k in accuracy_cols})
    return {**out, "action": "imported"}


def _metrics(text: str | None) -> Any:
    return json.loads(text) if text else None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    keys = list(row)
    conn.execute(
        f"INSERT INTO {table} ({', '.join(keys)}) VALUES ({', '.join('?' * len(keys))})",
        [row[k] for k in keys],
    )
