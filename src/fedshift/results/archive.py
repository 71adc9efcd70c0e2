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
``COMPRESS_OVER`` is written gzip-compressed (``<run_id>.json.gz``).

Format 2 (written since format 1's files proved too big to commit for ``scm``: 2.1 MB per
run gzipped, 5,000 test environments × 100 clients) keeps every number of format 1 and
lays the large tables out as columns: each split's accuracies as one row per client over
one list of environments, and a metric keyed by every test environment (``per_env``, at
each evaluated round) as a list in that order when there are more than ``ENV_LIST_OVER``
of them. Both formats import; a file whose run the store holds unchanged is left as it is,
whichever format wrote it, so committed evidence never churns.
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
VERSION = 2
READS = (1, 2)
ENV_LIST_OVER = 32  # env-keyed metrics with more keys than this are written as lists
ENV_REF = "$envs"  # the key that marks such a list in a file (names the split it follows)
EXPORTABLE = ("done", "diverged")
COMPRESS_OVER = 256 * 1024  # bytes of JSON above which a record is written as .json.gz
SUFFIXES = (".json", ".json.gz")


def export_runs(db: str | Path, refs: Iterable[str], out_dir: str | Path) -> list[Path]:
    """Write each run ``refs`` names (ids or unique prefixes) to ``out_dir/<run_id>.json``;
    returns the paths. A file already there that holds the same run is kept as it is (in
    whichever format wrote it); one that differs is replaced (the store is the newer truth)."""
    store = RunStore(db)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FedshiftError(f"{str(out)!r} is a file; --out takes a folder")
    records = [_raw(store, store.resolve(ref)) for ref in refs]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for record in records:
        run_id = record["run"]["run_id"]
        kept = _unchanged(out, run_id, record)
        if kept is not None:
            paths.append(kept)
            continue
        data = _layout(_packed(record)).encode()
        packed = len(data) > COMPRESS_OVER
        path = out / f"{run_id}{SUFFIXES[packed]}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(gzip.compress(data, mtime=0) if packed else data)  # mtime 0: same bytes
        tmp.replace(path)  # never a half-written record in place of a whole one
        (out / f"{run_id}{SUFFIXES[not packed]}").unlink(missing_ok=True)  # the other form
        paths.append(path)
    return paths


def _layout(record: dict[str, Any]) -> str:
    """The file's text: one line per key of the run, per round and per client's row of
    accuracies, so a file stays small (no indentation per number) and a change reads as a
    line diff."""
    depth = {"accuracy": 3}  # split → its lists → one row per client; the rest one level
    body = ",\n".join(
        f" {_compact(k)}: {_block(record[k], depth.get(k, 1), 1)}" for k in sorted(record)
    )
    return "{\n" + body + "\n}\n"


