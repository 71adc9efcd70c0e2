"""`fedshift runs`: the config keys that vary among the listed runs become columns, and
``--where key=value`` keeps the runs asked for; ``--json`` rows carry each run's config."""

from __future__ import annotations

import json

import pytest
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.config import canonical
from fedshift.results.select import varying_keys

runner = CliRunner()
SETTINGS = dict(batch_size=8, rounds=1, model_options={"hidden": [8]})


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory):
    """A 2 × 2 sweep over algorithm.mu and lr, plus one local run."""
    db = tmp_path_factory.mktemp("runs") / "r.db"
    ids = {}
    for mu in (0.01, 0.1):
        for lr in (0.05, 0.2):
            out = fs.run(
                algorithm="fedprox",
                data=toy_data(),
                db=db,
                lr=lr,
                algorithm_options={"mu": mu},
                **SETTINGS,
            )
            ids[mu, lr] = out.run_id
    ids["local"] = fs.run(algorithm="local", data=toy_data(), db=db, lr=0.2, **SETTINGS).run_id
    return db, ids


def listed(db, *args):
    res = invoke("runs", "--db", str(db), *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_keys_that_vary_are_columns_with_each_runs_value(sweep_db):
    db, ids = sweep_db
    res = invoke("runs", "--db", str(db), "--where", "algorithm=fedprox")
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if "run_id" in line)
    assert "algorithm.mu" in header and "lr" in header
    assert "batch_size" not in header and "momentum" not in header  # the same in every run
    cells = {line.split()[0]: line.split() for line in res.output.splitlines() if line.strip()}
    for key, run_id in ids.items():
        if key == "local":
            assert run_id not in res.output
            continue
        mu, lr = key
        assert str(mu) in cells[run_id] and str(lr) in cells[run_id]


def test_where_filters_on_config_keys_algorithm_and_status(sweep_db):
    db, ids = sweep_db
    assert len(listed(db)) == 5
    mu = listed(db, "--where", "algorithm.mu=0.1")
    assert {r["run_id"] for r in mu} == {ids[0.1, 0.05], ids[0.1, 0.2]}
    both = listed(db, "--where", "algorithm.mu=1e-1", "--where", "lr=0.2")
    assert [r["run_id"] for r in both] == [ids[0.1, 0.2]]
    assert {r["run_id"] for r in listed(db, "--where", "algorithm=local")} == {ids["local"]}
    assert len(listed(db, "--where", "status=done", "--where", "scenario=toy")) == 5
    assert listed(db, "--where", "status=failed") == []
    res = invoke("runs", "--db", str(db), "--where", "lr=0.3")
    assert res.exit_code == 0 and "no run matches" in res.output


def test_json_rows_carry_the_config(sweep_db):
    db, ids = sweep_db
    (row,) = listed(db, "--where", "algorithm=local")
    assert row["config"]["algorithm"] == "local" and row["config"]["lr"] == 0.2
    assert row["config"]["model.hidden"] == [8]
    for k in ("run_id", "status", "algorithm", "scenario", "seed", "rounds", "rounds_done"):
        assert k in row  # the earlier keys stay (a contract)


def test_a_value_given_on_the_command_line_matches_a_number(sweep_db, tmp_path):
    """The store keeps ``--set lr=0.2`` as the string "0.2": it is still lr = 0.2."""
    db = tmp_path / "r.db"
    res = invoke(
        "run", "--set", "scenario=digits-shortcut", "--set", "lr=0.2", "--rounds", "1",
        "--db", str(db), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert len(listed(db, "--where", "lr=0.20")) == 1 and listed(db, "--where", "lr=2") == []
    assert canonical("0.2") == canonical(0.2) == canonical("2e-1")
    assert canonical("[8, 16]") == canonical([8, 16.0]) and canonical("true") is True


def test_absent_keys_count_as_a_value_and_fixed_columns_are_skipped():
    runs = [
        {"config": {"algorithm": "fedavg", "lr": 0.1, "seed": 0}},
        {"config": {"algorithm": "fedprox", "lr": "0.1", "seed": 1, "algorithm.mu": 0.1}},
    ]
    assert varying_keys(runs) == ["algorithm", "seed", "algorithm.mu"]
    assert varying_keys(runs, skip=("algorithm", "seed")) == ["algorithm.mu"]


@pytest.mark.parametrize(
    ("where", "named"), [("lrr=0.1", "did you mean 'lr'"), ("lr", "key=value")]
)
def test_a_bad_where_is_one_line(sweep_db, where, named):
    db, _ = sweep_db
    res = invoke("runs", "--db", str(db), "--where", where)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1 and named in res.output


def test_markup_in_stored_text_is_printed_as_written(sweep_db, tmp_path):
    """Config values, keys and the store's path are user text: "[/red]" in any of them is
    shown as written, never parsed as rich markup (which would raise a MarkupError)."""
    import shutil
    import sqlite3

    db = tmp_path / "[red]store" / "r.db"
    db.parent.mkdir()
    shutil.copy(sweep_db[0], db)
    run_id = sweep_db[1]["local"]
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT config FROM runs WHERE run_id=?", (run_id,)).fetchone()
        config = {**json.loads(text), "lr": "[/red][bold]", "[/b]key": "[x]"}
        conn.execute("UPDATE runs SET config=? WHERE run_id=?", (json.dumps(config), run_id))
    res = invoke("runs", "--db", str(db))
    assert res.exit_code == 0, res.output
    assert "[/red][bold]" in res.output and "[/b]key" in res.output
    assert "[red]store" in next(line for line in res.output.splitlines() if "runs in" in line)


def test_runs_started_together_share_a_stored_group_and_filter_by_it(tmp_path):
    """`run --seeds` and `sweep` tag their runs with one group id (kept in the store and
    in their --json); `runs --group` / `--sweep` list one group; a lone run has none."""
    db = str(tmp_path / "g.db")
    base = ["--set", "scenario=digits-shortcut", "--rounds", "1", "--db", db, "--json"]
    seeds = json.loads(invoke("run", *base, "--seeds", "0,1").stdout.strip().splitlines()[-1])
    sweep = json.loads(
        invoke("sweep", *base, "--grid", "lr=0.05,0.1").stdout.strip().splitlines()[-1]
    )
    lone = json.loads(invoke("run", *base).stdout.strip().splitlines()[-1])
    assert seeds["group"].startswith("seeds-") and sweep["group"].startswith("sweep-")

    def listed(*args):
        res = invoke("runs", "--db", db, "--json", *args)
        assert res.exit_code == 0, res.output
        return {r["run_id"]: r["group"] for r in json.loads(res.stdout.strip().splitlines()[-1])}

    everything = listed()
    assert everything[lone["run_id"]] is None
    assert set(listed("--group", seeds["group"])) == set(seeds["run_ids"])
    assert set(listed("--group", "seeds-")) == set(seeds["run_ids"])
    short = sweep["group"].removeprefix("sweep-")
    assert (
        set(listed("--sweep", short))
        == set(sweep["run_ids"])
        == set(listed("--sweep", sweep["group"]))
    )
    table = invoke("runs", "--db", db).stdout
    assert "group" in table and seeds["group"] in table
    both = invoke("runs", "--db", db, "--group", "x", "--sweep", "y")
    assert both.exit_code == 2 and "not both" in both.output
