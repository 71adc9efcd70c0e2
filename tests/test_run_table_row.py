"""`fedshift run TABLE --method NAME`: one method (row) of a paper table with exactly the
settings `fedshift reproduce` gives it; one-sentence errors for a table without --method,
an unknown or ambiguous method, and --method with anything but a table; `list presets`
tells run presets and paper tables apart."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.reproduce import reproduce
from fedshift.results.store import RunStore
from fedshift.tables import load_table, method_config

runner = CliRunner()

TINY = """
[table]
id = "tiny"
title = "three methods on digits-shortcut"
source = "a test table"
metrics = ["worst", "average"]
seeds = 2

[run]
rounds = 2
lr = 0.05
batch_size = 20
local_steps = 3

[run.scenario]
name = "digits-shortcut"
clients = 4

[[method]]
name = "FedAvg"
algorithm = "fedavg"
published = { worst = 10.0, average = 50.0 }

[[method]]
name = "FedProx (mu 0.1)"
algorithm = "fedprox"
options = { mu = 0.1 }
set = { lr = 0.1 }
published = { worst = 12.0, average = 52.0 }

[[method]]
name = "FedProx (mu 1)"
algorithm = "fedprox"
options = { mu = 1.0 }
published = { worst = 11.0, average = 51.0 }
"""


def invoke(*args: str):
    return runner.invoke(app, list(args))


def last_json(text: str):
    return json.loads(text.strip().splitlines()[-1])


def one_line_error(res, *named: str) -> str:
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    for n in named:
        assert n in text, text
    return text


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_a_row_runs_with_the_settings_reproduce_gives_it(tiny, tmp_path):
    db = tmp_path / "r.db"
    ours = reproduce(
        str(tiny), methods=["FedProx (mu 0.1)"], seeds=1, rounds=1, db=db, out_dir=tmp_path / "rep"
    )
    res = invoke("run", str(tiny), "--method", "fedprox (MU 1)", "--rounds", "1", "--db", str(db))
    assert res.exit_code == 0, res.output  # a row by its name, in any case
    res = invoke(
        "run", str(tiny), "--method", "FedProx (mu 0.1)", "--rounds", "1", "--db", str(db), "--json"
    )
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    store = RunStore(db)
    by_run = store.run(s["run_id"])
    by_reproduce = store.run(ours["methods"][0]["run_ids"][0])
    assert by_run["config"] == by_reproduce["config"]
    cfg = by_run["config"]
    assert cfg["algorithm"] == "fedprox" and float(cfg["algorithm.mu"]) == 0.1
    assert float(cfg["lr"]) == 0.1 and cfg["local_steps"] == 3 and cfg["rounds"] == 1
    assert s["metrics"]["per_env"] == by_reproduce["metrics"]["per_env"]  # same data, same run
    # run options and --set keep working on top, --seeds too
    res = invoke(
        "run", str(tiny), "--method", "FedAvg", "--seeds", "0,1", "--set", "lr=0.02",
        "--rounds", "1", "--db", str(db), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    assert s["seeds"] == [0, 1] and s["algorithm"] == "fedavg"
    assert all(float(store.run(r)["config"]["lr"]) == 0.02 for r in s["run_ids"])


def test_a_row_of_a_shipped_table(shared_datasets, tmp_path):
    """thesis-5.1-cmnist8's FedPIN row, shrunk with --rounds and scenario.samples."""
    db = tmp_path / "r.db"
    small = ["--set", "scenario.samples=400", "--set", "scenario.test_samples=200"]
    res = invoke(
        "run", "thesis-5.1-cmnist8", "--method", "FedPIN", "--rounds", "1", *small,
        "--threads", "1", "--data-dir", str(shared_datasets), "--db", str(db), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    assert s["algorithm"] == "fedpin" and s["scenario"] == "cmnist" and s["rounds"] == 1
    table = load_table("thesis-5.1-cmnist8")
    fedpin = next(m for m in table.methods if m.name == "FedPIN")
    overrides = {
        "rounds": 1,
        "scenario.samples": "400",
        "scenario.test_samples": "200",
        "threads": 1,
        "data_dir": str(shared_datasets),
    }
    want = json.loads(json.dumps(method_config(table, fedpin, overrides).flat()))
    got = RunStore(db).run(s["run_id"])["config"]
    assert got == want
    # the row's own options reach the run, not the module's defaults (alpha = lambda_ = 1)
    assert (got["algorithm.alpha"], got["algorithm.lambda_"]) == (
        fedpin.options["alpha"],
        fedpin.options["lambda_"],
    )
    assert (got["algorithm.alpha"], got["algorithm.lambda_"]) != (1.0, 1.0)
    assert (
        got["local_epochs"] == 10 and got["batch_size"] == 64 and got["lr"] == 0.01
    )  # FedPIN's own validated lr


def test_a_table_with_a_fixed_partition_builds_it_with_that_seed(tiny, tmp_path):
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(TINY.replace("seeds = 2\n", "seeds = 2\nscenario_seed = 5\n"))
    db = tmp_path / "r.db"
    res = invoke(
        "run", str(fixed), "--method", "fedavg", "--seed", "1", "--rounds", "1",
        "--db", str(db), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    record = RunStore(db).run(last_json(res.stdout)["run_id"])
    assert record["seed"] == 1 and record["environment"]["data"]["scenario_seed"] == 5


def test_a_table_needs_method_and_method_needs_a_table(tiny, tmp_path):
    db = ["--db", str(tmp_path / "r.db")]
    text = one_line_error(
        invoke("run", "thesis-5.1-cmnist8", *db), "--method", "fedshift reproduce"
    )
    assert "'FedAvg' (fedavg)" in text and "'FedPIN' (fedpin)" in text
    one_line_error(
        invoke("run", "thesis-5.1-cmnist8", "--method", "fedpn", *db),
        "no method 'fedpn'",
        "did you mean 'fedpin'",
    )
    one_line_error(
        invoke("run", str(tiny), "--method", "fedprox", *db), "2 rows", "'FedProx (mu 1)'"
    )
    one_line_error(
        invoke("run", "thesis-5.2-cmnist", "--method", "fedpin", *db), "'GM'", "row's name"
    )
    one_line_error(invoke("run", "mnist-iid-fedavg", "--method", "fedavg", *db), "a run preset")
    config = tmp_path / "exp.toml"
    config.write_text('rounds = 1\n[algorithm]\nname = "fedavg"\n')
    one_line_error(invoke("run", str(config), "--method", "fedavg", *db), "a run config file")
    one_line_error(invoke("run", "--method", "fedavg", *db), "TABLE --method")
    one_line_error(
        invoke("run", "thesis-5.1-cmnst8", *db), "did you mean 'thesis-5.1-cmnist8'"
    )  # did-you-mean covers the tables as well as the presets
    one_line_error(invoke("run", "mnist-iid-fedav", *db), "did you mean 'mnist-iid-fedavg'")
    one_line_error(
        invoke("run", "fedipg-rotmnist5", "--method", "FedAvg", *db),
        "--set scenario.held_out=VALUE",
    )
    one_line_error(
        invoke("run", str(tiny), "--method", "FedAvg", "--set", "algorithm.mu=1", *db),
        "has no option 'mu'",
    )
    one_line_error(
        invoke("sweep", "thesis-5.1-cmnist8", *db), "paper table", "--method", "reproduce"
    )
    one_line_error(invoke("run", "thesis-5.1-cmnist8", "--method", "x", "--resume", "ab"), "resume")
    one_line_error(invoke("reproduce", "mnist-iid-fedavg", *db), "a run preset", "fedshift run")


def test_list_presets_tells_presets_and_tables_apart():
    items = last_json(invoke("list", "presets", "--json").stdout)
    kinds = {it["name"]: it["kind"] for it in items}
    assert kinds["mnist-iid-fedavg"] == "preset" and kinds["thesis-5.1-cmnist8"] == "table"
    cmnist8 = next(it for it in items if it["name"] == "thesis-5.1-cmnist8")
    assert "FedPIN" in cmnist8["methods"] and "--method" in cmnist8["help"]
    assert len(kinds) == len(items)  # no table shares a run preset's name
    text = runner.invoke(app, ["list", "presets"], env={"COLUMNS": "200"}).output
    assert "run preset" in text and "paper table" in text and "--method" in text
