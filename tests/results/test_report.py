"""Reports and comparisons are built from the run store alone and render real images; the
HTML report is one self-contained file with the config and versions."""

from __future__ import annotations

import base64
import io
import re

import torch
from PIL import Image
from toy import toy_data
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app

SETTINGS = dict(lr=0.1, batch_size=8, rounds=3, eval_every=1, model_options={"hidden": [8]})


def test_report_and_compare_from_the_run_store(tmp_path):
    db = tmp_path / "runs.db"
    ids = [
        fs.run(algorithm=a, data=toy_data(), db=db, **SETTINGS).run_id for a in ("fedavg", "local")
    ]
    runner = CliRunner()
    for fmt, name in (("md", "report.md"), ("html", "report.html")):
        out = tmp_path / fmt
        res = runner.invoke(
            app, ["report", *ids, "--db", str(db), "--out", str(out), "--format", fmt]
        )
        assert res.exit_code == 0, res.output
        text = (out / name).read_text()
        assert all(i in text for i in ids) and "accuracy_per_env.png" in text
        for png in (
            "accuracy_per_env",
            "accuracy_per_round",
            "loss_per_round",
            "accuracy_per_mb",
            "accuracy_per_client",
        ):
            assert f"{png}.png" in text
            with Image.open(out / f"{png}.png") as im:
                assert im.size[0] > 300 and len(set(im.convert("L").getdata())) > 10
    page = (tmp_path / "html" / "report.html").read_text()
    assert "src='accuracy" not in page  # self-contained: every figure embedded
    embedded = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(embedded) == 5  # the four figures and the training loss (loss_per_round)
    for data in embedded:
        with Image.open(io.BytesIO(base64.b64decode(data))) as im:
            assert im.size[0] > 300
    assert "<th>config key</th>" in page and "<td>lr</td><td>0.1</td>" in page
    assert f"<td>torch</td><td>{torch.__version__}</td>" in page
    assert f"<td>fedshift</td><td>{fs.__version__}</td>" in page
    md = (tmp_path / "md" / "report.md").read_text()
    assert "## Config" in md and "| lr | 0.1 | 0.1 |" in md and "## Environment" in md
    res = runner.invoke(app, ["compare", *ids, "--db", str(db), "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0 and (tmp_path / "cmp" / "accuracy_per_env.png").stat().st_size > 0
    bad = runner.invoke(app, ["report", "nosuchrun", "--db", str(db)])
    assert bad.exit_code == 2 and "nosuchrun" in bad.output
    bad = runner.invoke(app, ["report", ids[0], "--db", str(db), "--format", "pdf"])
    assert bad.exit_code == 2 and "pdf" in bad.output


def test_logged_figures_and_fault_table_appear_when_runs_logged_them(tmp_path, monkeypatch):
    """Simulated time, silhouette curve, contributions and client faults are drawn from what
    an algorithm logged per round (here a FedAvg that logs like UCFL and FedIPG would)."""
    from fedshift.algorithms.fedavg import FedAvg
    from fedshift.results.report import write_report
    from fedshift.results.store import RunStore

    original = FedAvg.aggregate

    def logging_aggregate(self, server, uploads, info):
        info.log.update(
            sim_time_total=1.5 * (info.round + 1),
            streams=3,
            silhouette=[0.2, 0.6, 0.4, None],
            clients=info.ids,
            contribution=info.num_examples / info.num_examples.sum() + 0.01 * info.round,
        )
        return original(self, server, uploads, info)

    monkeypatch.setattr(FedAvg, "aggregate", logging_aggregate)
    db = tmp_path / "runs.db"
    faults = {"clients": [1], "drop": 1.0}
    run_id = fs.run(
        algorithm="fedavg", data=toy_data(), db=db, faults_options=faults, **SETTINGS
    ).run_id
    path = write_report(RunStore(db), [run_id], tmp_path / "rep")
    text = path.read_text()
    assert "Client faults" in text and "| dropped | 3 |" in text
    for png in ("accuracy_per_sim_time", "silhouette", "contributions"):
        assert f"{png}.png" in text
        with Image.open(tmp_path / "rep" / f"{png}.png") as im:
            assert im.size[0] > 300 and len(set(im.convert("L").getdata())) > 10
    plain = fs.run(algorithm="local", data=toy_data(), db=db, **SETTINGS).run_id
    monkeypatch.setattr(FedAvg, "aggregate", original)
    text = write_report(RunStore(db), [plain], tmp_path / "plain").read_text()
    assert "silhouette" not in text and "Client faults" not in text


def test_per_environment_table_lists_every_runs_environments():
    """Runs of different scenarios: each environment gets its row, '—' where a run has none
    (the table used to take the first run's environments only)."""
    from fedshift.results.report import tables

    def run(label, per_env):
        metrics = {"worst": 1.0, "average": 2.0, "worst_client": 0.0, "per_env": per_env}
        return {"run_id": label, "algorithm": label, "scenario": "s", "seed": 0, "rounds": 1,
                "rounds_done": 1, "metrics": metrics, "time_s": 0.0, "bytes_up": 0,
                "bytes_down": 0, "config": {}}  # fmt: skip

    runs = [run("a", {"test": 80.0}), run("b", {"p=0.0": 10.0, "p=1.0": 90.0})]
    _, _, _, env_rows = tables(runs)
    assert [row[0] for row in env_rows] == ["test", "p=0.0", "p=1.0"]
    assert env_rows[0][1:] == ["80.0", "—"] and env_rows[2][1:] == ["—", "90.0"]
