"""Conflicting options are errors, not a silent choice: the same key with two values,
``--set rounds=5 --rounds 3``, an option repeated, ``local_epochs`` beside ``local_steps``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.config import add_options, parse_set
from fedshift.errors import FedshiftError

runner = CliRunner()
DIGITS = ["--set", "scenario=digits-shortcut"]

CONFLICTS = [
    (["--set", "rounds=5", "--rounds", "3"], "--set rounds=5 and --rounds 3"),
    (["--rounds", "3", "--rounds", "5"], "--rounds is given 2 times"),
    (["--rounds=3", "--rounds", "5"], "--rounds is given 2 times"),
    (["--seed", "1", "--set", "seed=2", "--rounds", "1"], "seed is given twice"),
    (["--set", "lr=0.1", "--set", "lr=0.2", "--rounds", "1"], "'lr' twice"),
    (["--set", "checkpoint.every=5", "--set", "checkpoint_every=6"], "checkpoint_every"),
    (["--set", "local_epochs=5", "--set", "local_steps=10", "--rounds", "1"], "local_steps=10"),
    (["--set", "rounds=ten"], "rounds='ten' is not an integer"),
    (["--seeds", "0,1", "--seed", "2", "--rounds", "1"], "--seeds"),
    (["--cohort-size", "2", "--cohort-size", "3", "--rounds", "1"], "--cohort-size"),
]


@pytest.mark.parametrize(("args", "named"), CONFLICTS, ids=[" ".join(a) for a, _ in CONFLICTS])
def test_conflicting_options_are_one_line_errors(tmp_path, args, named):
    res = runner.invoke(app, ["run", *DIGITS, *args, "--db", str(tmp_path / "r.db")])
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert named in text
    assert not (tmp_path / "r.db").exists()  # refused before any run was recorded


def test_the_same_value_twice_is_no_conflict(tmp_path):
    args = ["--set", "rounds=1", "--rounds", "1", "--set", "lr=0.1", "--set", "lr=1e-1"]
    res = runner.invoke(app, ["run", *DIGITS, *args, "--db", str(tmp_path / "r.db"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["rounds"] == 1


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "--set", "rounds=2", "--rounds", "1", "--grid", "lr=0.1,0.2"],
        ["reproduce", "thesis-5.1-cmnist8", "--set", "rounds=2", "--rounds", "1"],
        ["runs", "--db", "a.db", "--db", "b.db"],
        ["describe", "scenario", "digits-shortcut", "--seed", "1", "--seed", "2"],
    ],
)
def test_other_commands_refuse_conflicts_too(tmp_path, args):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert "given" in res.output


def test_local_steps_with_explicit_epochs_is_refused_from_every_entry_point():
    with pytest.raises(FedshiftError, match="local_steps=4 and local_epochs=2"):
        fs.make_config(local_steps=4, local_epochs=2)
    assert fs.make_config(local_steps=4).local_steps == 4  # epochs at their default: fine
    assert fs.make_config(local_epochs=2).local_epochs == 2


def test_parse_set_and_add_options_keep_one_value_per_key():
    assert parse_set(["lr=0.1", "lr=0.10"]) == {"lr": "0.10"}
    with pytest.raises(FedshiftError, match="twice"):
        parse_set(["algorithm.mu=0.1", "algorithm.mu=0.2"])
    assert add_options({"rounds": "3"}, {"rounds": 3, "seed": None}) == {"rounds": 3}
    with pytest.raises(FedshiftError, match="--set rounds=3 and --rounds 4"):
        add_options({"rounds": "3"}, {"rounds": 4})
