"""``--resume RUN --set key=value``: change how a run goes on (lr, the method's step sizes,
more rounds) from its checkpoint, recorded with the run; keys that would change its data,
model or method are refused before anything is touched."""

from __future__ import annotations

import json

import pytest
import torch
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.api import checkpoint_path, resume
from fedshift.cli import app
from fedshift.engine.checkpoint import load_checkpoint
from fedshift.engine.runner import Diverged, Runner
from fedshift.engine.tree import flatten
from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, model_options={"hidden": [8]}, eval_every=1)


def start(db, rounds=4, crash_at=None, monkeypatch=None, **kw):
    """A recorded run; with ``crash_at`` it dies in that round (0-based) after checkpoints."""
    if crash_at is not None:
        original = Runner.train_round

        def crash(self, r):
            if r == crash_at:
                raise RuntimeError("power cut")
            return original(self, r)

        monkeypatch.setattr(Runner, "train_round", crash)
        with pytest.raises(RuntimeError):
            fs.run(algorithm="fedavg", data=toy_data(), db=db, rounds=rounds, **{**SETTINGS, **kw})
        monkeypatch.setattr(Runner, "train_round", original)
        (rec,) = RunStore(db).runs()
        return rec["run_id"]
    return fs.run(algorithm="fedavg", data=toy_data(), db=db, rounds=rounds, **{**SETTINGS, **kw})


def test_extending_a_finished_run_equals_the_longer_run(tmp_path):
    db = tmp_path / "r.db"
    short = start(db, rounds=4)
    extended = resume(short.run_id, db, data=toy_data(), overrides={"rounds": "6"})
    longer = fs.run(algorithm="fedavg", data=toy_data(), rounds=6, **SETTINGS)
    assert extended.metrics == longer.metrics
    got = flatten(extended.result.server)
    for k, v in flatten(longer.result.server).items():
        assert torch.equal(got[k], v), k
    rec = RunStore(db).run(short.run_id)
    assert rec["status"] == "done" and rec["rounds"] == 6 and rec["config"]["rounds"] == 6
    assert [r["round"] for r in rec["round_metrics"]] == [1, 2, 3, 4, 5, 6]
    (entry,) = rec["overrides"]
    assert entry["round"] == 4 and entry["changes"] == {"rounds": {"from": 4, "to": 6}}


def test_a_finished_run_is_refused_without_more_rounds(tmp_path):
    db = tmp_path / "r.db"
    out = start(db, rounds=3)
    for changes in ({}, {"rounds": "3"}, {"lr": "0.01"}):
        with pytest.raises(FedshiftError, match="already finished.*rounds=N with N > 3"):
            resume(out.run_id, db, data=toy_data(), overrides=changes)
    assert RunStore(db).run(out.run_id)["overrides"] == []


def test_a_changed_lr_applies_from_the_checkpoint_and_is_recorded(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    run_id = start(db, rounds=5, crash_at=3, monkeypatch=monkeypatch, checkpoint_every=2)
    out = resume(run_id, db, data=toy_data(), overrides={"lr": "0.02"})
    rec = RunStore(db).run(run_id)
    assert rec["status"] == "done" and rec["config"]["lr"] == 0.02
    (entry,) = rec["overrides"]
    assert entry["round"] == 2 and entry["changes"] == {"lr": {"from": 0.1, "to": 0.02}}
    # rounds 1-2 ran at lr 0.1 (checkpoint), 3-5 at 0.02: not the 0.1 run, not the 0.02 run
    for lr in (0.1, 0.02):
        other = fs.run(algorithm="fedavg", data=toy_data(), rounds=5, **{**SETTINGS, "lr": lr})
        assert other.metrics != out.metrics
    assert load_checkpoint(checkpoint_path(db, run_id))["rounds_done"] == 5


def test_a_method_step_size_can_change_on_resume(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    run_id = start(db, rounds=4, crash_at=2, monkeypatch=monkeypatch, checkpoint_every=1)
    resume(run_id, db, data=toy_data(), overrides={"algorithm.server_lr": "0.5"})
    rec = RunStore(db).run(run_id)
    assert rec["config"]["algorithm.server_lr"] == 0.5
    assert rec["overrides"][0]["changes"] == {"algorithm.server_lr": {"from": 1.0, "to": 0.5}}


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("scenario.alpha", "0.1", "cannot change 'scenario.alpha'"),
        ("model.hidden", "[16]", "cannot change 'model.hidden'"),
        ("seed", "3", "cannot change 'seed'"),
        ("algorithm", "fedprox", "cannot change 'algorithm'"),
        ("batch_size", "4", "cannot change 'batch_size'"),
        ("lr", "-1", "lr must be positive"),
        ("algorithm.server_lr", "abc", "not a number"),
        ("rounds", "1", "fewer than the 2 rounds"),
    ],
)
def test_changes_a_resume_cannot_make_are_refused_untouched(
    tmp_path, monkeypatch, key, value, match
):
    db = tmp_path / "r.db"
    run_id = start(db, rounds=4, crash_at=2, monkeypatch=monkeypatch, checkpoint_every=1)
    before = RunStore(db).run(run_id)
    ckpt = checkpoint_path(db, run_id).read_bytes()
    with pytest.raises(FedshiftError, match=match):
        resume(run_id, db, data=toy_data(), overrides={key: value})
    after = RunStore(db).run(run_id)
    assert (after["config"], after["overrides"], after["status"]) == (
        before["config"],
        [],
        "failed",
    )
    assert checkpoint_path(db, run_id).read_bytes() == ckpt


