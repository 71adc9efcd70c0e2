"""``fedshift report`` and ``compare`` on runs that did not finish: the partial curve from
the stored rounds and the last evaluation, every label marked "(interrupted at round k/T)"."""

from __future__ import annotations

import json

import pytest
from toy import power_cut_at, toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.engine.runner import Runner, RunStopped

SETTINGS = dict(lr=0.1, batch_size=8, rounds=10, eval_every=2, model_options={"hidden": [8]})


def stop_after(monkeypatch, rounds: int) -> None:
    """The run stops cleanly after ``rounds`` rounds, as on Ctrl-C (status interrupted)."""
    original = Runner.train_round

    def train(self, r):
        if r == rounds:
            raise RunStopped(rounds)
        return original(self, r)

    monkeypatch.setattr(Runner, "train_round", train)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    db = tmp_path / "runs.db"
    with monkeypatch.context() as m:
        stop_after(m, 5)
        with pytest.raises(RunStopped):
            fs.run(algorithm="fedavg", data=toy_data(), db=db, **SETTINGS)
    with power_cut_at(monkeypatch, 1), pytest.raises(RuntimeError):  # failed, never evaluated
        fs.run(algorithm="ftfa", data=toy_data(), db=db, **SETTINGS)
    done = fs.run(algorithm="local", data=toy_data(), db=db, **SETTINGS)
    ids = [r["run_id"] for r in fs.load_runs(db).to_dict("records")]
    return db, ids, done


def test_compare_shows_the_last_evaluation_of_an_interrupted_run_marked(runs, tmp_path):
    db, (stopped, failed, done), outcome = runs
    csv = tmp_path / "t.csv"
    args = ["compare", stopped, failed, done, "--db", str(db), "--out", str(tmp_path / "c")]
    res = CliRunner().invoke(app, [*args, "--json", "--csv", str(csv)])
    assert res.exit_code == 0, res.output
    caption = " ".join(res.stderr.split())  # the table's caption, wrapped to 80 columns
    assert f"{stopped} interrupted at round 5/10, last evaluated at round 4" in caption
    assert f"{failed} failed at round 1/10, never evaluated" in caption
    rows = {r["run_id"]: r for r in json.loads(res.stdout.strip().splitlines()[-1])["runs"]}
    assert rows[stopped]["label"] == f"fedavg ({stopped}) (interrupted at round 5/10)"
    assert rows[stopped]["partial"] == {
        "status": "interrupted",
        "rounds_done": 5,
        "rounds": 10,
        "evaluated_round": 4,
    }
    round4 = fs.load_rounds(db, stopped).set_index("round").loc[4]
    assert rows[stopped]["metrics"]["worst"] == pytest.approx(round4["worst"])
    assert rows[failed]["metrics"]["worst"] is None  # never evaluated: no number at all
    assert rows[done]["partial"] is None and rows[done]["metrics"] == outcome.metrics
    assert (tmp_path / "c" / "accuracy_per_env.png").stat().st_size > 0


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_draws_the_partial_curve_and_says_so(runs, tmp_path, fmt):
    db, ids, _ = runs
    out = tmp_path / fmt
    res = CliRunner().invoke(
        app, ["report", *ids, "--db", str(db), "--out", str(out), "--format", fmt]
    )
    assert res.exit_code == 0, res.output
    text = (out / f"report.{fmt}").read_text()
    assert "(interrupted at round 5/10)" in text and "(failed at round 1/10)" in text
    assert "not final results" in text and f"{ids[1]} failed at round 1/10, never evaluated" in text
    assert "5/10" in text  # rounds done of rounds, in the run table
