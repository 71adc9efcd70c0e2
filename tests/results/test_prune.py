"""`fedshift runs --prune [--dry-run]`: deletes the checkpoints of finished runs only."""

from __future__ import annotations

import json
import sqlite3

from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.api import checkpoint_path
from fedshift.cli import app
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=2, model_options={"hidden": [8]})
runner = CliRunner()


def stored_runs(db):
    """One run in each state, each with a checkpoint file."""
    ids = {
        name: fs.run(algorithm=alg, data=toy_data(), db=db, **SETTINGS).run_id
        for name, alg in [
            ("done", "fedavg"),
            ("done_local", "local"),
            ("interrupted", "fedavg"),
            ("failed", "fedavg"),
            ("no_metrics", "fedavg"),
        ]
    }
    store = RunStore(db)
    store.fail(ids["interrupted"], "interrupted", "stopped after round 2")
    store.fail(ids["failed"], "failed", "RuntimeError: boom")
    with sqlite3.connect(db) as conn:  # done without final metrics: --resume repairs it
        conn.execute("UPDATE runs SET metrics=NULL WHERE run_id=?", (ids["no_metrics"],))
    ids["running"] = store.start(store.run(ids["done"])["config"], {})  # this process: alive
    checkpoint_path(db, ids["running"]).write_bytes(b"in progress")
    assert all(checkpoint_path(db, i).is_file() for i in ids.values())
    return ids


def prune(db, *args):
    res = runner.invoke(app, ["runs", "--db", str(db), "--prune", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_prune_deletes_only_the_checkpoints_of_done_runs(tmp_path):
    db = tmp_path / "r.db"
    ids = stored_runs(db)
    finished = {ids["done"], ids["done_local"]}
    plan = prune(db, "--dry-run")
    assert plan["dry_run"] and {c["run_id"] for c in plan["checkpoints"]} == finished
    assert plan["bytes"] == sum(checkpoint_path(db, i).stat().st_size for i in finished)
    assert all(checkpoint_path(db, i).is_file() for i in ids.values())  # nothing deleted

    done = prune(db, "--where", "algorithm=local")
    assert [c["run_id"] for c in done["checkpoints"]] == [ids["done_local"]]
    assert not checkpoint_path(db, ids["done_local"]).exists()
    assert checkpoint_path(db, ids["done"]).is_file()

    done = prune(db)
    assert [c["run_id"] for c in done["checkpoints"]] == [ids["done"]]
    for name in ("interrupted", "failed", "no_metrics", "running"):
        assert checkpoint_path(db, ids[name]).is_file(), name
    assert fs.load_runs(db)["run_id"].tolist() == list(ids.values())  # runs stay in the store
    assert prune(db)["checkpoints"] == []


def test_dry_run_needs_prune(tmp_path):
    db = tmp_path / "r.db"
    fs.run(algorithm="fedavg", data=toy_data(), db=db, **SETTINGS)
    res = runner.invoke(app, ["runs", "--db", str(db), "--dry-run"])
    assert res.exit_code == 2 and "--dry-run goes with --prune" in res.output
