"""``tracking = ["tensorboard", "mlflow"]`` streams the config, every round and the final
table to the real TensorBoard and MLflow (a local SQLite store), read back here with their
own readers; a resumed run continues the same tracker runs without a round twice."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from toy import power_cut_at, toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.api import resume
from fedshift.cli import app
from fedshift.results.store import RunStore

SETTINGS = dict(lr=0.1, batch_size=8, rounds=5, eval_every=2, model_options={"hidden": [8]})


@pytest.fixture(autouse=True)
def offline_mlflow(monkeypatch):
    """No MLflow telemetry or tracking server from the environment."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def tensorboard_run(folder):
    (run_dir,) = [p for p in (folder / "tensorboard").iterdir() if p.is_dir()]
    acc = ea.EventAccumulator(str(run_dir), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return run_dir, acc


def text(acc, tag: str) -> str:
    return "\n".join(e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag))


def mlflow_run(folder, run_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fedshift")
    runs = client.search_runs([experiment.experiment_id], f"tags.`fedshift.run_id` = '{run_id}'")
    assert len(runs) == 1  # a resume continues the run, never opens a second
    return client, runs[0]


def steps(points) -> list[int]:
    return [p.step for p in points]


def test_config_rounds_and_final_table_reach_tensorboard_and_mlflow(tmp_path):
    db = tmp_path / "runs.db"
    out = fs.run(
        algorithm="fedavg", data=toy_data(), db=db, tracking="tensorboard,mlflow", **SETTINGS
    )
    stored = RunStore(db).run(out.run_id)
    losses = [r["loss"] for r in stored["round_metrics"]]

    run_dir, acc = tensorboard_run(tmp_path)
    assert run_dir.name == f"fedavg-toy-seed0-{out.run_id}"
    assert steps(acc.Scalars("loss")) == [1, 2, 3, 4, 5]
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx(losses)
    assert steps(acc.Scalars("average")) == [2, 4, 5]  # the evaluated rounds
    assert acc.Scalars("per_env/far")[-1].value == pytest.approx(out.metrics["per_env"]["far"])
    assert acc.Scalars("final/worst")[0].value == pytest.approx(out.metrics["worst"])
    assert "| lr | 0.1 |" in text(acc, "config/text_summary")
    assert "| far |" in text(acc, "final accuracy/text_summary")

    client, run = mlflow_run(tmp_path, out.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert run.data.params["lr"] == "0.1" and run.data.params["algorithm"] == "fedavg"
    assert run.data.params["tracking"] == '["tensorboard", "mlflow"]'
    history = client.get_metric_history(run.info.run_id, "loss")
    assert steps(history) == [1, 2, 3, 4, 5]
    assert [m.value for m in history] == pytest.approx(losses)
    assert run.data.metrics["final/average"] == pytest.approx(out.metrics["average"])
    assert run.data.metrics["final/per_env/near"] == pytest.approx(out.metrics["per_env"]["near"])
    saved = tmp_path / "saved"
    path = client.download_artifacts(run.info.run_id, "final_metrics.json", str(saved))
    assert json.loads(open(path).read())["per_env"] == pytest.approx(out.metrics["per_env"])
    assert (tmp_path / "mlartifacts").is_dir()  # beside the store, not in the working folder


def test_a_resumed_run_continues_the_same_tracker_runs_without_repeating_a_round(
    tmp_path, monkeypatch
):
    """Crash in round 4 (the store and trackers hold 1-3, the checkpoint 2): the resume
    replays round 3, which the trackers must not get twice."""
    db = tmp_path / "runs.db"
    kwargs = dict(data=toy_data(), db=db, tracking="tensorboard,mlflow", checkpoint_every=2)
    with power_cut_at(monkeypatch, 3), pytest.raises(RuntimeError, match="power cut"):
        fs.run(algorithm="fedavg", **kwargs, **SETTINGS)
    (run,) = RunStore(db).runs()
    client, ml = mlflow_run(tmp_path, run["run_id"])
    assert ml.info.status == "FAILED"
    assert steps(client.get_metric_history(ml.info.run_id, "loss")) == [1, 2, 3]

    done = resume(run["run_id"], db, data=toy_data())
    reference = fs.run(algorithm="fedavg", data=toy_data(), **SETTINGS)
    assert done.metrics == reference.metrics
    losses = [r.loss for r in reference.result.rounds]
    _, acc = tensorboard_run(tmp_path)
    assert steps(acc.Scalars("loss")) == [1, 2, 3, 4, 5]
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx(losses)
    assert steps(acc.Scalars("final/worst")) == [5]
    client, ml = mlflow_run(tmp_path, run["run_id"])
    assert ml.info.status == "FINISHED"
    history = client.get_metric_history(ml.info.run_id, "loss")
    assert steps(history) == [1, 2, 3, 4, 5]
    assert [m.value for m in history] == pytest.approx(losses)


def test_tracking_turned_on_at_resume_catches_up_from_the_store(tmp_path, monkeypatch):
    db = tmp_path / "runs.db"
    with power_cut_at(monkeypatch, 3), pytest.raises(RuntimeError):
        fs.run(algorithm="fedavg", data=toy_data(), db=db, **SETTINGS)
    (run,) = RunStore(db).runs()
    resume(run["run_id"], db, data=toy_data(), overrides={"tracking": "mlflow"})
    client, ml = mlflow_run(tmp_path, run["run_id"])
    assert steps(client.get_metric_history(ml.info.run_id, "loss")) == [1, 2, 3, 4, 5]
    assert RunStore(db).run(run["run_id"])["config"]["tracking"] == ["mlflow"]


def test_every_run_of_a_sweep_is_tracked(tmp_path):
    db = tmp_path / "r.db"
    args = ["sweep", "--set", "scenario=digits-shortcut", "--set", "tracking=tensorboard"]
    args += ["--grid", "lr=0.05,0.1", "--rounds", "1", "--db", str(db)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    folders = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert sorted(f"fedavg-digits-shortcut-seed0-{r['run_id']}" for r in RunStore(db).runs()) == (
        folders
    )


def test_a_missing_library_is_one_sentence_naming_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    db = tmp_path / "r.db"
    res = CliRunner().invoke(app, ["run", "--set", "tracking=mlflow", "--db", str(db)])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: tracking=mlflow needs the mlflow package, which is not installed here: pip "
        "install 'fedshift[mlflow]'"
    ]
    assert not db.exists()  # refused before anything ran
    res = CliRunner().invoke(app, ["run", "--set", "tracking=wandb", "--db", str(db)])
    assert res.exit_code == 2 and "use tensorboard, mlflow" in res.output


def test_a_tracker_that_fails_mid_run_is_dropped_and_training_goes_on(tmp_path, monkeypatch):
    from fedshift.tracking.tensorboard_sink import TensorBoardSink

    def broken(self, step, scalars):
        raise OSError("disk full")

    monkeypatch.setattr(TensorBoardSink, "write_round", broken)
    db = tmp_path / "runs.db"
    with pytest.warns(RuntimeWarning, match="tracking to TensorBoard stopped.*disk full"):
        out = fs.run(algorithm="fedavg", data=toy_data(), db=db, tracking="tensorboard", **SETTINGS)
    assert RunStore(db).run(out.run_id)["status"] == "done"


def test_a_methods_numeric_round_extras_reach_the_trackers(tmp_path):
    """DRFA records its largest mixing weight each round; TensorBoard gets it as
    ``extras/lambda_max`` at every round, equal to the stored one (lists and maps are left out)."""
    from fedshift.tracking.sink import round_scalars

    mixed = {"round": 1, "extras": {"n": 2, "x": 0.5, "flag": True, "ids": [1], "m": {"a": 1}}}
    assert {k: v for k, v in round_scalars(mixed).items() if k.startswith("extras/")} == {
        "extras/n": 2.0,
        "extras/x": 0.5,
    }
    db = tmp_path / "runs.db"
    out = fs.run(algorithm="drfa", data=toy_data(), db=db, tracking="tensorboard", **SETTINGS)
    stored = [r["extras"]["lambda_max"] for r in RunStore(db).run(out.run_id)["round_metrics"]]
    _, acc = tensorboard_run(tmp_path)
    assert steps(acc.Scalars("extras/lambda_max")) == [1, 2, 3, 4, 5]
    assert [e.value for e in acc.Scalars("extras/lambda_max")] == pytest.approx(stored)
