"""A stopped, failed or killed run resumes from its checkpoint and finishes with exactly
the metrics of the uninterrupted run."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import torch
from toy import algorithm_test_data, toy_data

import fedshift as fs
from fedshift.algorithms import ALGORITHMS
from fedshift.api import checkpoint_path, resume
from fedshift.engine.runner import Runner
from fedshift.engine.tree import flatten
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=5, model_options={"hidden": [8]}, eval_every=2)


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_resume_after_a_crash_is_bit_identical(tmp_path, monkeypatch, algorithm):
    """Every registered algorithm: crash in round 4, resume from the round-2 checkpoint."""
    data = algorithm_test_data(algorithm)
    reference = fs.run(algorithm=algorithm, data=data(), **SETTINGS)
    db = tmp_path / "runs.db"
    original = Runner.train_round

    def crash_in_round_3(self, r):
        if r == 3:
            raise RuntimeError("power cut")
        return original(self, r)

    monkeypatch.setattr(Runner, "train_round", crash_in_round_3)
    with pytest.raises(RuntimeError):
        fs.run(algorithm=algorithm, data=data(), db=db, checkpoint_every=2, **SETTINGS)
    monkeypatch.setattr(Runner, "train_round", original)
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "failed" and rec["rounds_done"] == 3
    resumed = resume(rec["run_id"], db, data=data())
    assert resumed.metrics == reference.metrics
    got = flatten(resumed.result.server)
    for k, v in flatten(reference.result.server).items():
        assert torch.equal(got[k], v), k
    assert resumed.result.bytes_up == reference.result.bytes_up
    final = RunStore(db).run(rec["run_id"])
    assert final["status"] == "done" and final["bytes_up"] == reference.result.bytes_up
    assert [r["round"] for r in final["round_metrics"]] == [1, 2, 3, 4, 5]


def test_resuming_a_finished_run_is_refused(tmp_path):
    out = fs.run(algorithm="fedavg", data=toy_data(), db=tmp_path / "r.db", **SETTINGS)
    with pytest.raises(fs.errors.FedshiftError, match="already finished"):
        resume(out.run_id, tmp_path / "r.db", data=toy_data())


CMD = [
    sys.executable,
    "-m",
    "fedshift.cli",
    "run",
    "--set",
    "scenario=digits-shortcut",
    "--set",
    "checkpoint_every=1",
    "--rounds",
    "12",
    "--json",
]


def _rounds_done(db) -> int:
    if not db.exists():  # sqlite3.connect would create an empty file, which fedshift refuses
        return 0
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT MAX(rounds_done) FROM runs").fetchone()
        return row[0] or 0
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_real_process_stopped_mid_run_resumes_identically(tmp_path, sig):
    db = tmp_path / "runs.db"
    ref = subprocess.run([*CMD, "--db", str(tmp_path / "ref.db")], capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    proc = subprocess.Popen([*CMD, "--db", str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while _rounds_done(db) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "interrupted"  # a killed process is detected as such
    if sig == signal.SIGTERM:
        assert rec["status"] == "interrupted" and b"--resume" in err
    assert checkpoint_path(db, rec["run_id"]).exists()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedshift.cli",
            "run",
            "--resume",
            rec["run_id"],
            "--db",
            str(db),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    resumed, reference = (json.loads(x.stdout.strip().splitlines()[-1]) for x in (res, ref))
    assert resumed["metrics"] == reference["metrics"]
    assert resumed["bytes_up"] == reference["bytes_up"]
