"""The run store keeps config, rounds and per-client accuracies, and survives failures."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=2, model_options={"hidden": [8]})


def test_run_is_recorded_with_per_client_accuracies(tmp_path):
    db = tmp_path / "runs.db"
    out = fs.run(algorithm="fedavg", data=toy_data(), db=db, **SETTINGS)
    rec = RunStore(db).run(out.run_id)
    assert rec["status"] == "done" and rec["rounds_done"] == 2
    assert rec["config"]["algorithm"] == "fedavg" and rec["config"]["model.hidden"] == [8]
    assert rec["environment"]["torch"]
    # float rounding differs between CPU types: the store says which one trained the run
    assert rec["environment"]["cpu"]
    assert rec["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert rec["metrics"] == out.metrics
    assert [r["round"] for r in rec["round_metrics"]] == [1, 2]
    test_rows = [r for r in rec["client_accuracy"] if r["split"] == "test"]
    assert len(test_rows) == 7 * 2
    assert rec["bytes_up"] == out.result.bytes_up


def test_failed_run_keeps_its_rounds_and_error(tmp_path, monkeypatch):
    from fedshift.engine.runner import Runner

    db = tmp_path / "runs.db"
    original = Runner.train_round

    def failing(self, r):
        if r == 1:
            raise RuntimeError("simulated crash")
        return original(self, r)

    monkeypatch.setattr(Runner, "train_round", failing)
    with pytest.raises(RuntimeError):
        fs.run(algorithm="fedavg", data=toy_data(), db=db, **SETTINGS)
    (rec,) = RunStore(db).runs()
    assert rec["status"] == "failed" and "simulated crash" in rec["error"]
    assert rec["rounds_done"] == 1


def test_unknown_run_id_is_a_clear_error(tmp_path):
    with pytest.raises(fs.errors.FedshiftError, match="no run"):
        RunStore(tmp_path / "x.db").run("abc")


def test_per_round_log_of_an_algorithm_reaches_the_store(tmp_path, monkeypatch):
    """What ``aggregate`` writes into ``info.log`` is kept with the round, as plain JSON."""
    import torch

    from fedshift.algorithms.fedavg import FedAvg

    original = FedAvg.aggregate

    def logging_aggregate(self, server, uploads, info):
        info.log["participants"] = info.ids
        info.log["mean_weight"] = info.num_examples.mean()
        return original(self, server, uploads, info)

    monkeypatch.setattr(FedAvg, "aggregate", logging_aggregate)
    db = tmp_path / "runs.db"
    out = fs.run(algorithm="fedavg", data=toy_data(), db=db, **SETTINGS)
    rounds = RunStore(db).run(out.run_id)["round_metrics"]
    sizes = toy_data().train.sizes().float()
    for r in rounds:
        assert r["extras"]["participants"] == list(range(7))
        assert r["extras"]["mean_weight"] == pytest.approx(float(sizes.mean()))
    assert out.result.rounds[0].extras["participants"] == list(range(7))
    assert torch.is_tensor(out.result.server["p"]["head.weight"])