def test_a_resume_killed_before_its_first_checkpoint_can_resume_again(tmp_path, monkeypatch):
    """The store records the change before a checkpoint of the new config exists: the
    old checkpoint must still be accepted, also after a second change at the same round."""
    db = tmp_path / "r.db"
    run_id = start(db, rounds=5, crash_at=3, monkeypatch=monkeypatch, checkpoint_every=3)
    original = Runner.train_round

    def crash(self, r):
        raise RuntimeError("power cut again")

    monkeypatch.setattr(Runner, "train_round", crash)
    with pytest.raises(RuntimeError):
        resume(run_id, db, data=toy_data(), overrides={"lr": "0.05"})
    monkeypatch.setattr(Runner, "train_round", original)
    out = resume(run_id, db, data=toy_data(), overrides={"lr": "0.02"})
    rec = RunStore(db).run(run_id)
    assert rec["status"] == "done" and [e["round"] for e in rec["overrides"]] == [3, 3]
    assert rec["overrides"][1]["changes"]["lr"] == {"from": 0.05, "to": 0.02}
    direct = fs.run(algorithm="fedavg", data=toy_data(), db=tmp_path / "d.db", rounds=5, **SETTINGS)
    assert out.metrics != direct.metrics  # rounds 4-5 ran at lr 0.02


def test_another_runs_checkpoint_is_still_refused_after_a_change(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    run_id = start(db, rounds=4, crash_at=2, monkeypatch=monkeypatch, checkpoint_every=1)
    state = load_checkpoint(checkpoint_path(db, run_id))
    state["config_hash"] = "0" * 64
    torch.save(state, checkpoint_path(db, run_id))
    with pytest.raises(FedshiftError, match="another config"):
        resume(run_id, db, data=toy_data(), overrides={"lr": "0.05"})
    assert RunStore(db).run(run_id)["overrides"] == []


def test_cli_diverged_run_fixed_with_a_lower_lr(tmp_path):
    db = tmp_path / "r.db"
    runner = CliRunner()
    args = ["run", "--set", "lr=1e18", "--rounds", "6", "--db", str(db)]
    res = runner.invoke(app, [*args, "--set", "checkpoint_every=2"])
    assert res.exit_code == 3 and "--resume" in res.output, res.output
    (rec,) = RunStore(db).runs()
    res = runner.invoke(
        app, ["run", "--resume", rec["run_id"], "--db", str(db), "--set", "lr=0.05", "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["metrics"]["average"] > 20  # chance is 10 %
    (rec,) = RunStore(db).runs()
    # diverged in round 4 (4 of 6 rounds lost): the round-2 checkpoint was the last
    assert rec["status"] == "done" and rec["overrides"][0]["round"] == 2
    res = runner.invoke(app, ["run", "--resume", rec["run_id"], "--db", str(db), "--seed", "2"])
    assert res.exit_code == 2 and "--resume continues" in res.output


def test_diverged_runs_resumed_unchanged_diverge_again(tmp_path):
    db = tmp_path / "r.db"
    with pytest.raises(Diverged):
        start(db, rounds=10, lr=1e18, checkpoint_every=1)
    (rec,) = RunStore(db).runs()
    with pytest.raises(Diverged):
        resume(rec["run_id"], db, data=toy_data())
    assert RunStore(db).run(rec["run_id"])["status"] == "diverged"
