"""The run store as pandas DataFrames: ``fs.load_runs``, ``fs.load_rounds``,
``fs.load_client_metrics``, ``RunOutcome.frame()`` and ``fedshift compare --json/--csv``."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore

SETTINGS = dict(batch_size=8, rounds=4, eval_every=2, model_options={"hidden": [8]})
runner = CliRunner()


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Two toy runs through the API and one digits run through the CLI (``--set lr=0.2``
    is stored as the text "0.2")."""
    db = tmp_path_factory.mktemp("frames") / "r.db"
    outs = [
        fs.run(algorithm="fedprox", data=toy_data(), db=db, lr=lr, **SETTINGS) for lr in (0.05, 0.1)
    ]
    res = runner.invoke(
        app,
        ["run", "--set", "scenario=digits-shortcut", "--set", "lr=0.2", "--set",
         "scenario.clients=3", "--rounds", "2", "--db", str(db), "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    cli_id = json.loads(res.stdout.strip().splitlines()[-1])["run_id"]
    return db, outs, cli_id


def test_load_runs_has_a_row_per_run_and_the_config_as_typed_columns(stored):
    db, outs, cli_id = stored
    runs = fs.load_runs(db)
    assert isinstance(runs, pd.DataFrame) and len(runs) == 3
    assert list(runs["run_id"]) == [outs[0].run_id, outs[1].run_id, cli_id]
    assert runs["lr"].tolist() == [0.05, 0.1, 0.2]  # "0.2" from the CLI is a number here
    by_id = runs.set_index("run_id")
    assert by_id.loc[outs[1].run_id, "worst"] == outs[1].metrics["worst"]
    assert by_id.loc[cli_id, "scenario.clients"] == 3
    assert pd.isna(by_id.loc[outs[0].run_id, "scenario.clients"])  # a key this run lacks
    assert by_id.loc[outs[0].run_id, "model.hidden"] == [8]
    assert set(runs["status"]) == {"done"} and (runs["rounds_done"] == runs["rounds"]).all()


def test_load_rounds_has_a_row_per_round_with_the_stored_curve(stored):
    db, outs, _ = stored
    rounds = fs.load_rounds(db, outs[0].run_id[:6])
    assert rounds["round"].tolist() == [1, 2, 3, 4] and set(rounds["run_id"]) == {outs[0].run_id}
    record = RunStore(db).run(outs[0].run_id)
    for row, rec in zip(rounds.itertuples(), record["round_metrics"], strict=True):
        assert row.loss == pytest.approx(rec["loss"]) and row.bytes_up == rec["bytes_up"]
        if rec["metrics"]:
            assert row.average == rec["metrics"]["average"]
        else:
            assert pd.isna(row.average)
    last = rounds.iloc[-1]
    assert last["per_env.far"] == outs[0].result.rounds[-1].metrics["per_env"]["far"]
    both = fs.load_rounds(db, [o.run_id for o in outs])
    assert len(both) == 8 and list(both["run_id"].unique()) == [o.run_id for o in outs]
    assert len(fs.load_rounds(db)) == 4 + 4 + 2


def test_load_client_metrics_matches_the_final_metrics(stored):
    db, outs, _ = stored
    clients = fs.load_client_metrics(db, [outs[1].run_id])
    test = clients[clients["split"] == "test"]
    assert len(test) == 7 * 2 and set(clients["split"]) == {"test", "val"}
    per_env = test.groupby("env")["accuracy"].mean()
    assert per_env["far"] == pytest.approx(outs[1].metrics["per_env"]["far"])
    frame = outs[1].frame()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["client", "env", "accuracy"]
    merged = frame.merge(test, on=["client", "env"], suffixes=("", "_stored"))
    assert len(merged) == 14 and (merged["accuracy"] - merged["accuracy_stored"]).abs().max() < 1e-9


def test_frame_is_a_dataframe_without_a_store():
    out = fs.run(algorithm="fedavg", data=toy_data(), lr=0.1, **SETTINGS)
    assert isinstance(out.frame(), pd.DataFrame) and len(out.frame()) == 7 * 2


def test_bad_ids_and_a_missing_store_are_clear_errors(stored, tmp_path):
    db, outs, _ = stored
    with pytest.raises(FedshiftError, match="no run 'fffff'"):
        fs.load_rounds(db, "fffff")
    with pytest.raises(FedshiftError, match="no run store"):
        fs.load_runs(tmp_path / "none.db")
    assert not (tmp_path / "none.db").exists()


def test_compare_writes_json_and_csv(stored, tmp_path):
    db, outs, _ = stored
    ids = [o.run_id[:5] for o in outs]
    csv = tmp_path / "out" / "cmp.csv"
    res = runner.invoke(
        app,
        ["compare", *ids, "--db", str(db), "--out", str(tmp_path), "--json", "--csv", str(csv)],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert [r["run_id"] for r in summary["runs"]] == [o.run_id for o in outs]
    assert summary["runs"][0]["metrics"] == outs[0].metrics
    assert summary["runs"][1]["config"]["lr"] == 0.1 and summary["plot"].endswith(".png")
    table = pd.read_csv(csv)
    assert table["run_id"].tolist() == [o.run_id for o in outs]
    assert table["worst"].tolist() == pytest.approx([o.metrics["worst"] for o in outs])
    assert table["per_env.near"].tolist() == pytest.approx(
        [o.metrics["per_env"]["near"] for o in outs]
    )
    out = tmp_path / "plots"
    bad = runner.invoke(
        app, ["compare", *ids, "--db", str(db), "--csv", str(tmp_path), "--out", str(out)]
    )
    assert bad.exit_code == 2 and "is a folder" in bad.output
    assert not out.exists()  # refused before any work
