"""Fault containment: NaN/Inf or exploding uploads are excluded and recorded; injected
faults (lost, late, corrupted uploads) happen as configured and are reported per round;
a non-finite global state stops the run with its last checkpoint intact."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.fedavg import FedAvg
from fedshift.api import checkpoint_path, resume
from fedshift.engine.checkpoint import load_checkpoint
from fedshift.engine.faults import injected_fault
from fedshift.engine.runner import Diverged, NonFiniteState
from fedshift.engine.tree import flatten, tree_map
from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=4, model_options={"hidden": [8]}, eval_every=1)


def run(faults=None, data=None, **kw):
    return fs.run(
        algorithm=kw.pop("algorithm", "fedavg"),
        data=data or toy_data(),
        faults_options=faults or {},
        **{**SETTINGS, **kw},
    )


def events(out, kind=None):
    found = [
        (rec.round, e["client"], e["event"])
        for rec in out.result.rounds
        for e in rec.extras.get("events", [])
    ]
    return [f for f in found if kind is None or f[2] == kind]


@pytest.fixture
def aggregated_ids(monkeypatch):
    """Record which client ids reach ``aggregate`` in each round."""
    seen: list[list[int]] = []
    original = FedAvg.aggregate

    def spy(self, server, uploads, info):
        seen.append(info.ids.tolist())
        return original(self, server, uploads, info)

    monkeypatch.setattr(FedAvg, "aggregate", spy)
    return seen


def test_a_client_whose_training_turns_nan_is_excluded_and_recorded(aggregated_ids):
    data = toy_data()
    lo, hi = int(data.train.offsets[3]), int(data.train.offsets[4])
    data.train.x[lo:hi] = float("inf")  # client 3's local training produces NaN
    out = run(data=data)
    assert events(out) == [(r, 3, "nonfinite") for r in range(1, 5)]
    assert all(3 not in ids and len(ids) == 6 for ids in aggregated_ids)
    assert all(torch.isfinite(v).all() for v in flatten(out.result.server).values())
    assert all(v == v for v in out.metrics["per_env"].values())  # no NaN metrics


def test_a_round_where_every_client_diverged_logs_nan_not_zero():
    data = toy_data()
    data.train.x[:] = float("inf")  # every client's training produces NaN
    seen = []
    # more than half of its 4 rounds trained nothing: diverged (tests/engine/test_divergence.py)
    with pytest.raises(Diverged, match="round 3"):
        run(data=data, on_round=seen.append)
    assert len(seen) == 3 and all(rec.loss != rec.loss for rec in seen)  # NaN, not 0.0
    kinds = {e["event"] for rec in seen for e in rec.extras["events"]}
    assert kinds == {"nonfinite", "no-usable-upload"}


def test_corrupted_upload_is_excluded_like_a_lost_one():
    corrupted = run({"clients": [2], "corrupt": 1.0})
    dropped = run({"clients": [2], "drop": 1.0})
    assert events(corrupted, "corrupted") == [(r, 2, "corrupted") for r in range(1, 5)]
    assert events(corrupted, "nonfinite") == [(r, 2, "nonfinite") for r in range(1, 5)]
    assert events(dropped) == [(r, 2, "dropped") for r in range(1, 5)]
    assert corrupted.summary()["events"] == {"corrupted": 4, "nonfinite": 4}
    for k, v in dropped.result.server.items():
        torch.testing.assert_close(corrupted.result.server[k], v)


def test_dropped_uploads_follow_the_seeded_draw_at_any_cohort_size(aggregated_ids):
    faults = {"drop": 0.4}
    outs = [run(faults, cohort_size=c) for c in (1, 3, 0)]
    expected = [
        (r + 1, c, "dropped")
        for r in range(4)
        for c in range(7)
        if injected_fault(fs.engine.faults.FaultOptions(drop=0.4), 0, r, c) == "dropped"
    ]
    assert 0 < len(expected) < 28
    for o in outs:
        assert events(o) == expected
        assert o.metrics == outs[0].metrics
    lost = {(r, c) for r, c, _ in expected}
    assert aggregated_ids[:4] == [[c for c in range(7) if (r, c) not in lost] for r in range(1, 5)]


def test_a_slow_client_arrives_tau_rounds_late(aggregated_ids):
    out = run({"clients": [5], "delay": 2}, rounds=5)
    assert events(out) == [(r, 5, "delayed") for r in range(1, 6)]
    on_time = [0, 1, 2, 3, 4, 6]
    # rounds 1–2: client 5's uploads are in flight; from round 3 on, the one sent 2 rounds ago
    assert aggregated_ids == [on_time, on_time, on_time + [5], on_time + [5], on_time + [5]]


def test_exploding_norm_is_excluded_when_configured(monkeypatch):
    original = FedAvg.client_update

    def blow_up_client_1(self, payload, state, cohort):
        result = original(self, payload, state, cohort)
        rows = (cohort.ids == 1).nonzero().flatten()
        for v in flatten(result.upload).values():
            v[rows] *= 1e4
        return result

    monkeypatch.setattr(FedAvg, "client_update", blow_up_client_1)
    out = run({"max_norm": 10.0}, rounds=2)
    assert events(out) == [(1, 1, "norm"), (2, 1, "norm")]
    assert run(rounds=2).result.rounds[0].extras == {}


def test_non_finite_global_state_stops_with_a_usable_checkpoint(tmp_path, monkeypatch):
    original = FedAvg.aggregate

    def nan_in_round_3(self, server, uploads, info):
        new = original(self, server, uploads, info)
        if info.round == 2:
            new = tree_map(lambda v: v * float("nan"), new)
        return new

    monkeypatch.setattr(FedAvg, "aggregate", nan_in_round_3)
    db = tmp_path / "runs.db"
    with pytest.raises(NonFiniteState, match="round 3"):
        run(db=db, checkpoint_every=1)
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "diverged" and "non-finite" in rec["error"]
    assert rec["rounds_done"] == 2 and rec["metrics"] is None
    state = load_checkpoint(checkpoint_path(db, rec["run_id"]))
    assert state["rounds_done"] == 2
    assert all(torch.isfinite(v).all() for v in state["server"].values())
    monkeypatch.setattr(FedAvg, "aggregate", original)
    resumed = resume(rec["run_id"], db, data=toy_data())
    assert resumed.metrics == run().metrics


def test_resume_keeps_late_uploads_in_flight(tmp_path, monkeypatch):
    from fedshift.engine.runner import Runner

    faults = {"clients": [5], "delay": 2}
    reference = run(faults, rounds=5)
    original = Runner.train_round

    def crash_in_round_4(self, r):
        if r == 3:
            raise RuntimeError("power cut")
        return original(self, r)

    monkeypatch.setattr(Runner, "train_round", crash_in_round_4)
    db = tmp_path / "runs.db"
    with pytest.raises(RuntimeError):
        run(faults, rounds=5, db=db, checkpoint_every=1)
    monkeypatch.setattr(Runner, "train_round", original)
    (rec,) = RunStore(db).runs()
    resumed = resume(rec["run_id"], db, data=toy_data())
    assert resumed.metrics == reference.metrics
    got = flatten(resumed.result.server)
    for k, v in flatten(reference.result.server).items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize(
    ("faults", "named"),
    [
        ({"drop": 1.5}, "faults.drop"),
        ({"delay": -1}, "faults.delay"),
        ({"clients": [-2]}, "faults.clients"),
        ({"dropp": 0.1}, "faults.dropp"),
    ],
)
def test_bad_fault_options_are_one_sentence(faults, named):
    with pytest.raises(FedshiftError, match=named.replace(".", r"\.")):
        run(faults)


def test_finite_rows_is_exact_where_a_row_sum_overflows():
    """The one-pass check (a row's sum carries NaN and ±inf) answers as isfinite().all()
    does, also for a finite row whose float32 sum overflows, and on the whole-tree check."""
    from fedshift.engine.faults import finite, finite_rows

    v = torch.randn(5, 7)
    v[1, 3] = float("nan")
    v[2, 0] = float("-inf")
    v[3] = 3e38  # finite entries, an infinite sum
    v[4, 1], v[4, 2] = float("inf"), float("-inf")  # their sum is NaN
    assert finite_rows(v).tolist() == torch.isfinite(v).all(1).tolist()
    assert finite_rows(v).tolist() == [True, False, False, True, False]
    assert finite({"a": v[[0, 3]], "n": torch.arange(3)})
    assert not finite({"a": v[[0, 3]], "b": v[1]})


def test_finite_rows_of_several_tensors_is_the_rows_of_each_together():
    """Row i is finite only where it is finite in every tensor (a row's trouble may sit in
    any of them, overflowing sums included)."""
    from fedshift.engine.faults import finite_rows

    a, b = torch.randn(4, 3), torch.randn(4, 2, 5, dtype=torch.float64)
    a[1, 2] = float("nan")
    b[2, 1, 4] = float("inf")
    a[3] = 3e38  # an overflowing but finite row
    got = finite_rows(a, b).tolist()
    assert got == [True, False, False, True]
    assert got == (torch.isfinite(a).all(1) & torch.isfinite(b).flatten(1).all(1)).tolist()
    assert finite_rows(a[[0, 3]], b[[0, 3]]).tolist() == [True, True]
