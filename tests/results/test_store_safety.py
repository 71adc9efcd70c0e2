"""The run store under stress: concurrent writers, foreign or corrupt files, old schemas,
runs whose process died."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest

from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore

ROUNDS = 150


def _writer(db: str, tag: int) -> None:
    store = RunStore(db)
    run_id = store.start(
        {"algorithm": "fedavg", "scenario": f"s{tag}", "seed": tag, "rounds": ROUNDS}, {}
    )
    for r in range(1, ROUNDS + 1):
        rec = SimpleNamespace(
            round=r, loss=1.0 / r, bytes_up=10, bytes_down=20, time_s=0.0, metrics=None, val=None
        )
        rec.extras = {"writer": tag}
        store.log_round(run_id, rec)
    store.fail(run_id, "interrupted", "done writing")


def test_two_processes_writing_one_store_at_once_both_complete(tmp_path):
    db = str(tmp_path / "runs.db")
    RunStore(db)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(db, t)) for t in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    store = RunStore(db)
    runs = store.runs()
    assert sorted(r["scenario"] for r in runs) == ["s1", "s2"]
    for r in runs:
        assert r["rounds_done"] == ROUNDS and r["bytes_up"] == 10 * ROUNDS
        rounds = store.run(r["run_id"])["round_metrics"]
        assert [x["round"] for x in rounds] == list(range(1, ROUNDS + 1))
        assert {x["extras"]["writer"] for x in rounds} == {r["seed"]}


def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER, amount REAL)")
    with pytest.raises(FedshiftError, match="not a fedshift run store"):
        RunStore(db)
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert tables == ["invoices"]


def test_a_runs_table_of_another_program_is_refused(tmp_path):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER, speed REAL)")
    with pytest.raises(FedshiftError, match="not fedshift's"):
        RunStore(db)


@pytest.mark.parametrize("content", [b"hello, not a database\n" * 50, b"\x00\xff" * 3000])
def test_a_corrupt_or_foreign_file_is_a_clear_error(tmp_path, content):
    db = tmp_path / "runs.db"
    db.write_bytes(content)
    with pytest.raises(FedshiftError, match="not a readable fedshift run store"):
        RunStore(db)
    assert db.read_bytes() == content


def test_a_folder_as_store_is_a_clear_error(tmp_path):
    with pytest.raises(FedshiftError, match="is a folder"):
        RunStore(tmp_path)


def test_cli_reports_a_corrupt_store_in_one_line(tmp_path):
    db = tmp_path / "runs.db"
    db.write_bytes(b"garbage" * 100)
    for args in (["runs", "--db", str(db)], ["run", "--db", str(db), "--rounds", "1"]):
        res = subprocess.run(
            [sys.executable, "-m", "fedshift.cli", *args], capture_output=True, text=True
        )
        assert res.returncode == 2
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
        assert "run store" in res.stderr


def test_cli_reports_corrupt_pages_behind_a_valid_header_in_one_line(tmp_path):
    """A real store whose pages were overwritten: the header passes the store checks, the
    first query fails (sqlite3.DatabaseError, a traceback before)."""
    db = tmp_path / "runs.db"
    store = RunStore(db)
    for i in range(40):
        cfg = {"algorithm": "fedavg", "scenario": "iid", "seed": i, "rounds": 1}
        store.start({**cfg, "note": "x" * 500}, {})
    del store
    with open(db, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 8192)
    for args in (["runs", "--db", str(db)], ["run", "--db", str(db), "--rounds", "1"]):
        res = subprocess.run(
            [sys.executable, "-m", "fedshift.cli", *args], capture_output=True, text=True
        )
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr and "run store cannot be read" in res.stderr


def _hold_lock(db, seconds: float) -> subprocess.Popen:
    """Another process holding the store's write lock for ``seconds``."""
    code = (
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(db), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_runs_writes_wait_out_a_lock_and_give_up_in_one_sentence(tmp_path, monkeypatch):
    """A round written while another process holds the lock longer than SQLite's own wait
    is retried with back-off (it used to fail the run); a lock held past the patience is one
    sentence. (Timeouts shrunk: 30 s and 600 s in use.)"""
    db = tmp_path / "runs.db"
    store = RunStore(db)
    run_id = store.start({"algorithm": "fedavg", "scenario": "iid", "seed": 0, "rounds": 2}, {})
    monkeypatch.setattr(RunStore, "BUSY_TIMEOUT_S", 0.1)
    monkeypatch.setattr(RunStore, "LOCK_PATIENCE_S", 20.0)
    rec = SimpleNamespace(round=1, loss=0.5, bytes_up=1, bytes_down=1, time_s=0.1,
                          metrics=None, val=None, extras=None)  # fmt: skip
    holder = _hold_lock(db, 1.5)
    store.log_round(run_id, rec)  # waited for the lock, then wrote
    holder.wait()
    assert store.run(run_id)["rounds_done"] == 1
    monkeypatch.setattr(RunStore, "LOCK_PATIENCE_S", 0.5)
    holder = _hold_lock(db, 5)
    try:
        with pytest.raises(FedshiftError, match="stayed locked by another process"):
            store.log_round(run_id, SimpleNamespace(**{**vars(rec), "round": 2}))
    finally:
        holder.kill()
        holder.wait()


def test_a_store_from_an_older_version_is_migrated(tmp_path):
    db = tmp_path / "old.db"
    RunStore(db)
    with sqlite3.connect(db) as conn:  # drop the columns later versions added
        conn.execute("ALTER TABLE rounds DROP COLUMN extras")
        conn.execute("ALTER TABLE runs DROP COLUMN pid")
    store = RunStore(db)
    run_id = store.start({"algorithm": "a", "scenario": "b", "seed": 0, "rounds": 1}, {})
    assert store.run(run_id)["status"] == "running"


def test_a_run_whose_process_died_lists_as_interrupted(tmp_path):
    db = tmp_path / "runs.db"
    code = (
        "import os, sys; from fedshift.results.store import RunStore; "
        "RunStore(sys.argv[1]).start({'algorithm':'fedavg','scenario':'x','seed':0,'rounds':9},{});"
        " os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(db)], check=True)
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "interrupted" and "killed" in rec["error"]


def test_a_foreign_database_is_refused_before_it_is_modified(tmp_path):
    """No WAL switch, no -wal/-shm files: the file is byte-identical and alone."""
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER, amount REAL)")
        conn.execute("INSERT INTO invoices VALUES (1, 9.5)")
    before = db.read_bytes()
    for _ in range(2):
        with pytest.raises(FedshiftError, match="not a fedshift run store"):
            RunStore(db)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_an_empty_file_is_refused_untouched(tmp_path):
    db = tmp_path / "runs.db"
    db.touch()
    with pytest.raises(FedshiftError, match="is an empty file, not a fedshift run store"):
        RunStore(db)
    assert db.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]


def test_a_new_store_is_created_whole_and_reopens(tmp_path):
    db = tmp_path / "sub" / "runs.db"
    store = RunStore(db)
    assert db.stat().st_size > 0  # never seen empty: built aside, then linked into place
    assert sorted(p.name for p in db.parent.iterdir() if p.name.startswith(".")) == []
    run_id = store.start({"algorithm": "a", "scenario": "b", "seed": 0, "rounds": 1}, {})
    assert RunStore(db).run(run_id)["status"] == "running"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _create(db: str, barrier) -> None:
    barrier.wait(timeout=120)  # both imported: create at the same moment
    RunStore(db)


@pytest.mark.parametrize("old", [False, True])
def test_two_processes_opening_one_store_at_once_share_it(tmp_path, old):
    """A new store created, or an older version's store migrated, by two at once."""
    db = str(tmp_path / "runs.db")
    if old:
        RunStore(db)
        with sqlite3.connect(db) as conn:  # drop the columns later versions added
            conn.execute("ALTER TABLE runs DROP COLUMN pid")
            conn.execute("ALTER TABLE runs DROP COLUMN overrides")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_create, args=(db, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert RunStore(db).runs() == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
