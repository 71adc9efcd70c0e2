"""SIGINT / SIGTERM during a long round stop between two local steps, not at the round's
end: the round is abandoned while it has changed no state, the checkpoint holds the rounds
before it, and the resumed run is the uninterrupted one."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from toy import toy_data

import fedshift as fs
from fedshift.api import checkpoint_path, resume
from fedshift.engine.checkpoint import load_checkpoint
from fedshift.engine.local import LocalTrainer
from fedshift.engine.runner import Runner, RunStopped
from fedshift.engine.store import ClientStore
from fedshift.results.store import RunStore

SETTINGS = dict(
    lr=0.1, batch_size=8, rounds=4, local_epochs=3, model_options={"hidden": [8]}, eval_every=1
)


def stop_at_step(monkeypatch, round_: int, step: int) -> dict:
    """Request a stop (as the signal handler does) at local step ``step`` of ``round_``
    (0-based); counts the local steps each round reaches."""
    seen: dict = {"steps": {}}
    train_round, between = Runner.train_round, LocalTrainer.between_steps

    def spy_round(self, r):
        seen["runner"], seen["round"] = self, r
        return train_round(self, r)

    def spy_step(self):
        r = seen["round"]
        seen["steps"][r] = seen["steps"].get(r, 0) + 1
        if r == round_ and seen["steps"][r] == step:
            seen["runner"].stop_requested = True
        between(self)

    monkeypatch.setattr(Runner, "train_round", spy_round)
    monkeypatch.setattr(LocalTrainer, "between_steps", spy_step)
    return seen


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox"])  # fused and general step
def test_a_stop_mid_round_abandons_it_and_resumes_identically(tmp_path, monkeypatch, algorithm):
    reference = fs.run(algorithm=algorithm, data=toy_data(), **SETTINGS)
    db = tmp_path / "r.db"
    seen = stop_at_step(monkeypatch, round_=2, step=3)
    with pytest.raises(RunStopped) as stopped:
        fs.run(algorithm=algorithm, data=toy_data(), db=db, checkpoint_every=10, **SETTINGS)
    assert stopped.value.rounds_done == 2
    assert seen["steps"][2] == 3 < seen["steps"][1]  # cut short, not run to the end
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "interrupted" and rec["rounds_done"] == 2
    assert load_checkpoint(checkpoint_path(db, rec["run_id"]))["rounds_done"] == 2
    monkeypatch.undo()
    resumed = resume(rec["run_id"], db, data=toy_data())
    assert resumed.metrics == reference.metrics


def test_a_round_that_changed_client_state_is_finished_first(tmp_path, monkeypatch):
    """With several cohorts per round, a stop after the first one stored its clients'
    state cannot abandon the round: it is finished and checkpointed, as before."""
    db = tmp_path / "r.db"
    seen = stop_at_step(monkeypatch, round_=-1, step=0)  # only spies
    put = ClientStore.put

    def stop_after_first_put(self, ids, rows):
        put(self, ids, rows)
        if seen["round"] == 1:
            seen["runner"].stop_requested = True

    monkeypatch.setattr(ClientStore, "put", stop_after_first_put)
    with pytest.raises(RunStopped) as stopped:
        fs.run(algorithm="ditto", data=toy_data(), db=db, cohort_size=3, **SETTINGS)
    assert stopped.value.rounds_done == 2
    (rec,) = RunStore(db).runs()
    assert load_checkpoint(checkpoint_path(db, rec["run_id"]))["rounds_done"] == 2


CMD = [
    sys.executable,
    "-m",
    "fedshift.cli",
    "run",
    "--set",
    "scenario=digits-shortcut",
    "--set",
    "local_epochs=5000",
    "--rounds",
    "2",
]


def test_sigterm_during_a_long_first_round_stops_within_seconds(tmp_path):
    """A round of minutes (5,000 local epochs): SIGTERM ends the process in seconds."""
    db = tmp_path / "r.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*CMD, "--db", str(db)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while True:  # wait until it trains: its run is recorded
        assert time.time() < deadline and proc.poll() is None
        if db.exists():
            with sqlite3.connect(db) as conn:
                if conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]:
                    break
        time.sleep(0.1)
    time.sleep(1.0)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # still in its round: the stop did not interrupt it
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert time.time() - sent < 20
    assert "stopped after round 0" in err and "Traceback" not in err
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "interrupted" and rec["rounds_done"] == 0
