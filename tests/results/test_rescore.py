"""``fedshift rescore``: a run finished before a degeneracy rule existed gets its verdict
from its final checkpoint, without re-training, and only when the re-evaluation reproduces
what the store holds."""

from __future__ import annotations

import json
import sqlite3

import pytest
from test_report_honesty import BACKWARDS
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.errors import FedshiftError
from fedshift.rescore import rescore
from fedshift.results.store import RunStore

SETTINGS = dict(scenario="digits-shortcut", rounds=3, seed=0, lr=0.05, batch_size=10)
NEW_KEYS = ("train_accuracy_pooled", "train_majority_share")


def as_before_the_rule(db, run_id, **metrics_update) -> None:
    """Make a stored run look as a run finished before the training-fit rule does."""
    with sqlite3.connect(db) as conn:
        (raw,) = conn.execute("SELECT metrics FROM runs WHERE run_id=?", (run_id,)).fetchone()
        m = json.loads(raw)
        for k in NEW_KEYS:
            m.pop(k)
        m.update(degenerate=False, degenerate_why=None, **metrics_update)
        conn.execute("UPDATE runs SET metrics=? WHERE run_id=?", (json.dumps(m), run_id))


def test_a_run_finished_before_the_rule_gets_its_verdict(tmp_path):
    db = tmp_path / "runs.db"
    bad = fs.run(algorithm=BACKWARDS, db=db, **SETTINGS)
    good = fs.run(algorithm="fedavg", db=db, **SETTINGS)
    for out in (bad, good):
        as_before_the_rule(db, out.run_id)
    rows = {r["run_id"]: r for r in rescore(db, [bad.run_id, good.run_id])}
    assert rows[bad.run_id]["degenerate"] and not rows[bad.run_id]["degenerate_before"]
    assert not rows[good.run_id]["degenerate"]
    store = RunStore(db)
    again = store.run(bad.run_id)
    assert again["metrics"]["degenerate"] is True
    assert "own training data" in again["metrics"]["degenerate_why"]
    assert again["metrics"]["worst"] == pytest.approx(bad.metrics["worst"])
    entry = again["environment"]["rescored"][-1]
    assert set(NEW_KEYS) <= set(entry["changed"]) and "degenerate" in entry["changed"]
    assert all(k in store.run(good.run_id)["metrics"] for k in NEW_KEYS)


def test_a_run_whose_numbers_do_not_reproduce_is_refused(tmp_path):
    db = tmp_path / "runs.db"
    out = fs.run(algorithm="fedavg", db=db, **SETTINGS)
    as_before_the_rule(db, out.run_id, worst=out.metrics["worst"] + 1.0)
    with pytest.raises(FedshiftError, match="not re-scored"):
        rescore(db, [out.run_id])
    assert "train_accuracy_pooled" not in RunStore(db).run(out.run_id)["metrics"]


def test_cli_rescore_prints_the_verdict_and_refuses_in_one_sentence(tmp_path):
    db = tmp_path / "runs.db"
    out = fs.run(algorithm=BACKWARDS, db=db, **SETTINGS)
    as_before_the_rule(db, out.run_id)
    res = CliRunner().invoke(app, ["rescore", out.run_id, "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "degenerate (was not)" in res.output and "own training data" in res.output
    (tmp_path / "checkpoints" / f"{out.run_id}.pt").unlink()
    res = CliRunner().invoke(app, ["rescore", out.run_id, "--db", str(db)])
    assert res.exit_code != 0 and "checkpoint" in res.output and "Traceback" not in res.output
