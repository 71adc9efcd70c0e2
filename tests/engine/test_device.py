"""``device = "auto"`` (the default) resolves to the best device here, the store records
where a run trained, and a run resumes on a machine without the device it began on."""

from __future__ import annotations

import pytest
import torch
from toy import power_cut_at, toy_data

import fedshift as fs
from fedshift import experiment
from fedshift.api import resume
from fedshift.config import RunConfig
from fedshift.errors import FedshiftError
from fedshift.experiment import resolve_device
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=4, eval_every=2, model_options={"hidden": [8]})


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    assert RunConfig().device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")  # explicit values as before
    with pytest.raises(FedshiftError, match="not supported; use auto, cpu"):
        RunConfig(device="tpu").validate()


def test_store_keeps_auto_in_the_config_and_the_resolved_device_beside_it(tmp_path):
    db = tmp_path / "runs.db"
    out = fs.run(algorithm="fedavg", data=toy_data(), db=db, **SETTINGS)
    record = RunStore(db).run(out.run_id)
    assert record["config"]["device"] == "auto"
    assert record["environment"]["device"] == str(resolve_device("auto"))


def test_a_run_begun_on_cuda_resumes_on_a_cpu_machine(tmp_path, monkeypatch):
    """Begun with an explicit ``device=cuda`` (faked here), stopped, then resumed where CUDA
    is missing: refused with the way out, which works and is recorded."""
    db = tmp_path / "runs.db"
    real = experiment.resolve_device
    monkeypatch.setattr(experiment, "resolve_device", lambda name: torch.device("cpu"))
    with power_cut_at(monkeypatch, 3), pytest.raises(RuntimeError, match="power cut"):
        fs.run(algorithm="fedavg", data=toy_data(), db=db, device="cuda", **SETTINGS)
    monkeypatch.setattr(experiment, "resolve_device", real)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (run,) = RunStore(db).runs()
    with pytest.raises(FedshiftError, match="CUDA is not available here"):
        resume(run["run_id"], db, data=toy_data())
    done = resume(run["run_id"], db, data=toy_data(), overrides={"device": "cpu"})
    assert done.metrics == fs.run(algorithm="fedavg", data=toy_data(), **SETTINGS).metrics
    record = RunStore(db).run(run["run_id"])
    assert record["config"]["device"] == "cpu"
    assert record["overrides"][0]["changes"] == {"device": {"from": "cuda", "to": "cpu"}}
    assert [e["device"] for e in record["environment"]["resumes"]] == ["cpu"]
    assert record["environment"]["resumes"][0]["cpu"]  # which CPU: its rounding differs


def test_to_device_moves_every_tensor_of_a_nested_tree():
    """What a method creates on the CPU (a round counter, DRO weights) joins the run's
    device: the runner passes init/configure/aggregate results through ``to_device``
    (on a GPU, a CPU counter met the cohort's tensors and stopped 10 methods)."""
    from fedshift.engine.contract import Payload
    from fedshift.engine.tree import to_device

    tree = {"round": torch.zeros(()), "m": {"w": torch.ones(2, 3), "n": torch.arange(3)}}
    moved = to_device(tree, "meta")
    assert {v.device.type for v in (moved["round"], moved["m"]["w"], moved["m"]["n"])} == {"meta"}
    assert moved["m"]["n"].dtype == torch.int64
    same = to_device(tree, "cpu")
    assert same["m"]["w"] is tree["m"]["w"], "no copy where the tensor is already there"
    payload = Payload({"round": torch.zeros(())}, {"alpha": torch.ones(4)}).to("meta")
    assert payload.broadcast["round"].is_meta and payload.per_client["alpha"].is_meta


def test_to_device_keeps_float64_off_mps():
    """MPS has no float64: such tensors (UCFL's silhouettes) stay where they are."""
    from fedshift.engine.tree import to_device

    kept = torch.zeros(3, dtype=torch.float64)
    assert to_device({"s": kept}, "mps")["s"] is kept
