"""The benchmark scripts still run against the current engine (a broken benchmark is a
figure nobody can re-measure): one tiny W3 pair per kind of step, fedshift against the
per-client reference."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def round_speed(shared_datasets):
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        mp.setenv("FEDSHIFT_DATA", str(shared_datasets))
        spec = importlib.util.spec_from_file_location("round_speed", BENCH / "round_speed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    sys.modules.pop("reference", None)


@pytest.mark.parametrize("algorithm", ["fedsdr", "pfedme", "scaffold"])
def test_w3_pair_runs(round_speed, algorithm):
    out = round_speed.w3_case(algorithm, clients=8, rate=1.0, samples=800, rounds=1)
    assert out["fedshift_s"] > 0 and out["reference_s"] > 0 and out["ratio"] > 0


def test_reference_pfedme_is_the_same_algorithm(round_speed, monkeypatch):
    """The reference's pFedMe (PFLlib's step: K module forwards and backwards per minibatch,
    client after client) trains what fedshift's cohort rule trains: after a round, the same
    server model and personal models, to float rounding; and the reference does take that
    step, not fedshift's rule client by client."""
    import fedshift as fs
    from fedshift.engine.rule import update_rule
    from fedshift.experiment import build_experiment

    calls = []
    pfllib = round_speed.pfllib_pfedme_step

    def counted(algorithm, model):
        step = pfllib(algorithm, model)
        return update_rule(lambda *a: calls.append(1) or step(*a))

    monkeypatch.setattr(round_speed, "pfllib_pfedme_step", counted)

    data = fs.scenario("cmnist", clients=8, samples=800, seed=0)
    cfg = fs.make_config(
        algorithm="pfedme", lr=0.05, batch_size=10, local_epochs=1, rounds=1, seed=0
    )
    ours, ref = build_experiment(cfg, data=data).runner, round_speed.reference_runner(cfg, data)
    start = build_experiment(cfg, data=data).runner.server["p"]
    ours.train_round(0)
    ref.train_round(0)
    assert len(calls) == sum(-(-int(n) // 10) for n in data.train.sizes())  # every minibatch
    for k, v in ours.server["p"].items():
        torch.testing.assert_close(ref.server["p"][k], v, rtol=1e-4, atol=1e-5, msg=k)
    assert any(not torch.equal(v, start[k]) for k, v in ours.server["p"].items())
    for k, v in ours.store.state["p"].items():
        torch.testing.assert_close(ref.store.state["p"][k], v, rtol=1e-4, atol=1e-5, msg=k)


def test_one_side_reports_its_own_peak_memory(round_speed, monkeypatch):
    """--side (what --memory runs in a process per side): one execution alone, its peak
    resident memory above the setup, and no ratio."""
    monkeypatch.setattr(round_speed, "SIDE", "fedshift")
    out = round_speed.w3_case("ditto", clients=8, rate=1.0, samples=800, rounds=1)
    assert out["side"] == "fedshift" and out["s"] > 0 and "ratio" not in out
    assert out["round_peak_rss_mb"] is None or out["round_peak_rss_mb"] > out["training_mb"] >= 0
    assert out["setup_rss_mb"] > 100  # torch and the data at least


def test_gpu_executions_script_runs_on_the_cpu(shared_datasets, tmp_path):
    """benchmarks/gpu_executions.py (the check a lent GPU runs) works where it is edited."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, str(BENCH / "gpu_executions.py"), "--device", "cpu", "--only", "fedavg"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["errors"] == [] and summary["not_on_device"] == []
    assert summary["max_batched_vs_sequential"] < 1e-4


def test_rounds_in_process_times_each_method_in_turn():
    """benchmarks/rounds_in_process.py (a lent GPU's check of slower rounds late in a
    process) works where it is edited: one JSON line per method, every round timed."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, str(BENCH / "rounds_in_process.py"), "FedAvg,FTFA"]
        + ["--rounds", "2", "--others", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    lines = [json.loads(x) for x in done.stdout.strip().splitlines()]
    assert [(x["method"], x["position"], len(x["round_s"])) for x in lines] == [
        ("FedAvg", 0, 1),
        ("FTFA", 1, 2),
    ]
    assert all(t > 0 for x in lines for t in x["round_s"])


def test_population_scale_point_runs():
    """benchmarks/population_scale.py (W4) measures one (population, cohort) point with the
    runner's current API, evaluation of every client included."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, str(BENCH / "population_scale.py"), "--point", "50", "5", "--rounds", "1"]
        + ["--threads", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    point = json.loads(done.stdout.strip().splitlines()[-1])
    assert (point["population"], point["cohort"]) == (50, 5)
    assert point["round_s"] > 0 and point["eval_all_clients_s"] > 0
