"""Run ids by unique prefix: every command that takes a run id resolves a unique prefix,
names the matching ids of an ambiguous one, and says so for an unknown one."""

from __future__ import annotations

import json
import sqlite3

import pytest
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.errors import FedshiftError
from fedshift.results import store as store_module
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=2, eval_every=1, model_options={"hidden": [8]})
IDS = ["abc1230000", "abc4560000", "f00ba40000"]
runner = CliRunner()


def fixed_ids(monkeypatch, ids):
    """Make the store hand out ``ids`` in order instead of random ones."""
    queue = list(ids)

    class FixedSecrets:
        @staticmethod
        def token_hex(n):
            return queue.pop(0)

    monkeypatch.setattr(store_module, "secrets", FixedSecrets)


@pytest.fixture
def db(tmp_path, monkeypatch):
    fixed_ids(monkeypatch, IDS)
    path = tmp_path / "runs.db"
    for algorithm in ("fedavg", "local", "fedavg"):
        fs.run(algorithm=algorithm, data=toy_data(), db=path, **SETTINGS)
    return path


def test_a_unique_prefix_resolves_to_its_run(db):
    store = RunStore(db)
    assert store.resolve("abc1") == "abc1230000"
    assert store.resolve("f") == "f00ba40000"
    assert store.resolve("abc4560000") == "abc4560000"
    assert store.run("abc4")["algorithm"] == "local"


def test_an_ambiguous_prefix_names_the_ids_it_matches(db):
    with pytest.raises(FedshiftError, match="ambiguous") as e:
        RunStore(db).resolve("abc")
    assert "abc1230000" in str(e.value) and "abc4560000" in str(e.value)
    assert "f00ba40000" not in str(e.value)


@pytest.mark.parametrize("ref", ["abd", "abc12300000", "", "ABC1"])
def test_an_unknown_or_empty_id_is_one_clear_error(db, ref):
    with pytest.raises(FedshiftError, match="no run|not a run id"):
        RunStore(db).resolve(ref)


def test_an_exact_id_wins_over_longer_ids_it_prefixes(tmp_path, monkeypatch):
    fixed_ids(monkeypatch, ["abc1230000", "abc1239999"])
    path = tmp_path / "runs.db"
    for _ in range(2):
        fs.run(algorithm="fedavg", data=toy_data(), db=path, **SETTINGS)
    with sqlite3.connect(path) as conn:  # an id of another format that extends the first
        conn.execute("UPDATE runs SET run_id='abc1230000ff' WHERE run_id='abc1239999'")
    store = RunStore(path)
    assert store.resolve("abc1230000") == "abc1230000"
    assert store.resolve("abc1230000f") == "abc1230000ff"
    with pytest.raises(FedshiftError, match="ambiguous"):
        store.resolve("abc123")


def test_report_and_compare_take_prefixes(db, tmp_path):
    res = runner.invoke(app, ["report", "abc1", "f00", "--db", str(db), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "report.md").read_text()
    assert "abc1230000" in text and "f00ba40000" in text
    res = runner.invoke(
        app, ["compare", "abc1", "abc4", "--db", str(db), "--out", str(tmp_path / "c")]
    )
    assert res.exit_code == 0, res.output
    assert "abc1230000" in res.output and "abc4560000" in res.output


@pytest.mark.parametrize("command", ["report", "compare", "show"])
def test_an_ambiguous_prefix_on_the_command_line_is_one_line(db, tmp_path, command):
    res = runner.invoke(app, [command, "abc", "--db", str(db)])
    assert res.exit_code == 2
    text = res.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert "abc1230000" in text and "abc4560000" in text


def test_resume_takes_a_prefix(tmp_path):
    db = tmp_path / "r.db"
    res = runner.invoke(
        app,
        ["run", "--set", "scenario=digits-shortcut", "--rounds", "2", "--db", str(db), "--json"],
    )
    assert res.exit_code == 0, res.output
    run_id = json.loads(res.stdout.strip().splitlines()[-1])["run_id"]
    store = RunStore(db)
    store.fail(run_id, "interrupted", "stopped for the test")
    res = runner.invoke(app, ["run", "--resume", run_id[:5], "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["run_id"] == run_id
    assert store.run(run_id)["status"] == "done"
    res = runner.invoke(app, ["run", "--resume", run_id[:5], "--db", str(db)])
    assert res.exit_code == 2 and f"run {run_id!r} already finished" in res.output


def test_runs_shows_whole_ids_in_a_narrow_terminal(db):
    res = runner.invoke(app, ["runs", "--db", str(db)], env={"COLUMNS": "60"})
    assert res.exit_code == 0, res.output
    for run_id in IDS:
        assert run_id in res.output
