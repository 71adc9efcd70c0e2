"""``fedshift export`` / ``import``: a finished run outlives its store. Exported from one
store and imported into a fresh one, it reads the same (show, report) and a resumed sweep
or table reuses it instead of training it again."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.errors import FedshiftError
from fedshift.results.archive import export_runs, import_runs
from fedshift.results.store import RunStore

SETTINGS = dict(scenario="digits-shortcut", algorithm="fedavg", rounds=2, lr=0.05)
runner = CliRunner()


def test_an_exported_run_imports_into_a_fresh_store_as_it_was(tmp_path):
    db = tmp_path / "a.db"
    run = fs.run(db=db, seed=0, **SETTINGS)
    (path,) = export_runs(db, [run.run_id[:6]], tmp_path / "out")
    assert path.name == f"{run.run_id}.json"
    fresh = tmp_path / "b.db"
    rows = import_runs(fresh, [tmp_path / "out"])
    assert rows == [
        {"run_id": run.run_id, "algorithm": "fedavg", "file": str(path), "action": "imported"}
    ]
    a, b = RunStore(db).run(run.run_id), RunStore(fresh).run(run.run_id)
    for key in ("status", "config", "metrics", "val", "seed", "rounds_done", "client_accuracy"):
        assert a[key] == b[key], key
    assert [r["loss"] for r in a["round_metrics"]] == [r["loss"] for r in b["round_metrics"]]
    assert b["environment"]["imported"][-1]["from"] == path.name
    # exported again from the store it went into, it is the same file (a resumed table
    # re-exports the runs it reuses: committed evidence must not churn)
    before = path.read_bytes()
    export_runs(fresh, [run.run_id], tmp_path / "out")
    assert path.read_bytes() == before
    # importing again is harmless; a different run under the same id is refused
    assert import_runs(fresh, [path])[0]["action"] == "present"
    record = json.loads(path.read_text())
    record["run"]["metrics"]["worst"] += 1.0
    path.write_text(json.dumps(record))
    with pytest.raises(FedshiftError, match="different run"):
        import_runs(fresh, [path])


def test_a_large_record_is_written_compressed_and_imports_the_same(tmp_path, monkeypatch):
    """Over COMPRESS_OVER bytes a record is written as .json.gz (bytes reproducible), a
    stale file of the run in the other form is removed, and import reads it as it reads
    plain JSON."""
    import gzip

    from fedshift.results import archive

    db = tmp_path / "a.db"
    run = fs.run(db=db, seed=0, **SETTINGS)
    (plain,) = export_runs(db, [run.run_id], tmp_path / "out")
    monkeypatch.setattr(archive, "COMPRESS_OVER", 100)
    assert export_runs(db, [run.run_id], tmp_path / "out") == [plain]  # the same run: kept
    stale = json.loads(plain.read_text())
    stale["run"]["rounds_done"] = 1  # a file that differs from the store is replaced
    plain.write_text(json.dumps(stale))
    (packed,) = export_runs(db, [run.run_id], tmp_path / "out")
    assert packed.name == f"{run.run_id}.json.gz" and not plain.exists()
    first = packed.read_bytes()
    assert len(first) < len(gzip.decompress(first)) / 3
    export_runs(db, [run.run_id], tmp_path / "out")
    assert packed.read_bytes() == first  # committed evidence does not churn
    (row,) = import_runs(tmp_path / "b.db", [tmp_path / "out"])
    assert row["action"] == "imported"
    a, b = RunStore(db).run(run.run_id), RunStore(tmp_path / "b.db").run(run.run_id)
    for key in ("metrics", "client_accuracy", "config"):
        assert a[key] == b[key], key
    packed.write_bytes(first[:40])  # a truncated download: one sentence, no traceback
    with pytest.raises(FedshiftError, match="not a readable exported run"):
        import_runs(tmp_path / "c.db", [packed])


def test_a_sweeps_exported_runs_are_reused_by_a_resumed_sweep_elsewhere(tmp_path, monkeypatch):
    from fedshift.sweep import run_sweep

    fixed = {k: v for k, v in SETTINGS.items() if k != "lr"}
    grid = {"lr": ["0.05", "0.2"]}
    first = run_sweep(None, fixed, grid, [0], tmp_path / "a.db", export_to=tmp_path / "out")
    assert {p.stem for p in (tmp_path / "out").glob("*.json")} == set(first["run_ids"])
    import_runs(tmp_path / "b.db", [tmp_path / "out"])

    def no_training(*args, **kwargs):
        raise AssertionError("a run was trained again")

    monkeypatch.setattr("fedshift.api.run", no_training)  # the jobs loop imports it per call
    again = run_sweep(None, fixed, grid, [0], tmp_path / "b.db", resume=True)
    assert again["run_ids"] == first["run_ids"]
    assert again["selected"] == first["selected"] and again["val"] == pytest.approx(first["val"])


def test_unfinished_runs_are_not_exported_and_bad_files_get_one_sentence(tmp_path):
    db = tmp_path / "a.db"
    run = fs.run(db=db, seed=0, **SETTINGS)
    store = RunStore(db)
    store.fail(run.run_id, "interrupted", "stopped")
    res = runner.invoke(app, ["export", run.run_id, "--db", str(db), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "only finished or diverged" in res.output
    assert "Traceback" not in res.output
    junk = tmp_path / "junk.json"
    junk.write_text('{"format": "something else"}')
    res = runner.invoke(app, ["import", str(junk), "--db", str(tmp_path / "b.db")])
    assert res.exit_code != 0 and "not a run written by `fedshift export`" in res.output
    res = runner.invoke(app, ["import", str(tmp_path / "none"), "--db", str(tmp_path / "b.db")])
    assert res.exit_code != 0 and "no file or folder" in res.output


def test_cli_exports_a_group_and_imports_it(tmp_path):
    db = tmp_path / "a.db"
    args = ["run", "--set", "scenario=digits-shortcut", "--rounds", "2", "--seeds", "0,1"]
    res = runner.invoke(app, [*args, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    group = RunStore(db).runs()[0]["group"]
    out = tmp_path / "o"
    res = runner.invoke(app, ["export", "--group", group, "--db", str(db), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(list(out.glob("*.json"))) == 2
    res = runner.invoke(app, ["import", str(out), "--db", str(tmp_path / "b.db"), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout.strip().splitlines()[-1])["imported"]
    assert [r["action"] for r in rows] == ["imported", "imported"]
    listed = runner.invoke(app, ["runs", "--db", str(tmp_path / "b.db"), "--json"])
    assert {r["status"] for r in json.loads(listed.stdout.strip().splitlines()[-1])} == {"done"}


def test_format_1_files_import_and_are_kept_as_they_are(tmp_path):
    """Files written before format 2 (committed evidence) import as before, and a resumed
    table that re-exports their runs leaves them byte for byte as they were."""
    from fedshift.results import archive

    db = tmp_path / "a.db"
    run = fs.run(db=db, seed=0, **SETTINGS)
    old = {"format": archive.FORMAT, "version": 1, **archive._raw(RunStore(db), run.run_id)}
    out = tmp_path / "out"
    out.mkdir()
    path = out / f"{run.run_id}.json"
    path.write_text(archive._layout(old))
    before = path.read_bytes()
    (row,) = import_runs(tmp_path / "b.db", [path])
    assert row["action"] == "imported"
    a, b = RunStore(db).run(run.run_id), RunStore(tmp_path / "b.db").run(run.run_id)
    for key in ("metrics", "client_accuracy", "config"):
        assert a[key] == b[key], key
    assert [r["metrics"] for r in a["round_metrics"]] == [r["metrics"] for r in b["round_metrics"]]
    assert export_runs(tmp_path / "b.db", [run.run_id], out) == [path]
    assert path.read_bytes() == before


def test_many_environments_are_written_as_columns_and_read_back_exactly(tmp_path, monkeypatch):
    """Format 2: per-environment metrics over many test environments become lists in the
    order of the accuracy table's environments, and every number comes back."""
    from fedshift.results import archive

    monkeypatch.setattr(archive, "ENV_LIST_OVER", 3)  # digits-shortcut scores 11 environments
    db = tmp_path / "a.db"
    run = fs.run(db=db, seed=0, **SETTINGS)
    (path,) = export_runs(db, [run.run_id], tmp_path / "out")
    record = json.loads(path.read_text())
    assert record["version"] == 2
    per_env = record["run"]["metrics"]["per_env"]
    assert per_env[archive.ENV_REF] == "test"
    assert len(per_env["values"]) == len(record["accuracy"]["test"]["envs"]) == 11
    assert len(record["accuracy"]["test"]["rows"]) == len(record["accuracy"]["test"]["clients"])
    import_runs(tmp_path / "b.db", [path])
    a, b = RunStore(db).run(run.run_id), RunStore(tmp_path / "b.db").run(run.run_id)
    for key in ("metrics", "client_accuracy"):
        assert a[key] == b[key], key
    assert [r["metrics"] for r in a["round_metrics"]] == [r["metrics"] for r in b["round_metrics"]]


def test_absent_and_nan_accuracies_survive_the_columns():
    """A client the store holds no accuracy for in an environment stays absent; a NaN
    accuracy (stored as null) stays null."""
    from fedshift.results import archive

    record = {
        "run": {"run_id": "0123456789", "metrics": None},
        "rounds": [],
        "client_accuracy": [
            {"accuracy": 50.0, "client": 0, "env": "a", "split": "test"},
            {"accuracy": None, "client": 0, "env": "b", "split": "test"},
            {"accuracy": 75.0, "client": 1, "env": "a", "split": "test"},
        ],
    }
    packed = json.loads(json.dumps(archive._packed(record)))
    assert archive._unpacked(packed) == record
