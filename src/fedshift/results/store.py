"""The run store: one SQLite database (default ``runs/fedshift.db``) holding every run's
resolved config, environment, per-round metrics, final per-client × per-environment
accuracies and costs. Each write is one transaction, so an interrupted run leaves a
readable database with its status and the rounds it finished."""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import sqlite3
import tempfile
import time
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import FedshiftError
from ..eval.metrics import refresh_fit_verdict

DEFAULT_DB = Path("runs") / "fedshift.db"

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    finished TEXT,
    status TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    scenario TEXT NOT NULL,
    seed INTEGER NOT NULL,
    rounds INTEGER NOT NULL,
    rounds_done INTEGER NOT NULL DEFAULT 0,
    config TEXT NOT NULL,
    environment TEXT NOT NULL,
    metrics TEXT,
    val REAL,
    time_s REAL,
    bytes_up INTEGER NOT NULL DEFAULT 0,
    bytes_down INTEGER NOT NULL DEFAULT 0,
    error TEXT
);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    round INTEGER NOT NULL,
    loss REAL,
    bytes_up INTEGER NOT NULL,
    bytes_down INTEGER NOT NULL,
    time_s REAL NOT NULL,
    metrics TEXT,
    val REAL,
    extras TEXT,
    PRIMARY KEY (run_id, round)
);
CREATE TABLE IF NOT EXISTS client_accuracy (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    split TEXT NOT NULL,
    client INTEGER NOT NULL,
    env TEXT NOT NULL,
    accuracy REAL,
    PRIMARY KEY (run_id, split, client, env)
);
"""


# columns added after the first release: (table, column, type)
MIGRATIONS = [
    ("rounds", "extras", "TEXT"),
    ("runs", "pid", "INTEGER"),
    ("runs", "overrides", "TEXT"),  # JSON list: keys changed on --resume, at which round
    ("runs", "grp", "TEXT"),  # the group a run was started in (seeds-…, sweep-…, table-…)
]


def new_group(kind: str) -> str:
    """A fresh id for the runs one command starts together: ``seeds-…`` (``run --seeds``),
    ``sweep-…`` (a sweep's grid × seeds), ``table-…`` (a ``reproduce``)."""
    return f"{kind}-{secrets.token_hex(4)}"


RUN_ID = re.compile(r"[0-9a-f]{10}")  # what start() generates: secrets.token_hex(5)
RUN_ID_PREFIX = re.compile(r"[0-9a-f]{1,10}")


def check_run_id(run_id: object, prefix: bool = False) -> str:
    """A run id names its checkpoint file, so only the store's own format is accepted:
    an id such as ``../../elsewhere/evil`` must never reach a path. With ``prefix``, the
    first 1 to 10 of those digits pass too (for :meth:`RunStore.resolve` to complete)."""
    pattern = RUN_ID_PREFIX if prefix else RUN_ID
    if not isinstance(run_id, str) or not pattern.fullmatch(run_id):
        raise FedshiftError(
            f"{run_id!r} is not a fedshift run id (10 lowercase hex digits, "
            + ("or a unique prefix of them, " if prefix else "")
            + "as `fedshift runs` lists them)"
        )
    return run_id


def lock_error(e: sqlite3.Error) -> bool:
    """Whether SQLite failed because another process holds the store's lock."""
    return "locked" in str(e) or "busy" in str(e)


def checkpoint_path(db: str | Path, run_id: str) -> Path:
    """Where a run's checkpoint lives: ``checkpoints/<run_id>.pt`` beside the run store
    (the id is checked first, so no id can point outside that folder)."""
    return Path(db).parent / "checkpoints" / f"{check_run_id(run_id)}.pt"


def _alive(pid: int | None) -> bool:
    """Whether a process with this id still runs on this machine."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _num(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


class RunStore:
    BUSY_TIMEOUT_S = 30.0  # SQLite's own wait for a lock (it retries inside)
    LOCK_PATIENCE_S = 600.0  # a run's own writes keep retrying this long in all

    def __init__(self, path: str | Path = DEFAULT_DB) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise FedshiftError(f"the run store {str(self.path)!r} is a folder; give a file path")
        try:
            if not self.path.exists():
                self._create()
            elif self.path.stat().st_size == 0:
                raise FedshiftError(
                    f"{str(self.path)!r} is an empty file, not a fedshift run store (fedshift "
                    "never leaves one empty); remove it or give another --db path"
                )
            else:
                self._inspect()  # read-only: another program's file is left as it was
            with closing(self._connect()) as conn, conn:
                conn.executescript(SCHEMA)
                self._migrate(conn)
        except sqlite3.DatabaseError as e:
            raise FedshiftError(
                f"{str(self.path)!r} is not a readable fedshift run store ({e}); "
                "give another --db path"
            ) from None
        except (OSError, sqlite3.Error) as e:
            raise FedshiftError(f"cannot open the run store {str(self.path)!r}: {e}") from None

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Add the columns later versions added (stores written by older versions). Two
        processes may open one store at once: the check is redone under the write lock."""

        def missing() -> list[tuple[str, str, str]]:
            cols = {
                t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")}
                for t in {m[0] for m in MIGRATIONS}
            }
            return [m for m in MIGRATIONS if m[1] not in cols[m[0]]]

        if missing():
            conn.execute("BEGIN IMMEDIATE")
            for table, column, kind in missing():
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def _create(self) -> None:
        """A new store: its schema is written to a temporary file in the same folder that
        is then linked into place, so a store file is never seen empty or half made (and
        of two processes creating it at once, the first one's is kept)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        os.close(fd)
        try:
            with closing(sqlite3.connect(tmp)) as conn, conn:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(SCHEMA)
                self._migrate(conn)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass  # another process created it meanwhile
            except OSError:  # a file system without hard links
                if not self.path.exists():
                    os.replace(tmp, self.path)
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(tmp + suffix).unlink(missing_ok=True)

    def _inspect(self) -> None:
        """Refuse, through a read-only connection, a file that is not a fedshift run store
        before anything (WAL mode, tables) is written to it."""
        uri = self.path.resolve().as_uri() + "?mode=ro"
        with closing(sqlite3.connect(uri, uri=True, timeout=30)) as conn:
            conn.row_factory = sqlite3.Row
            self._check_foreign(conn)

    def _check_foreign(self, conn: sqlite3.Connection) -> None:
        """Refuse an SQLite database of another program rather than add tables to it."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "runs" not in tables:
            raise FedshiftError(
                f"{str(self.path)!r} is an SQLite database of something else (tables: "
                f"{', '.join(sorted(tables))}), not a fedshift run store; give another --db path"
            )
        if "runs" in tables:
            cols = {r["name"] for r in conn.execute("PRAGMA table_info(runs)")}
            missing = {"run_id", "status", "algorithm", "config"} - cols
            if missing:
                raise FedshiftError(
                    f"{str(self.path)!r} has a 'runs' table that is not fedshift's (no "
                    f"{', '.join(sorted(missing))}); give another --db path"
                )

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.BUSY_TIMEOUT_S)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _write(self, write) -> None:
        """``write(conn)`` in one transaction. While another process holds the store's lock
        (a long read, a backup), retry with back-off for up to LOCK_PATIENCE_S in all, so a
        run's rounds and results are not lost to a lock held a minute; then one sentence."""
        start, pause = time.monotonic(), 1.0
        while True:
            try:
                with closing(self._connect()) as conn, conn:
                    write(conn)
                return
            except sqlite3.OperationalError as e:
                if not lock_error(e):
                    raise
                waited = time.monotonic() - start
                if waited >= self.LOCK_PATIENCE_S:
                    raise FedshiftError(
                        f"the run store {str(self.path)!r} stayed locked by another process "
                        f"for {waited:.0f} s; stop that process and resume this run"
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, 30.0)

    def start(
        self, config: dict[str, Any], environment: dict[str, Any], group: str | None = None
    ) -> str:
        run_id = secrets.token_hex(5)
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT INTO runs (run_id, created, status, algorithm, scenario, seed, rounds,"
                " config, environment, pid, grp) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    _now(),
                    "running",
                    config["algorithm"],
                    config["scenario"],
                    config["seed"],
                    config["rounds"],
                    json.dumps(config),
                    json.dumps(environment),
                    os.getpid(),
                    group,
                ),
            )
        return run_id

    def log_round(self, run_id: str, rec) -> None:
        """Record one round (idempotent: a resumed run may log a round again)."""

        def write(conn):
            conn.execute(
                "INSERT OR REPLACE INTO rounds (run_id, round, loss, bytes_up, bytes_down,"
                " time_s, metrics, val, extras) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    rec.round,
                    _num(rec.loss),
                    rec.bytes_up,
                    rec.bytes_down,
                    rec.time_s,
                    json.dumps(rec.metrics) if rec.metrics else None,
                    _num(rec.val),
                    json.dumps(rec.extras) if getattr(rec, "extras", None) else None,
                ),
            )
            conn.execute(
                "UPDATE runs SET rounds_done=?, bytes_up=(SELECT SUM(bytes_up) FROM rounds"
                " WHERE run_id=? AND round<=?), bytes_down=(SELECT SUM(bytes_down) FROM rounds"
                " WHERE run_id=? AND round<=?) WHERE run_id=?",
                (rec.round, run_id, rec.round, run_id, rec.round, run_id),
            )

        self._write(write)

    def restart(self, run_id: str) -> None:
        """Mark a run as running again (resume)."""
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "UPDATE runs SET status='running', finished=NULL, error=NULL, pid=? WHERE run_id=?",
                (os.getpid(), run_id),
            )

    def note_resume(self, run_id: str, entry: dict[str, Any]) -> None:
        """Append ``entry`` (round, device, time) to the run's ``environment["resumes"]``:
        a run may resume on another machine, and ``environment.device`` is where it began."""
        with closing(self._connect()) as conn, conn:
            env = _appended(conn, run_id, "resumes", entry)
            conn.execute("UPDATE runs SET environment=? WHERE run_id=?", (json.dumps(env), run_id))

    def override(self, run_id: str, config: dict[str, Any], entry: dict[str, Any]) -> None:
        """Record a change of config on resume: the run's config becomes ``config`` (its
        ``rounds`` too) and ``entry`` (which keys changed at which round) is appended to its
        ``overrides``, in one transaction."""
        with closing(self._connect()) as conn, conn:
            row = conn.execute("SELECT overrides FROM runs WHERE run_id=?", (run_id,)).fetchone()
            history = json.loads(row["overrides"]) if row and row["overrides"] else []
            conn.execute(
                "UPDATE runs SET config=?, rounds=?, overrides=? WHERE run_id=?",
                (
                    json.dumps(config),
                    config["rounds"],
                    json.dumps([*history, entry]),
                    run_id,
                ),
            )

    def rescore(self, run_id: str, metrics: dict[str, Any], entry: dict[str, Any]) -> None:
        """Replace a finished run's metrics by a re-evaluation under the current rules
        (``fedshift rescore``) and append ``entry`` (when, what changed) to its
        ``environment["rescored"]``, in one transaction."""

        def write(conn):
            env = _appended(conn, run_id, "rescored", entry)
            conn.execute(
                "UPDATE runs SET metrics=?, environment=? WHERE run_id=?",
                (json.dumps(metrics), json.dumps(env), run_id),
            )

        self._write(write)

    def finish(self, run_id: str, result, val: float | None) -> None:
        rows = []
        for split, acc, names in (
            ("test", result.accuracy, result.env_names),
            ("val", result.val_accuracy, result.val_names),
        ):
            if acc is None:
                continue
            for c in range(acc.shape[0]):
                for j, env in enumerate(names):
                    rows.append((run_id, split, c, env, _num(float(acc[c, j]))))

        def write(conn):
            conn.executemany("INSERT OR REPLACE INTO client_accuracy VALUES (?,?,?,?,?)", rows)
            conn.execute(
                "UPDATE runs SET status='done', finished=?, metrics=?, val=?, time_s=?"
                " WHERE run_id=?",
                (_now(), json.dumps(result.metrics), _num(val), result.time_s, run_id),
            )

        self._write(write)

    def fail(self, run_id: str, status: str, error: str) -> None:
        self._write(
            lambda conn: conn.execute(
                "UPDATE runs SET status=?, finished=?, error=? WHERE run_id=?",
                (status, _now(), error, run_id),
            )
        )

    def runs(self) -> list[dict[str, Any]]:
        with closing(self._connect()) as conn:
            rows = conn.execute("SELECT * FROM runs ORDER BY created, rowid").fetchall()
        return [self._row(r) for r in rows]

    def round_seconds(self, run_ids: list[str]) -> dict[str, list[float]]:
        """Each run's recorded seconds per round, in round order (a run still training has
        the rounds it has logged): the pace of a run that has not finished."""
        if not run_ids:
            return {}
        marks = ",".join("?" * len(run_ids))
        with closing(self._connect()) as conn:
            rows = conn.execute(
                f"SELECT run_id, time_s FROM rounds WHERE run_id IN ({marks}) ORDER BY round",
                list(run_ids),
            ).fetchall()
        out: dict[str, list[float]] = {r: [] for r in run_ids}
        for run_id, seconds in rows:
            out[run_id].append(float(seconds))
        return out

    def resolve(self, ref: str) -> str:
        """The full id of the one run whose id is ``ref`` or starts with it, so that any
        unique prefix of an id names the run, as with git commits."""
        if not isinstance(ref, str) or not ref.strip():
            raise FedshiftError(f"{ref!r} is not a run id; give an id or a prefix of one")
        ref = ref.strip()
        with closing(self._connect()) as conn:
            if conn.execute("SELECT 1 FROM runs WHERE run_id=?", (ref,)).fetchone():
                return ref  # an exact id wins even where it is a prefix of another
            found = [
                r[0]
                for r in conn.execute(
                    "SELECT run_id FROM runs WHERE substr(run_id, 1, ?)=? ORDER BY created, rowid",
                    (len(ref), ref),
                )
            ]
        if not found:
            raise FedshiftError(f"no run {ref!r} in {str(self.path)!r} (see `fedshift runs`)")
        if len(found) > 1:
            more = f" and {len(found) - 10} more" if len(found) > 10 else ""
            shown = ", ".join(found[:10]) + more
            raise FedshiftError(
                f"run id prefix {ref!r} is ambiguous: {len(found)} runs match ({shown}); "
                "give more characters"
            )
        return found[0]

    def run(self, run_id: str) -> dict[str, Any]:
        """Everything stored about one run; ``run_id`` may be a unique prefix of its id."""
        run_id = self.resolve(run_id)
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:  # deleted since it was resolved
                raise FedshiftError(f"no run {run_id!r} in {str(self.path)!r}")
            out = self._row(row)
            out["round_metrics"] = [
                {
                    **dict(r),
                    "metrics": json.loads(r["metrics"]) if r["metrics"] else None,
                    "extras": json.loads(r["extras"]) if r["extras"] else {},
                }
                for r in conn.execute(
                    "SELECT * FROM rounds WHERE run_id=? ORDER BY round", (run_id,)
                )
            ]
            out["client_accuracy"] = [
                dict(r)
                for r in conn.execute(
                    "SELECT split, client, env, accuracy FROM client_accuracy WHERE run_id=?"
                    " ORDER BY split, client",
                    (run_id,),
                )
            ]
        return out

    @staticmethod
    def _row(row: sqlite3.Row) -> dict[str, Any]:
        d = dict(row)
        for k in ("config", "environment", "metrics"):
            d[k] = json.loads(d[k]) if d[k] else None
        refresh_fit_verdict(d["metrics"])  # a fit rule newer than the run applies to it
        d["overrides"] = json.loads(d["overrides"]) if d.get("overrides") else []
        d["group"] = d.pop("grp", None)
        if d["status"] == "running" and not _alive(d.pop("pid", None)):
            # its process is gone without a word (SIGKILL, power cut): resumable, not running
            d["status"] = "interrupted"
            d["error"] = d["error"] or "the process running it ended abruptly (killed?)"
        d.pop("pid", None)
        return d


def _appended(conn: sqlite3.Connection, run_id: str, key: str, entry: dict[str, Any]) -> dict:
    """The run's ``environment`` with ``entry`` appended to its list ``key`` (resumes,
    re-scores): what was added to a run after it began, kept beside where it began."""
    row = conn.execute("SELECT environment FROM runs WHERE run_id=?", (run_id,)).fetchone()
    env = json.loads(row["environment"]) if row and row["environment"] else {}
    env[key] = [*env.get(key, []), entry]
    return env