def _compact(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _block(value: Any, levels: int, indent: int) -> str:
    """``value`` with its first ``levels`` levels of lists and dicts one item per line (a
    list of plain values stays on one line)."""
    pad = " " * (indent + 1)
    if levels and isinstance(value, dict) and value:
        items = [
            f"{pad}{_compact(k)}: {_block(value[k], levels - 1, indent + 1)}" for k in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if levels and isinstance(value, list) and any(isinstance(v, (list, dict)) for v in value):
        items = [f"{pad}{_block(v, levels - 1, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return _compact(value)


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
    return {"run": row, "rounds": rounds, "client_accuracy": accuracy}


def _packed(record: dict[str, Any]) -> dict[str, Any]:
    """The format-2 file of a record as ``_raw`` reads it (see the module's docstring)."""
    tables: dict[str, dict[str, Any]] = {}
    for split in sorted({r["split"] for r in record["client_accuracy"]}):
        rows = [r for r in record["client_accuracy"] if r["split"] == split]
        clients = sorted({r["client"] for r in rows})
        envs = sorted({r["env"] for r in rows})
        at = {(r["client"], r["env"]): r["accuracy"] for r in rows}
        grid = [[_short(at.get((c, e), _ABSENT)) for e in envs] for c in clients]
        tables[split] = {"clients": clients, "envs": envs, "rows": grid}
    envs = tables.get("test", {}).get("envs", [])
    lists = len(envs) > ENV_LIST_OVER

    def pack(metrics: Any) -> Any:
        return _env_lists(metrics, envs) if lists and metrics else metrics

    run = {**record["run"], "metrics": pack(record["run"]["metrics"])}
    rounds = [
        {**r, "metrics": pack(r["metrics"]), "extras": pack(r["extras"])} for r in record["rounds"]
    ]
    return {"format": FORMAT, "version": VERSION, "run": run, "rounds": rounds, "accuracy": tables}


_ABSENT = "-"  # a (client, environment) the store holds no accuracy for (None is a NaN's)


def _short(accuracy: Any) -> Any:
    """A whole-number accuracy written without its ``.0`` (the store keeps it as a float):
    6 % off ``scm``'s compressed file, whose clients hold 100 test points per environment."""
    return int(accuracy) if isinstance(accuracy, float) and accuracy.is_integer() else accuracy


def _env_lists(value: Any, envs: list[str]) -> Any:
    """Each dict in ``value`` keyed by exactly ``envs`` (in that order) as a marked list."""
    if isinstance(value, dict):
        if list(value) == envs:
            return {ENV_REF: "test", "values": [value[e] for e in envs]}
        return {k: _env_lists(v, envs) for k, v in value.items()}
    if isinstance(value, list):
        return [_env_lists(v, envs) for v in value]
    return value


def _env_dicts(value: Any, tables: dict[str, Any]) -> Any:
    """The inverse of ``_env_lists``."""
    if isinstance(value, dict):
        if ENV_REF in value:
            return dict(zip(tables[value[ENV_REF]]["envs"], value["values"], strict=True))
        return {k: _env_dicts(v, tables) for k, v in value.items()}
    if isinstance(value, list):
        return [_env_dicts(v, tables) for v in value]
    return value


def _unpacked(record: dict[str, Any]) -> dict[str, Any]:
    """A file of either format as ``_raw`` reads the run (format 1 is that layout already)."""
    if record["version"] == 1:
        return {
            "run": record["run"],
            "rounds": record.get("rounds") or [],
            "client_accuracy": record.get("client_accuracy") or [],
        }
    tables = record.get("accuracy") or {}
    accuracy = [
        {"accuracy": value, "client": client, "env": env, "split": split}
        for split in sorted(tables)
        for client, row in zip(tables[split]["clients"], tables[split]["rows"], strict=True)
        for env, value in zip(tables[split]["envs"], row, strict=True)
        if value != _ABSENT
    ]
    run = {**record["run"], "metrics": _env_dicts(record["run"].get("metrics"), tables)}
    rounds = [
        {
            **r,
            "metrics": _env_dicts(r.get("metrics"), tables),
            "extras": _env_dicts(r.get("extras"), tables),
        }
        for r in record.get("rounds") or []
    ]
    return {"run": run, "rounds": rounds, "client_accuracy": accuracy}


def _unchanged(out: Path, run_id: str, record: dict[str, Any]) -> Path | None:
    """The file already in ``out`` that holds exactly ``record``, if any."""
    for suffix in SUFFIXES:
        path = out / f"{run_id}{suffix}"
        if path.is_file():
            try:
                if _load(path) == record:
                    return path
            except FedshiftError:
                return None  # unreadable: written again
    return None


def import_runs(db: str | Path, files: Iterable[str | Path]) -> list[dict[str, str]]:
    """Put each exported run file (or every ``*.json`` / ``*.json.gz`` of a folder) into the
    store ``db``; one entry per run: its id, method and what happened (``imported``, or
    ``present`` when the store holds that run already with the same result)."""
    paths = _files(files)
    records = [_load(p) for p in paths]  # every file checked before anything is written
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


def _load(path: Path) -> dict[str, Any]:
    """The run a file holds, as ``_raw`` reads it from a store."""
    record = _read(path)
    try:
        return _unpacked(record)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise FedshiftError(f"{str(path)!r}: its run record is malformed ({e!r})") from None


def _read(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
        record = json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FedshiftError(f"{str(path)!r} is not a readable exported run ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise FedshiftError(f"{str(path)!r} is not a run written by `fedshift export`")
    if record.get("version") not in READS:
        raise FedshiftError(
            f"{str(path)!r} is an exported run of format version {record.get('version')}; "
            f"this fedshift reads versions {', '.join(map(str, READS))}"
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
