"""`fedshift reproduce TABLE --estimate`: each method timed at the table's scale, the
whole table's wall time multiplied out, nothing recorded."""

from __future__ import annotations

import json

import pytest
from test_reproduce import TINY
from typer.testing import CliRunner

from fedshift.budget import estimate
from fedshift.cli import app
from fedshift.errors import FedshiftError


def test_estimate_times_every_method_and_multiplies_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.replace("rounds = 2", "rounds = 40\neval_every = 10"))
    out = estimate(str(path), seeds=3)
    assert [m["method"] for m in out["methods"]] == ["FedAvg", "FedProx", "Local", "FTFA"]
    for m in out["methods"]:
        assert m["rounds"] == 40 and m["runs"] == 3 and m["evaluations"] == 4
        assert len(m["rounds_timed_s"]) == 2 and m["round_s"] > 0 and m["eval_s"] > 0
        per_run = m["setup_s"] + m["first_round_s"] + 39 * m["round_s"] + 4 * m["eval_s"]
        assert m["run_s"] == pytest.approx(per_run)
        assert m["total_s"] == pytest.approx(3 * m["run_s"])
    assert out["total_s"] == pytest.approx(sum(m["total_s"] for m in out["methods"]))
    assert not (tmp_path / "runs").exists()  # nothing recorded
    args = ["reproduce", str(path), "--estimate", "--methods", "FedAvg", "--rounds", "7"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert [m["method"] for m in summary["methods"]] == ["FedAvg"]
    assert summary["methods"][0]["rounds"] == 7 and summary["methods"][0]["runs"] == 2
    assert "estimated wall time" in res.output
    with pytest.raises(FedshiftError, match="at least 1"):
        estimate(str(path), seeds=0)
