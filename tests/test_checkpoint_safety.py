"""Checkpoints cannot run code, belong to their run, live only under the store's folder,
and a run killed after its last round still ends with its complete results."""

from __future__ import annotations

import builtins
import json
import pickle
import sqlite3

import numpy as np
import pytest
import torch
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.api import checkpoint_path, resume
from fedshift.cli import app
from fedshift.engine import checkpoint as ckpt
from fedshift.engine.runner import Runner
from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=4, model_options={"hidden": [8]}, eval_every=2)


class Crash(BaseException):
    """Stands for a kill: nothing after the point where it is raised runs."""


def stopped_run(tmp_path, monkeypatch, seed=0, algorithm="fedavg") -> tuple:
    """A run recorded in ``tmp_path/runs.db`` that crashed in round 3 (checkpoint of 2)."""
    db = tmp_path / "runs.db"
    original = Runner.train_round

    def crash_in_round_3(self, r):
        if r == 2:
            raise Crash
        return original(self, r)

    monkeypatch.setattr(Runner, "train_round", crash_in_round_3)
    with pytest.raises(Crash):
        fs.run(
            algorithm=algorithm, data=toy_data(), db=db, seed=seed, checkpoint_every=1, **SETTINGS
        )
    monkeypatch.setattr(Runner, "train_round", original)
    run_id = RunStore(db).runs()[-1]["run_id"]
    return db, run_id


def rewrite(path, change) -> None:
    """Load a checkpoint, apply ``change`` to its dict, write it back."""
    state = ckpt.load_checkpoint(path)
    change(state)
    torch.save(state, path)


