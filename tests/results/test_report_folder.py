"""``fedshift report`` / ``compare`` never overwrite a file in ``--out`` that fedshift did
not write (a marker file lists what it wrote), unless ``--force``."""

from __future__ import annotations

from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.results.report import MARKER

runner = CliRunner()


def recorded_run(db) -> str:
    out = fs.run(
        algorithm="fedavg", data=toy_data(), db=db, rounds=2, model_options={"hidden": [8]}
    )
    return out.run_id


def test_report_refuses_to_overwrite_a_users_file_unless_forced(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "mine"
    run_id = recorded_run(db)
    out.mkdir()
    (out / "report.md").write_text("my notes\n")
    (out / "other.txt").write_text("kept\n")
    res = runner.invoke(app, ["report", run_id, "--db", str(db), "--out", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "report.md, which fedshift did not write" in " ".join(res.output.split())
    assert (out / "report.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["other.txt", "report.md"]  # nothing new
    res = runner.invoke(app, ["report", run_id, "--db", str(db), "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert (out / "report.md").read_text() != "my notes\n"
    assert (out / "other.txt").read_text() == "kept\n"


def test_report_rewrites_its_own_folder(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "rep"
    run_id = recorded_run(db)
    for fmt in ("md", "md", "html"):
        res = runner.invoke(
            app, ["report", run_id, "--db", str(db), "--out", str(out), "--format", fmt]
        )
        assert res.exit_code == 0, res.output
    written = set((out / MARKER).read_text().split())
    assert {"report.md", "report.html", "accuracy_per_env.png"} <= written
    assert written == {p.name for p in out.iterdir()} - {MARKER}


def test_compare_guards_its_plot_and_a_file_as_out_is_refused(tmp_path):
    db, out = tmp_path / "r.db", tmp_path / "cmp"
    a, b = recorded_run(db), recorded_run(db)
    out.mkdir()
    (out / "accuracy_per_env.png").write_bytes(b"not ours")
    res = runner.invoke(app, ["compare", a, b, "--db", str(db), "--out", str(out)])
    assert res.exit_code == 2 and (out / "accuracy_per_env.png").read_bytes() == b"not ours"
    res = runner.invoke(app, ["compare", a, b, "--db", str(db), "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["compare", a, b, "--db", str(db), "--out", str(out)])
    assert res.exit_code == 0, res.output  # now it is ours
    res = runner.invoke(app, ["report", a, "--db", str(db), "--out", str(db)])
    assert res.exit_code == 2 and "is a file" in res.output and "Traceback" not in res.output


def test_demo_refuses_a_users_plot_before_training(tmp_path, monkeypatch):
    """``fedshift demo --out`` guards its plot like report and compare, and says so before
    minutes of training (run_demo is never reached)."""
    import fedshift.demo

    def must_not_train(*args, **kwargs):
        raise AssertionError("trained before checking --out")

    monkeypatch.setattr(fedshift.demo, "run_demo", must_not_train)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "accuracy_per_env.png").write_bytes(b"not ours")
    res = runner.invoke(app, ["demo", "--out", str(out), "--db", str(tmp_path / "r.db")])
    assert res.exit_code == 2 and "did not write" in " ".join(res.output.split())
    assert (out / "accuracy_per_env.png").read_bytes() == b"not ours"
