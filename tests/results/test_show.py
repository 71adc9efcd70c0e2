"""`fedshift show RUN`: every stored config key, the status, final metrics and the curve."""

from __future__ import annotations

import json

import pytest
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.results.show import curve_rows
from fedshift.results.store import RunStore

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    db = tmp_path_factory.mktemp("show") / "r.db"
    res = invoke(
        "run",
        "--set",
        "scenario=digits-shortcut",
        "--set",
        "scenario.clients=4",
        "--set",
        "algorithm=fedprox",
        "--set",
        "algorithm.mu=0.25",
        "--rounds",
        "3",
        "--seed",
        "7",
        "--db",
        str(db),
        "--json",
    )
    assert res.exit_code == 0, res.output
    return db, json.loads(res.stdout.strip().splitlines()[-1])


def test_show_prints_every_config_key_status_and_final_metrics(digits_run):
    db, summary = digits_run
    res = invoke("show", summary["run_id"][:4], "--db", str(db))
    assert res.exit_code == 0, res.output
    text = res.output
    record = RunStore(db).run(summary["run_id"])
    for key in record["config"]:
        assert key in text, key
    assert "scenario.clients" in text and "algorithm.mu" in text and "0.25" in text
    assert f"run {summary['run_id']}" in text and "status done" in text
    assert "seed 7" in text and "rounds 3/3" in text
    assert f"{summary['metrics']['worst']:.1f}" in text
    assert "training curve" in text


def test_show_json_is_the_whole_stored_run(digits_run):
    db, summary = digits_run
    res = invoke("show", summary["run_id"], "--db", str(db), "--json")
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout.strip().splitlines()[-1])
    assert shown["run_id"] == summary["run_id"] and shown["status"] == "done"
    assert str(shown["config"]["algorithm.mu"]) == "0.25"  # as given: the store keeps it
    assert str(shown["config"]["scenario.clients"]) == "4"
    assert shown["metrics"] == summary["metrics"] and shown["seed"] == 7
    assert [r["round"] for r in shown["round_metrics"]] == [1, 2, 3]
    assert shown["resumable"] is False
    assert {r["split"] for r in shown["client_accuracy"]} == {"test", "val"}


def test_the_curve_keeps_evaluated_first_and_last_rounds(tmp_path):
    db = tmp_path / "r.db"
    out = fs.run(
        algorithm="fedavg",
        data=toy_data(),
        db=db,
        lr=0.1,
        batch_size=8,
        rounds=7,
        eval_every=3,
        model_options={"hidden": [8]},
    )
    record = RunStore(db).run(out.run_id)
    evaluated = {r["round"] for r in record["round_metrics"] if r["metrics"]}
    assert evaluated and len(evaluated) < 6  # the test needs rounds without evaluation
    rows, stored = curve_rows(record)
    assert stored == 7
    assert [r["round"] for r in rows] == sorted(evaluated | {1, 7})
    every, _ = curve_rows(record, all_rounds=True)
    assert [r["round"] for r in every] == list(range(1, 8))
    assert every[-1]["MB"] == pytest.approx((out.result.bytes_up + out.result.bytes_down) / 1e6)
    last = record["round_metrics"][-1]["metrics"]
    assert rows[-1]["average"] == last["average"] and rows[-1]["loss"] > 0
    res = invoke("show", out.run_id, "--db", str(db))
    assert "of 7 stored rounds shown" in res.output
    assert "of 7" not in invoke("show", out.run_id, "--db", str(db), "--all-rounds").output


def test_an_unfinished_run_shows_its_status_and_error(digits_run):
    db, summary = digits_run
    record = RunStore(db).run(summary["run_id"])
    store = RunStore(db)
    run_id = store.start(record["config"], {})
    store.fail(run_id, "failed", "RuntimeError: simulated crash")
    res = invoke("show", run_id, "--db", str(db))
    assert res.exit_code == 0, res.output
    assert "status failed" in res.output and "simulated crash" in res.output
    assert "no final metrics" in res.output


def test_show_of_an_unknown_run_or_store_is_one_line(digits_run, tmp_path):
    db, _ = digits_run
    for args in (["show", "fffff", "--db", str(db)], ["show", "ab", "--db", str(tmp_path / "x")]):
        res = invoke(*args)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
        assert "Traceback" not in res.output
