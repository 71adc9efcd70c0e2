"""Two processes never train one run at once: a run being trained (started or resumed)
holds an OS lock beside its checkpoint; a second ``--resume`` is refused in one sentence
naming the process, and a lock left by a killed process does not block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from toy import power_cut_at, toy_data

import fedshift as fs
from fedshift.api import checkpoint_path, resume
from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=4, model_options={"hidden": [8]}, eval_every=1)


def failed_run(db, monkeypatch) -> str:
    with power_cut_at(monkeypatch, 2), pytest.raises(RuntimeError):
        fs.run(algorithm="fedavg", data=toy_data(), db=db, checkpoint_every=1, **SETTINGS)
    return RunStore(db).runs()[0]["run_id"]


HOLD = """
import sys, time
from fedshift.api import training_lock
with training_lock(sys.argv[1], sys.argv[2]):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_a_resume_while_another_process_trains_the_run_is_refused(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    run_id = failed_run(db, monkeypatch)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(db), run_id], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FedshiftError, match=f"being trained by process {holder.pid} "):
            resume(run_id, db, data=toy_data(), overrides={"lr": "0.05"})
        rec = RunStore(db).run(run_id)
        assert rec["status"] == "failed" and rec["overrides"] == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the killed holder's lock file (with its pid) is left, and does not block
    lock = checkpoint_path(db, run_id).with_suffix(".lock")
    assert lock.read_text() == str(holder.pid)
    assert resume(run_id, db, data=toy_data()).metrics["average"] > 0
    assert RunStore(db).run(run_id)["status"] == "done"


def test_a_run_being_trained_cannot_be_resumed_beside_it(tmp_path):
    """A fresh run holds the lock too (flock conflicts even within one process)."""
    db = tmp_path / "r.db"
    refused = []

    def try_resume(rec):
        if rec.round == 2:
            (row,) = RunStore(db).runs()
            with pytest.raises(FedshiftError, match=f"process {os.getpid()} ") as e:
                resume(row["run_id"], db, data=toy_data())
            refused.append(str(e.value))

    out = fs.run(algorithm="fedavg", data=toy_data(), db=db, on_round=try_resume, **SETTINGS)
    assert len(refused) == 1 and out.metrics["average"] > 0
    assert RunStore(db).run(out.run_id)["status"] == "done"


def test_two_resumes_at_once_one_trains(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    run_id = failed_run(db, monkeypatch)
    lock = checkpoint_path(db, run_id).with_suffix(".lock")
    lock.unlink()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    go_on = tmp_path / "go-on"  # the first one trains until the second one has answered
    first = subprocess.Popen(
        [sys.executable, "-c", RESUME, str(db), run_id, str(go_on)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not (lock.exists() and lock.read_text() == str(first.pid)):
        assert time.time() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = subprocess.run(
        [sys.executable, "-c", RESUME, str(db), run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    go_on.touch()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert second.returncode == 1 and f"being trained by process {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert RunStore(db).run(run_id)["status"] == "done"


# resume of the toy run (its data are not a registered scenario, so not via the CLI); with
# a third argument, each round waits until that file exists
RESUME = f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from toy import toy_data
from fedshift.api import resume
from fedshift.engine.runner import Runner
from fedshift.errors import FedshiftError
if len(sys.argv) > 3:
    original = Runner.train_round
    def wait(self, r):
        deadline = time.time() + 60
        while not os.path.exists(sys.argv[3]) and time.time() < deadline:
            time.sleep(0.05)
        return original(self, r)
    Runner.train_round = wait
try:
    resume(sys.argv[2], sys.argv[1], data=toy_data())
except FedshiftError as e:
    print(e, file=sys.stderr)
    sys.exit(1)
"""
