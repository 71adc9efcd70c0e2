"""A resume trains on the data the run started with: a run on a scenario built in Python
records its options, so ``fedshift run --resume`` rebuilds exactly that scenario; where it
cannot, the data's fingerprint refuses the resume in one sentence."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch
from toy import power_cut_at, toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.api import resume
from fedshift.cli import app
from fedshift.data.federated import FederatedData, Split
from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore

SETTINGS = dict(algorithm="fedavg", rounds=4, eval_every=1)


def crashed(db, data, monkeypatch, **kw) -> str:
    with power_cut_at(monkeypatch, 2), pytest.raises(RuntimeError):
        fs.run(data=data, db=db, checkpoint_every=1, **{**SETTINGS, **kw})
    return RunStore(db).runs()[0]["run_id"]


def cli_resume(run_id, db):
    return CliRunner().invoke(app, ["run", "--resume", run_id, "--db", str(db), "--json"])


def test_a_scenario_built_in_python_is_rebuilt_by_the_cli_resume(tmp_path, monkeypatch):
    options = dict(clients=4, p_val=0.2, test_fraction=0.2)
    data = fs.scenario("digits-shortcut", **options)
    db = tmp_path / "r.db"
    run_id = crashed(db, data, monkeypatch)
    config = RunStore(db).run(run_id)["config"]
    assert {k: config[f"scenario.{k}"] for k in options} == options
    res = cli_resume(run_id, db)
    assert res.exit_code == 0, res.output
    resumed = json.loads(res.stdout.strip().splitlines()[-1])
    reference = fs.run(data=fs.scenario("digits-shortcut", **options), **SETTINGS)
    assert resumed["metrics"] == json.loads(json.dumps(reference.metrics))
    assert len(resumed["metrics"]["per_client"]) == 4


def test_the_cmnist_example_of_the_issue(tmp_path, monkeypatch, shared_datasets):
    opts = dict(clients=4, partitions=4, samples=2000, test_samples=1000)
    data = fs.scenario("cmnist", data_dir=shared_datasets, **opts)
    db = tmp_path / "r.db"
    run_id = crashed(db, data, monkeypatch)
    res = cli_resume(run_id, db)
    assert res.exit_code == 0, res.output
    resumed = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(resumed["metrics"]["per_client"]) == 4  # not the default 8 clients


def test_a_scenario_of_another_seed_is_refused_by_the_cli_resume(tmp_path, monkeypatch):
    data = fs.scenario("digits-shortcut", seed=1, clients=4)
    db = tmp_path / "r.db"
    run_id = crashed(db, data, monkeypatch)  # run seed 0
    res = cli_resume(run_id, db)
    assert res.exit_code == 2 and "Traceback" not in res.output
    text = " ".join(res.output.split())
    assert "differ from the data it trained on" in text
    assert "built with seed 1, not the run seed 0" in text
    assert RunStore(db).run(run_id)["status"] == "failed"  # untouched
    # from Python with that data it resumes
    same = fs.scenario("digits-shortcut", seed=1, clients=4)
    assert resume(run_id, db, data=same).metrics["average"] > 0


def test_other_python_data_are_refused(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    run_id = crashed(db, toy_data(), monkeypatch, model_options={"hidden": [8]})
    with pytest.raises(FedshiftError, match="assembled in Python"):
        resume(run_id, db, data=toy_data(seed=1))
    other_labels = toy_data()
    other_labels.train.y[:5] = (other_labels.train.y[:5] + 1) % 3
    with pytest.raises(FedshiftError, match="differ from the data it trained on"):
        resume(run_id, db, data=other_labels)
    assert resume(run_id, db, data=toy_data()).metrics["average"] > 0


def test_a_run_of_an_older_version_without_a_fingerprint_still_resumes(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    run_id = crashed(db, toy_data(), monkeypatch, model_options={"hidden": [8]})
    with sqlite3.connect(db) as conn:
        (env,) = conn.execute("SELECT environment FROM runs").fetchone()
        env = json.loads(env)
        del env["data"]
        conn.execute("UPDATE runs SET environment=?", (json.dumps(env),))
    assert resume(run_id, db, data=toy_data(seed=1)).metrics["average"] >= 0


def test_the_fingerprint_sees_partitions_labels_and_inputs():
    base = toy_data().fingerprint()
    assert toy_data().fingerprint() == base
    moved = toy_data()
    moved.train.offsets[1] += 1  # one sample to another client
    assert moved.fingerprint() != base
    shifted = toy_data()
    shifted.test["far"].x += 0.5
    assert shifted.fingerprint() != base


def test_the_fingerprint_of_a_large_split_samples_inside_it():
    """2^24 + 4 input values: a float32 linspace would round the last position to n
    (the IndexError that `--set scenario=iid` met on MNIST's 54,000 × 784 values)."""
    n = 2**24 + 4
    x = torch.zeros(2, n // 2, dtype=torch.uint8)
    x[-1, -1] = 7
    split = Split(x, torch.tensor([0, 1]), torch.tensor([0, 1, 2]))
    data = FederatedData("big", 2, (n // 2,), split, {"test": split})
    other = FederatedData(
        "big", 2, (n // 2,), split, {"test": Split(x * 0, split.y, split.offsets)}
    )
    assert data.fingerprint() != other.fingerprint()  # the last value is sampled
