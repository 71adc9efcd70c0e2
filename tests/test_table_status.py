"""`fedshift reproduce TABLE --status`: a long table's runs in the store, run by run (done
with its figures, stopped with its rounds, not started), matched as `--resume` matches
them, with nothing trained."""

from __future__ import annotations

import json
import statistics

import pytest
from test_reproduce import TWO
from toy import power_cut_at
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.reproduce import reproduce
from fedshift.results.store import RunStore
from fedshift.table_status import table_status


@pytest.fixture
def stopped_table(tmp_path, monkeypatch):
    """TWO (FedAvg, FedProx × seeds 0, 1) at 4 rounds, cut in FedAvg seed 1's third round."""
    path = tmp_path / "two.toml"
    path.write_text(TWO.replace("rounds = 2", "rounds = 4\ncheckpoint_every = 1"))
    db = tmp_path / "runs.db"
    with power_cut_at(monkeypatch, call=7), pytest.raises(RuntimeError):
        reproduce(str(path), db=db, out_dir=tmp_path / "a", extra={"threads": 1})
    return path, db


def test_status_names_each_run_done_stopped_or_not_started(stopped_table):
    path, db = stopped_table
    stored = {r["run_id"]: r for r in RunStore(db).runs()}
    # another thread count is the same run (a machine key), as for --resume
    got = table_status(str(path), db=db, extra={"threads": 2})
    rows = [(r["method"], r["seed"], r["state"], r["rounds_done"]) for r in got["runs"]]
    assert rows == [
        ("FedAvg", 0, "done", 4),
        ("FedAvg", 1, "failed", 2),
        ("FedProx", 0, "not started", 0),
        ("FedProx", 1, "not started", 0),
    ]
    done = got["runs"][0]
    assert done["metrics"]["worst"] == pytest.approx(stored[done["run_id"]]["metrics"]["worst"])
    assert done["degenerate"] is False and done["published"] == {"worst": 10.0, "average": 50.0}
    assert got["counts"] == {"done": 1, "failed": 1, "not started": 2}
    # the interim summary: one finished FedAvg seed of two (no spread from one), no FedProx
    fedavg, fedprox = got["so_far"]
    assert (fedavg["method"], fedavg["done"], fedavg["planned"]) == ("FedAvg", 1, 2)
    assert fedavg["worst"] == {"mean": done["metrics"]["worst"], "std": None}
    assert fedavg["degenerate"] is False and fedavg["published"] == done["published"]
    assert (fedprox["done"], fedprox["worst"]) == (0, {"mean": None, "std": None})
    # two FedAvg rounds left at the finished FedAvg run's pace; FedProx has no pace yet
    per_round = stored[done["run_id"]]["time_s"] / 4
    assert got["left_s"] == pytest.approx(2 * per_round)
    assert got["unpaced"] == ["FedProx"] and got["paced_by_rounds"] == []
    # other settings are other runs: nothing of them is in the store
    other = table_status(str(path), db=db, extra={"lr": 0.2})
    assert {r["state"] for r in other["runs"]} == {"not started"}
    assert len(RunStore(db).runs()) == len(stored)  # nothing trained


def test_status_paces_a_method_with_no_finished_run_by_its_logged_rounds(tmp_path, monkeypatch):
    path = tmp_path / "two.toml"
    path.write_text(TWO.replace("rounds = 2", "rounds = 4\ncheckpoint_every = 1"))
    db = tmp_path / "runs.db"
    with power_cut_at(monkeypatch, call=3), pytest.raises(RuntimeError):  # FedAvg seed 0, round 3
        reproduce(str(path), db=db, out_dir=tmp_path / "a", extra={"threads": 1})
    got = table_status(str(path), db=db)
    stopped = got["runs"][0]
    assert (stopped["state"], stopped["rounds_done"]) == ("failed", 2)
    logged = RunStore(db).round_seconds([stopped["run_id"]])[stopped["run_id"]]
    assert len(logged) == 2 and all(t > 0 for t in logged)
    assert stopped["elapsed_s"] == pytest.approx(sum(logged))  # its hours so far
    # seed 0's two rounds left and seed 1's four, at the median of the two logged rounds
    assert got["left_s"] == pytest.approx(6 * statistics.median(logged))
    assert got["paced_by_rounds"] == ["FedAvg"] and got["unpaced"] == ["FedProx"]
    res = CliRunner().invoke(app, ["reproduce", str(path), "--db", str(db), "--status"])
    assert "FedAvg: at the median logged round of runs not yet finished" in res.stderr
    assert f"{sum(logged) / 3600:.2f}+" in res.stdout  # the stopped run's hours so far


def test_status_cli_prints_the_runs_and_a_json_summary(stopped_table, tmp_path):
    path, db = stopped_table
    runner = CliRunner()
    res = runner.invoke(app, ["reproduce", str(path), "--db", str(db), "--status", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["total"] == 4 and summary["counts"]["done"] == 1
    assert "4 runs: 1 done, 1 failed, 2 not started" in res.stderr
    assert "finished seeds so far" in res.stderr and "1/2" in res.stderr  # FedAvg only
    so_far = res.stderr.split("finished seeds so far")[1].split("4 runs:")[0]
    assert "FedAvg" in so_far and "FedProx" not in so_far
    missing = runner.invoke(
        app, ["reproduce", str(path), "--db", str(tmp_path / "none.db"), "--status"]
    )
    assert missing.exit_code == 0 and "4 runs: 4 not started" in missing.stderr
    both = runner.invoke(app, ["reproduce", str(path), "--status", "--estimate"])
    assert both.exit_code != 0 and "pick one" in both.output


def test_status_of_a_sweep_table_lists_every_value_with_nothing_stored(tmp_path):
    got = table_status("fedipg-rotmnist5", db=tmp_path / "none.db", methods=["FedIPG"])
    assert got["sweep_key"] == "scenario.held_out"
    assert [(r["seed"], r["value"]) for r in got["runs"][:7]] == [
        (0, 0),
        (0, 15),
        (0, 30),
        (0, 45),
        (0, 60),
        (0, 75),
        (1, 0),
    ]
    assert got["counts"] == {"not started": 18} and got["unpaced"] == ["FedIPG"]
    assert got["left_s"] == 0 and not (tmp_path / "none.db").exists()  # nothing created
