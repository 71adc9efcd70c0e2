"""Diverged runs fail honestly: a non-finite global or personal state, or too many rounds
that trained nothing, end the run with status ``diverged``, no metrics, exit code 3 and one
sentence; its rounds and last checkpoint are kept. Injected faults are not divergence."""

from __future__ import annotations

import json
import math

import pytest
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.api import checkpoint_path
from fedshift.cli import app
from fedshift.engine.checkpoint import load_checkpoint
from fedshift.engine.runner import (
    DIVERGED_STREAK,
    Diverged,
    LostRounds,
    RoundRecord,
    lost_round,
)
from fedshift.results.store import RunStore

SETTINGS = dict(batch_size=8, rounds=10, model_options={"hidden": [8]}, eval_every=1)


def run(db=None, **kw):
    return fs.run(
        algorithm=kw.pop("algorithm", "fedavg"), data=toy_data(), db=db, **{**SETTINGS, **kw}
    )


def record(lost: bool, why: str = "nonfinite") -> RoundRecord:
    rec = RoundRecord(1, 1.0, 0, 0, 0.0)
    if lost:
        rec.extras = {
            "events": [{"client": 0, "event": why}, {"client": None, "event": "no-usable-upload"}]
        }
    return rec


def test_lost_rounds_are_numerical_failures_not_injected_faults():
    assert lost_round(record(True)) and lost_round(record(True, "norm"))
    assert not lost_round(record(False))
    nan_loss = RoundRecord(1, math.nan, 0, 0, 0.0)
    assert lost_round(nan_loss)
    dropped = record(False)
    dropped.extras = {
        "events": [{"client": 0, "event": "dropped"}, {"client": None, "event": "no-usable-upload"}]
    }
    assert not lost_round(dropped)
    corrupted = record(False)  # an injected corruption is then screened as non-finite
    corrupted.extras = {
        "events": [
            {"client": 0, "event": "corrupted"},
            {"client": 0, "event": "nonfinite"},
            {"client": None, "event": "no-usable-upload"},
        ]
    }
    assert not lost_round(corrupted)


def verdict(records, rounds):
    return LostRounds(records).verdict(rounds)


def test_divergence_threshold_is_more_than_half_or_a_streak():
    # alternating lost rounds: never a streak; diverged once more than half of 10 are lost
    alternating = [record(i % 2 == 0) for i in range(10)]  # 5 lost
    assert verdict(alternating, 10) is None
    assert "6 of its 10 rounds" in verdict([*alternating[:9], record(True)], 10)
    streak = [record(False)] * 3 + [record(True)] * DIVERGED_STREAK
    assert "in a row" in verdict(streak, 100)
    assert verdict(streak[:-1], 100) is None
    assert verdict([*streak, record(False)], 100) is None  # a usable round ends the streak
    assert "faults.max_norm" in verdict([record(True, "norm")] * 2, 2)
    assert "lower lr" in verdict([record(True)] * 2, 2)


def test_nan_training_stops_as_diverged_and_keeps_rounds_and_checkpoint(tmp_path):
    db = tmp_path / "runs.db"
    # round 1 still aggregates (to a huge state); rounds 2 to 6 train nothing
    with pytest.raises(Diverged, match="round 6: 5 rounds in a row.*lower lr"):
        run(db=db, lr=1e18, checkpoint_every=1)
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "diverged" and rec["metrics"] is None
    assert rec["rounds_done"] == 6 and "lower lr" in rec["error"]
    rows = RunStore(db).run(rec["run_id"])["round_metrics"]
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1]["loss"] is None  # NaN is stored as NULL
    # no checkpoint of the round that found the divergence; the one before it stays
    assert load_checkpoint(checkpoint_path(db, rec["run_id"]))["rounds_done"] == 5


def test_every_upload_excluded_by_the_norm_screen_is_divergence(tmp_path):
    with pytest.raises(Diverged, match="raise faults.max_norm"):
        run(faults_options={"max_norm": 0.5}, rounds=4)


@pytest.mark.parametrize("faults", [{"drop": 0.5}, {"clients": [0], "corrupt": 1.0}])
def test_uploads_lost_to_injected_faults_are_not_divergence(faults):
    out = run(faults_options=faults, rounds=4)
    assert out.metrics["average"] > 0


@pytest.mark.parametrize("faults", [{"drop": 1.0}, {"corrupt": 1.0}, {"delay": 10}])
def test_a_run_that_aggregated_no_upload_at_all_is_not_a_success(faults):
    """Issue 22: every upload dropped, corrupted or delayed past the end exited 0 as done
    with the initial model; the run ends diverged, its rounds kept."""
    with pytest.raises(Diverged, match="never left its initialisation"):
        run(faults_options=faults, rounds=4)


def test_a_sound_run_is_not_diverged():
    assert run(lr=0.1, rounds=3).metrics["average"] > 0


def test_cli_diverged_run_exits_3_with_one_sentence(tmp_path):
    db = tmp_path / "r.db"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--set",
            "algorithm=scaffold",
            "--set",
            "algorithm.server_lr=1e20",
            "--rounds",
            "4",
            "--db",
            str(db),
            "--json",
        ],
    )
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    assert "diverged in round 2" in res.output and "personal state" in res.output
    assert "lower lr" in res.output
    listed = json.loads(CliRunner().invoke(app, ["runs", "--db", str(db), "--json"]).stdout)
    assert [(r["status"], r["rounds_done"]) for r in listed] == [("diverged", 1)]
