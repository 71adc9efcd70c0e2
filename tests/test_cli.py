"""The CLI contract: names, JSON keys, percentages, and one-line errors without tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedshift.cli import app

runner = CliRunner()
FAST = ["--set", "scenario=digits-shortcut", "--rounds", "2"]


def invoke(*args: str):
    return runner.invoke(app, list(args))


def last_json(text: str):
    return json.loads(text.strip().splitlines()[-1])


def test_run_json_summary_contract(tmp_path):
    res = invoke(
        "run", *FAST, "--set", "algorithm=fedavg", "--db", str(tmp_path / "r.db"), "--json"
    )
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    for k in (
        "run_id",
        "algorithm",
        "scenario",
        "rounds",
        "seed",
        "metrics",
        "time_s",
        "bytes_up",
        "bytes_down",
    ):
        assert k in s
    for k in ("worst", "average", "worst_client", "per_env", "per_client"):
        assert k in s["metrics"]
    assert max(s["metrics"]["per_env"].values()) > 1.0  # percentages, not fractions
    assert s["rounds"] == 2 and s["bytes_up"] > 0

    listed = invoke("runs", "--db", str(tmp_path / "r.db"), "--json")
    assert listed.exit_code == 0
    runs = last_json(listed.stdout)
    assert runs[0]["run_id"] == s["run_id"] and runs[0]["status"] == "done"
    assert runs[0]["rounds_done"] == 2


@pytest.mark.parametrize("what", ["algorithms", "scenarios", "presets", "models"])
def test_list_json(what):
    res = invoke("list", what, "--json")
    assert res.exit_code == 0, res.output
    items = last_json(res.stdout)
    assert items and all("name" in it for it in items)


def test_list_algorithms_has_the_first_four():
    names = {it["name"] for it in last_json(invoke("list", "algorithms", "--json").stdout)}
    assert {"fedavg", "fedprox", "local", "ftfa"} <= names


def test_list_descriptions_are_whole_sentences_not_first_lines():
    """A docstring's or preset comment's first sentence runs over line breaks: the listing
    gives all of it, on one line, not the first line cut mid-title."""
    algorithms = {
        it["name"]: it["help"] for it in last_json(invoke("list", "algorithms", "--json").stdout)
    }
    assert "Shortcut-Averse Information-Theoretic Regularization" in algorithms["fedpin"]
    assert all("\n" not in h and "``" not in h for h in algorithms.values())
    presets = {
        it["name"]: it["help"] for it in last_json(invoke("list", "presets", "--json").stdout)
    }
    assert presets["demo"].endswith("(src/fedshift/demo.py).")
    assert "The default demo" not in presets["demo"]  # its first sentence only


BAD = [
    (["--set", "algorithm=nosuchalgo"], "nosuchalgo"),
    (["--set", "scenario=nosuchscenario"], "nosuchscenario"),
    (["--set", "nosuchkey=1"], "nosuchkey"),
    (["--rounds", "-3"], "rounds"),
    (["--set", "lr=abc"], "lr"),
    (["--set", "lr=-1"], "lr"),
    (["--set", "scenario.nosuchoption=3"], "scenario.nosuchoption"),
    (["--set", "algorithm=fedprox", "--set", "algorithm.mu=-1"], "mu"),
    (["--set", "algorithm.nope=1"], "algorithm.nope"),
    (["--set", "model=nosuchmodel"], "nosuchmodel"),
    (["--set", "model.hidden=abc"], "model.hidden"),
    (["--set", "broken"], "key=value"),
    (
        ["--device", "cuda:7"]
        if not __import__("torch").cuda.is_available()
        else ["--device", "tpu"],
        "device",
    ),
    (["no-such-preset"], "no-such-preset"),
    (["missing.toml"], "missing.toml"),
]


@pytest.mark.parametrize(("args", "named"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_without_traceback(tmp_path, args, named):
    res = invoke("run", *args, "--db", str(tmp_path / "r.db"))
    assert res.exit_code != 0
    text = res.output.strip()
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    assert named in text


def test_bad_list_kind_and_missing_db(tmp_path):
    assert invoke("list", "widgets").exit_code == 2
    res = invoke("runs", "--db", str(tmp_path / "none.db"))
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_toml_config_and_preset(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text(
        'rounds = 1\n[scenario]\nname = "digits-shortcut"\nclients = 4\n'
        '[algorithm]\nname = "fedprox"\nmu = 0.1\n'
    )
    res = invoke("run", str(cfg), "--db", str(tmp_path / "r.db"), "--json")
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    assert s["algorithm"] == "fedprox" and len(s["metrics"]["per_client"]) == 4
    res = invoke("run", "demo", "--rounds", "1", "--db", str(tmp_path / "r.db"), "--json")
    assert res.exit_code == 0, res.output


@pytest.mark.skipif(
    shutil.which("fedshift") is None, reason="the fedshift command is not installed"
)
def test_contract_smoke_script():
    script = Path(__file__).resolve().parents[1].parent / "shared" / "tools" / "contract-smoke"
    if not script.exists():
        pytest.skip("shared/tools/contract-smoke is not beside the repository")
    res = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=600, env={**os.environ}
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "contract ok" in res.stdout


def test_several_seeds_report_mean_and_std(tmp_path):
    res = invoke("run", *FAST, "--seeds", "0,1", "--db", str(tmp_path / "r.db"), "--json")
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    assert s["seeds"] == [0, 1] and len(s["run_ids"]) == 2
    singles = [
        last_json(
            invoke("run", *FAST, "--seed", str(k), "--db", str(tmp_path / "r.db"), "--json").stdout
        )
        for k in (0, 1)
    ]
    worst = [x["metrics"]["worst"] for x in singles]
    assert s["metrics"]["worst"] == pytest.approx(sum(worst) / 2)
    assert s["metrics_std"]["worst"] == pytest.approx(abs(worst[0] - worst[1]) / 2**0.5)
    assert invoke("run", *FAST, "--seeds", "0,x").exit_code == 2


def test_describe_scenario_lists_every_client():
    res = invoke("describe", "scenario", "digits-shortcut", "--set", "clients=4", "--json")
    assert res.exit_code == 0, res.output
    info = last_json(res.stdout)
    assert info["clients"] == 4 and len(info["per_client"]) == 4
    assert info["test_envs"][0] == "p=0.0" and all(c["train_envs"] for c in info["per_client"])
    assert sum(c["train"] for c in info["per_client"]) > 0
    assert invoke("describe", "scenario", "nope").exit_code == 2
    assert invoke("describe", "algorithm", "fedavg").exit_code == 2


def test_every_command_has_a_one_line_summary_in_the_help():
    """`fedshift --help` lists each command by its docstring's first paragraph, joined into
    one line (Typer keeps the docstring's line breaks, which cut sentences mid-phrase)."""
    import click
    import typer

    root = typer.main.get_command(app)
    groups = [root] + [c for c in root.commands.values() if isinstance(c, click.Group)]
    commands = [c for g in groups for c in g.commands.values() if not isinstance(c, click.Group)]
    assert len(commands) >= 15
    for command in commands:
        assert command.short_help, command.name
        assert "\n" not in command.short_help and "``" not in command.short_help, command.name
    listing = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "a run preset or TOML file, or one method of a paper table" in listing
