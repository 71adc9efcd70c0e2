"""``fedshift reproduce --workers N``: the table's runs spread over N processes, each run
trained once, and the report's numbers those of one process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_reproduce import TINY
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.results.store import RunStore
from fedshift.table_workers import claimed, worker_threads, workers_hint


def reproduce(tmp_path, name: str, *more: str):
    table = tmp_path / "tiny.toml"
    table.write_text(TINY)
    args = ["reproduce", str(table), "--rounds", "1", "--json", "--set", "threads=1"]
    args += ["--db", str(tmp_path / f"{name}.db"), "--out", str(tmp_path / name), *more]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_two_workers_train_every_run_once_with_one_process_numbers(tmp_path):
    serial = reproduce(tmp_path, "serial")
    parallel = reproduce(tmp_path, "parallel", "--workers", "2")
    store = RunStore(tmp_path / "parallel.db")
    runs = store.runs()
    assert len(runs) == 8 and all(r["status"] == "done" for r in runs)  # 4 methods × 2 seeds
    assert len({(r["algorithm"], r["seed"]) for r in runs}) == 8  # none trained twice
    for one, many in zip(serial["methods"], parallel["methods"], strict=True):
        assert one["name"] == many["name"]
        assert one["ours"] == many["ours"]  # each run's numbers do not depend on its process
    assert {r["run_id"] for r in runs} == {i for m in parallel["methods"] for i in m["run_ids"]}
    logs = sorted(p.name for p in (tmp_path / "parallel" / "workers").iterdir())
    assert logs == ["worker-0.log", "worker-1.log"]  # the claims folder is gone
    assert (tmp_path / "parallel" / "report.md").exists()
    again = reproduce(tmp_path, "parallel", "--workers", "2", "--resume")  # all reused
    assert len(RunStore(tmp_path / "parallel.db").runs()) == 8
    assert [m["run_ids"] for m in again["methods"]] == [m["run_ids"] for m in parallel["methods"]]


def test_claims_hand_each_run_to_one_taker(tmp_path):
    keys = [f"0-{i}" for i in range(7)]
    first = claimed(zip(keys, range(7), strict=True), tmp_path)
    second = claimed(zip(keys, range(7), strict=True), tmp_path)
    taken = [next(first), next(second), next(second), next(first)]
    taken += list(first) + list(second)
    assert sorted(taken) == list(range(7))


def test_bad_worker_counts_get_one_sentence(tmp_path):
    table = tmp_path / "tiny.toml"
    table.write_text(TINY)
    args = ["reproduce", str(table), "--quick", "--db", str(tmp_path / "w.db"), "--workers", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--workers 0 must be 1 or more" in result.output
    status = CliRunner().invoke(app, [*args[:-1], "2", "--status"])
    assert status.exit_code == 2 and "--estimate and --status train none" in status.output
    assert worker_threads(2, cores=2) == 1 and worker_threads(4, cores=16) == 4
    assert worker_threads(3, cores=2) == 1


def test_stopping_the_parent_stops_every_worker_at_a_checkpoint(tmp_path):
    """SIGTERM to ``reproduce --workers 2``: the workers inside a run stop at a checkpoint,
    nothing runs on, and the same command with --resume finishes the table from there."""
    table = tmp_path / "tiny.toml"
    table.write_text(TINY)
    db = tmp_path / "stop.db"
    cmd = [sys.executable, "-m", "fedshift.cli", "reproduce", str(table), "--rounds", "120"]
    cmd += ["--workers", "2", "--db", str(db), "--out", str(tmp_path / "out")]
    parent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until a worker is inside a run
        rows = RunStore(db).runs() if db.exists() else []
        if any(r["status"] == "running" and r["rounds_done"] > 2 for r in rows):
            break
        time.sleep(0.2)
    parent.send_signal(signal.SIGTERM)
    output = parent.communicate(timeout=120)[0]
    assert parent.returncode == 130, output
    assert "stopped at a checkpoint" in output
    rows = RunStore(db).runs()
    assert {r["status"] for r in rows} <= {"done", "interrupted"}
    stopped = [r for r in rows if r["status"] == "interrupted"]
    # the run waited for stopped mid-way; the other worker may have just begun one (round 0)
    assert 1 <= len(stopped) <= 2 and any(r["rounds_done"] > 0 for r in stopped)
    assert not list((tmp_path / "out" / "workers").glob("claims-*"))
    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    rows = RunStore(db).runs()
    assert len(rows) == 8 and all(r["status"] == "done" for r in rows)


@pytest.mark.parametrize(
    "shape",
    [["--grid", "algorithm.mu=0.001,0.1"], ["--folds", "algorithm.mu=0.001,0.1"]],
    ids=["grid", "folds"],
)
def test_a_sweep_over_two_workers_selects_as_one_process(tmp_path, shape):
    args = ["sweep", "--set", "scenario=digits-shortcut", "--set", "algorithm=fedprox"]
    args += [*shape, "--grid", "lr=0.005,0.2", "--seeds", "0,1"]
    args += ["--rounds", "1", "--set", "threads=1", "--json"]
    summaries = []
    for name, more in (("one", []), ("two", ["--workers", "2"])):
        result = CliRunner().invoke(app, [*args, "--db", str(tmp_path / f"{name}.db"), *more])
        assert result.exit_code == 0, result.output
        summaries.append(json.loads(result.stdout.strip().splitlines()[-1]))
    one, two = summaries
    assert len(RunStore(tmp_path / "two.db").runs()) == 8  # 4 runs a seed × 2 seeds, each once
    assert two["selected_params"] == one["selected_params"] and two["val"] == one["val"]
    assert [p["metrics"] for p in two["points"]] == [p["metrics"] for p in one["points"]]
    assert sorted(p.name for p in (tmp_path / "two-workers").iterdir()) == [
        "worker-0.log",
        "worker-1.log",
    ]


def test_one_process_on_spare_cores_hears_of_workers(tmp_path, monkeypatch):
    """Where someone watches, a table or sweep about to train several runs one after another
    on a CPU with spare cores is told of --workers; not once every run is done (--resume),
    nor for one run, one core or a GPU."""
    monkeypatch.setattr("fedshift.progress.wanted", lambda progress: True)
    monkeypatch.setattr("fedshift.crowded.usable_cores", lambda: 2)
    table = tmp_path / "tiny.toml"
    table.write_text(TINY)
    db = str(tmp_path / "hint.db")
    args = ["reproduce", str(table), "--rounds", "1", "--db", db, "--out", str(tmp_path / "o")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "note: 8 runs to train one after another: --workers 2 trains 2 at a time" in (
        first.output
    )
    again = CliRunner().invoke(app, [*args, "--resume"])  # all 8 done: nothing to share out
    assert again.exit_code == 0 and "--workers" not in again.output
    sweep = ["sweep", "--set", "scenario=digits-shortcut", "--grid", "lr=0.01,0.1"]
    sweep += ["--seeds", "0,1", "--rounds", "1", "--db", str(tmp_path / "s.db")]
    result = CliRunner().invoke(app, sweep)
    assert result.exit_code == 0 and "note: 4 runs to train one after another" in result.output
    assert workers_hint(1, "cpu", cores=8) is None
    assert workers_hint(5, "cpu", cores=1) is None
    assert "--workers 3 trains 3 at a time" in workers_hint(3, "cpu", cores=16)
    monkeypatch.setattr("fedshift.experiment.resolve_device", lambda d: torch.device("meta"))
    assert workers_hint(5, "cuda", cores=8) is None  # not a CPU: one process uses the device
