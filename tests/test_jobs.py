"""The configs × seeds loop behind `run`, `sweep`, `reproduce` (jobs.run_jobs) and the one
aggregation over seeds (eval.metrics.over_seeds) that tolerates a diverged seed."""

from __future__ import annotations

import math

import pytest

from fedshift.config import resolve
from fedshift.engine.runner import Diverged
from fedshift.eval.metrics import over_seeds
from fedshift.jobs import Job, diverged_metrics, run_jobs
from fedshift.results.store import RunStore

SMALL = {
    "scenario": "digits-shortcut",
    "scenario.clients": "3",
    "rounds": "2",
    "batch_size": "20",
    "local_steps": "2",
}


def jobs(*seeds: int, **extra) -> list[Job]:
    return [Job(resolve(None, {**SMALL, **extra, "seed": s}), f"seed {s}") for s in seeds]


def test_runs_are_trained_one_at_a_time_as_the_caller_asks(tmp_path):
    db = tmp_path / "r.db"
    for finished in run_jobs(jobs(0, 1, 2), db=db, group="g1"):
        assert finished.summary["run_id"] == finished.run_id
        break  # a sweep stops a point this way: the other seeds never start
    runs = RunStore(db).runs()
    assert len(runs) == 1 and runs[0]["status"] == "done"


def test_reuse_takes_the_stored_run_and_never_builds_its_data(tmp_path):
    db = tmp_path / "r.db"
    first = list(run_jobs(jobs(0, 1), db=db))

    def must_not_build():
        raise AssertionError("a reused run needs no data")

    again = [Job(j.config, j.label, must_not_build) for j in jobs(0, 1)]
    reused = list(run_jobs(again, db=db, reuse=True))
    assert [f.run_id for f in reused] == [f.run_id for f in first]
    assert all(f.reused and f.summary is None for f in reused)
    assert [f.metrics for f in reused] == [f.metrics for f in first]
    assert len(RunStore(db).runs()) == 2


def test_a_diverged_run_is_a_result_only_when_the_caller_keeps_it(tmp_path):
    db = tmp_path / "r.db"
    with pytest.raises(Diverged):
        list(run_jobs(jobs(0, lr="1e30"), db=db))
    kept = list(run_jobs(jobs(0, 1, lr="1e30"), db=db, keep_diverged=True))
    assert [bool(f.diverged) for f in kept] == [True, True]
    assert all(f.metrics["degenerate"] and f.metrics["worst"] is None for f in kept)


def test_reuse_keeps_a_diverged_run_as_its_result_without_training_it_again(tmp_path):
    """Resumed from its checkpoint a diverged run diverges again (the same numbers): with
    ``reuse`` and ``keep_diverged`` (a table's seed on --resume) the stored run stands."""
    db = tmp_path / "r.db"
    first = list(run_jobs(jobs(0, lr="1e30"), db=db, keep_diverged=True))

    def must_not_build():
        raise AssertionError("a diverged run kept as a result needs no data")

    again = [Job(j.config, j.label, must_not_build) for j in jobs(0, lr="1e30")]
    kept = list(run_jobs(again, db=db, reuse=True, keep_diverged=True))
    assert [f.run_id for f in kept] == [first[0].run_id]
    assert kept[0].reused and kept[0].diverged and kept[0].metrics["degenerate"]
    assert "diverged in round" in kept[0].diverged
    assert len(RunStore(db).runs()) == 1


def test_over_seeds_leaves_a_diverged_seed_out_of_each_number():
    ok = {
        "worst": 40.0,
        "average": 60.0,
        "worst_client": 30.0,
        "per_env": {"a": 40.0, "b": 80.0},
        "per_client": [50.0, 70.0],
    }
    other = {**ok, "worst": 50.0, "per_env": {"a": 50.0, "b": 70.0}}
    mean, std = over_seeds([ok, diverged_metrics("nan in round 2"), other])
    assert mean["worst"] == 45.0 and std["worst"] == pytest.approx(math.sqrt(50))
    assert mean["per_env"] == {"a": 45.0, "b": 75.0}
    assert mean["per_client"] == [50.0, 70.0]
    assert mean["degenerate"] and mean["degenerate_seeds"] == 1
    alone, _ = over_seeds([diverged_metrics("x")])
    assert math.isnan(alone["worst"]) and alone["per_env"] == {}


def test_one_run_has_one_identity_however_its_options_are_written():
    """``--grid algorithm.penalty=0.001`` (a string), a preset's 0.001 (a number) and the
    default left out are the same run for ``--resume``; another value is not."""
    from fedshift.jobs import _identity, canonical_options

    base = {"algorithm": "fediir", "lr": 0.003, "scenario": "scm"}
    as_string = {**base, "algorithm.penalty": "0.001"}  # FedIIR's default γ
    assert canonical_options(as_string) == base
    assert _identity(as_string) == _identity(base)
    other = {**base, "algorithm.penalty": 0.01}
    assert _identity(other) == _identity({**base, "algorithm.penalty": "0.01"})
    assert _identity(other) != _identity(base)
    # a method that is not registered (any more): its options are compared as written
    stale = {"algorithm": "not-a-method", "algorithm.x": "1"}
    assert canonical_options(stale) == stale