class Payload:
    """A pickle that creates ``marker`` when unpickled (what an attacker would plant)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_checkpoint_carrying_code_is_refused_and_never_run(tmp_path, monkeypatch, writer):
    db, run_id = stopped_run(tmp_path, monkeypatch)
    path = checkpoint_path(db, run_id)
    marker = tmp_path / "pwned"
    state = {**ckpt.load_checkpoint(path), "server": Payload(marker)}
    with open(path, "wb") as f:
        torch.save(state, f) if writer == "torch.save" else pickle.dump(state, f)
    with pytest.raises(FedshiftError, match="could run code when loaded, so it is refused"):
        resume(run_id, db, data=toy_data())
    assert not marker.exists()
    with open(path, "rb") as f:  # the payload is live: an unsafe load runs it
        torch.load(f, weights_only=False) if writer == "torch.save" else pickle.load(f)
    assert marker.exists()


def test_another_runs_checkpoint_is_refused(tmp_path, monkeypatch):
    db, first = stopped_run(tmp_path, monkeypatch, seed=0)
    _, second = stopped_run(tmp_path, monkeypatch, seed=1)
    checkpoint_path(db, second).write_bytes(checkpoint_path(db, first).read_bytes())
    with pytest.raises(FedshiftError, match=f"belongs to run '{first}', not to run '{second}'"):
        resume(second, db, data=toy_data())


def test_a_checkpoint_of_another_config_is_refused(tmp_path, monkeypatch):
    db, run_id = stopped_run(tmp_path, monkeypatch)
    with sqlite3.connect(db) as conn:  # the store now describes another experiment
        (config,) = conn.execute("SELECT config FROM runs WHERE run_id=?", (run_id,)).fetchone()
        changed = json.dumps({**json.loads(config), "lr": 0.5})
        conn.execute("UPDATE runs SET config=? WHERE run_id=?", (changed, run_id))
    with pytest.raises(FedshiftError, match="written for another config"):
        resume(run_id, db, data=toy_data())


@pytest.mark.parametrize("done", [999, 0, -1, 2.0])
def test_a_checkpoint_of_an_impossible_round_is_refused(tmp_path, monkeypatch, done):
    db, run_id = stopped_run(tmp_path, monkeypatch)
    rewrite(checkpoint_path(db, run_id), lambda s: s.update(rounds_done=done))
    with pytest.raises(FedshiftError, match=rf"says {done!r} rounds were done.*expected 1 to 4"):
        resume(run_id, db, data=toy_data())


def test_client_state_of_another_model_is_refused(tmp_path, monkeypatch):
    db, run_id = stopped_run(tmp_path, monkeypatch, algorithm="ditto")
    rewrite(
        checkpoint_path(db, run_id),
        lambda s: s.update(clients={k: v[:, :1] for k, v in s["clients"].items()}),
    )
    with pytest.raises(FedshiftError, match="client state does not fit"):
        resume(run_id, db, data=toy_data())


def test_a_checkpoint_of_an_older_version_still_resumes(tmp_path, monkeypatch):
    """Checkpoints written before runs were bound (plain values, no run id) load safely."""
    reference = fs.run(algorithm="fedavg", data=toy_data(), **SETTINGS)
    db, run_id = stopped_run(tmp_path, monkeypatch)
    legacy = ("format", "run_id", "config_hash", "final")
    rewrite(checkpoint_path(db, run_id), lambda s: [s.pop(k) for k in legacy])
    assert resume(run_id, db, data=toy_data()).metrics == reference.metrics


@pytest.mark.parametrize("bad", ["../../elsewhere/evil", "/tmp/evil", "ABCDEF0123", "0" * 11, ""])
def test_run_ids_that_could_name_another_path_are_refused(tmp_path, bad):
    with pytest.raises(FedshiftError, match="is not a fedshift run id"):
        checkpoint_path(tmp_path / "runs.db", bad)
    with pytest.raises(FedshiftError, match="is not a fedshift run id"):
        resume(bad, tmp_path / "runs.db", data=toy_data())


def test_a_stored_run_id_with_a_path_never_reaches_the_file_system(tmp_path, monkeypatch):
    db, run_id = stopped_run(tmp_path, monkeypatch)
    evil = "../../elsewhere/evil"
    with sqlite3.connect(db) as conn:
        for table in ("runs", "rounds"):
            conn.execute(f"UPDATE {table} SET run_id=? WHERE run_id=?", (evil, run_id))
    with pytest.raises(FedshiftError, match="is not a fedshift run id"):
        resume(evil, db, data=toy_data())
    res = CliRunner().invoke(app, ["run", "--resume", evil, "--db", str(db)])
    assert res.exit_code == 2 and "is not a fedshift run id" in res.output
    assert "Traceback" not in res.output
    listed = CliRunner().invoke(app, ["runs", "--db", str(db), "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout)[0]["resumable"] is False
    assert not (tmp_path.parent / "elsewhere").exists()


def kill_at_final_rename(monkeypatch):
    """Kill while the last round's checkpoint is written (before its rename)."""
    original = ckpt.os.replace

    def replace(src, dst):
        if str(dst).endswith(".pt") and torch.load(src, weights_only=True)["final"]:
            raise Crash
        return original(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", replace)


def kill_before_results(monkeypatch):
    """Kill after the final checkpoint is written, before the store records the results."""

    def finish(self, run_id, result, val):
        raise Crash

    monkeypatch.setattr(RunStore, "finish", finish)


def client_rows(db, run_id) -> list:
    return [{**r} for r in RunStore(db).run(run_id)["client_accuracy"]]


@pytest.mark.parametrize("kill", [kill_at_final_rename, kill_before_results])
@pytest.mark.parametrize("algorithm", ["fedavg", "ditto", "ucfl", "ftfa"])
def test_a_run_killed_after_its_last_round_resumes_to_complete_results(
    tmp_path, monkeypatch, kill, algorithm
):
    ref_db, db = tmp_path / "ref.db", tmp_path / "runs.db"
    reference = fs.run(algorithm=algorithm, data=toy_data(), db=ref_db, **SETTINGS)
    with monkeypatch.context() as patch:
        kill(patch)
        with pytest.raises(Crash):
            fs.run(algorithm=algorithm, data=toy_data(), db=db, checkpoint_every=1, **SETTINGS)
    (rec,) = RunStore(db).runs()
    assert rec["rounds_done"] == 4 and not rec["metrics"]
    resumed = resume(rec["run_id"], db, data=toy_data())
    assert resumed.metrics == reference.metrics
    final = RunStore(db).run(rec["run_id"])
    assert (
        final["status"] == "done"
        and final["metrics"] == RunStore(ref_db).run(reference.run_id)["metrics"]
    )
    assert client_rows(db, rec["run_id"]) == client_rows(ref_db, reference.run_id)
    assert [r["round"] for r in final["round_metrics"]] == [1, 2, 3, 4]


def test_a_run_an_older_version_marked_done_without_results_is_repaired(tmp_path):
    """What the bug left behind: status done, metrics {}, no client rows, and a checkpoint
    of the last round without final results. ``--resume`` repairs it."""
    ref_db, db = tmp_path / "ref.db", tmp_path / "runs.db"
    reference = fs.run(algorithm="ftfa", data=toy_data(), db=ref_db, **SETTINGS)
    out = fs.run(algorithm="ftfa", data=toy_data(), db=db, **SETTINGS)
    legacy = ("format", "run_id", "config_hash", "final")
    rewrite(checkpoint_path(db, out.run_id), lambda s: [s.pop(k) for k in legacy])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET metrics='{}' WHERE run_id=?", (out.run_id,))
        conn.execute("DELETE FROM client_accuracy WHERE run_id=?", (out.run_id,))
    listed = CliRunner().invoke(app, ["runs", "--db", str(db), "--json"])
    assert json.loads(listed.stdout)[0]["resumable"] is True
    repaired = resume(out.run_id, db, data=toy_data())
    assert repaired.metrics == reference.metrics
    assert (
        RunStore(db).run(out.run_id)["metrics"] == RunStore(ref_db).run(reference.run_id)["metrics"]
    )
    assert client_rows(db, out.run_id) == client_rows(ref_db, reference.run_id)
    with pytest.raises(FedshiftError, match="already finished"):
        resume(out.run_id, db, data=toy_data())


def test_only_tensors_and_plain_values_are_written():
    assert ckpt.plain({"a": np.float64(1.5), "b": (np.int64(2), [np.bool_(True)])}) == {
        "a": 1.5,
        "b": (2, [True]),
    }
    assert type(ckpt.plain(np.float32(0.5))) is float
    with pytest.raises(TypeError, match="tensors and plain values only"):
        ckpt.plain({"x": object()})
