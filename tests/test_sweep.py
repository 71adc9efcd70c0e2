"""`fedshift sweep`: grid parsing, one stored run per grid point × seed, selection by
validation accuracy (never test), mean ± std over seeds."""

from __future__ import annotations

import json

import pytest
from toy import power_cut_at
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.errors import FedshiftError
from fedshift.results.store import RunStore
from fedshift.sweep import grid_points, parse_grid, select_point, split_values

runner = CliRunner()


def last_json(text: str):
    return json.loads(text.strip().splitlines()[-1])


def test_grid_parsing():
    assert split_values("0.1, 0.01") == ["0.1", "0.01"]
    assert split_values("[0.9,0.8],[0.95,0.85]") == ["[0.9,0.8]", "[0.95,0.85]"]
    grid = parse_grid(["algorithm.mu=0.1,0.01", "lr=0.05,0.1,0.2"])
    assert list(grid) == ["algorithm.mu", "lr"]
    points = grid_points(grid)
    assert len(points) == 6 and points[0] == {"algorithm.mu": "0.1", "lr": "0.05"}
    assert points[1] == {"algorithm.mu": "0.1", "lr": "0.1"}  # last key varies fastest
    for bad in (["lr"], ["lr="], ["=0.1"], ["lr=0.1,,0.2"], ["lr=0.1,0.1"]):
        with pytest.raises(FedshiftError):
            parse_grid(bad)
    with pytest.raises(FedshiftError, match="twice"):
        parse_grid(["lr=0.1", "lr=0.2"])


def test_sweep_selects_by_validation_and_stores_every_run(tmp_path):
    db = tmp_path / "r.db"
    args = ["sweep", "--set", "scenario=digits-shortcut", "--set", "algorithm=fedprox"]
    args += ["--grid", "algorithm.mu=0.001,0.1", "--grid", "lr=0.005,0.2"]
    args += ["--seeds", "0,1", "--rounds", "1"]
    res = runner.invoke(app, [*args, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    assert s["grid"] == {"algorithm.mu": ["0.001", "0.1"], "lr": ["0.005", "0.2"]}
    assert s["seeds"] == [0, 1] and s["algorithm"] == "fedprox"
    assert len(s["points"]) == 4 and len(s["run_ids"]) == 8
    stored = {r["run_id"]: r for r in RunStore(db).runs()}
    assert set(stored) == set(s["run_ids"])
    for p in s["points"]:
        runs = [stored[r] for r in p["run_ids"]]
        assert sorted(r["seed"] for r in runs) == [0, 1]
        assert {float(r["config"]["lr"]) for r in runs} == {float(p["params"]["lr"])}
        mu = {float(r["config"]["algorithm.mu"]) for r in runs}
        assert mu == {float(p["params"]["algorithm.mu"])}
        worst = [r["metrics"]["worst"] for r in runs]
        assert p["metrics"]["worst"] == pytest.approx(sum(worst) / 2)
        assert p["metrics_std"]["worst"] == pytest.approx(abs(worst[0] - worst[1]) / 2**0.5)
        assert 0.0 <= p["val"] <= 100.0
    vals = [-1.0 if p["metrics"].get("degenerate") else p["val"] for p in s["points"]]
    assert s["selected"] == vals.index(max(vals))
    chosen = s["points"][s["selected"]]
    assert s["selected_params"] == chosen["params"] and s["metrics"] == chosen["metrics"]
    assert s["val"] == max(vals)


def test_resume_reuses_finished_runs_and_continues_a_stopped_one(tmp_path, monkeypatch):
    """A sweep that outlives a session: ``--resume`` takes the store's finished runs as they
    are and continues a stopped one from its checkpoint; the summary equals an
    uninterrupted sweep's, and resuming again trains nothing."""
    from fedshift.sweep import run_sweep

    fixed = {"scenario": "digits-shortcut", "algorithm": "fedavg", "rounds": 3}
    fixed["checkpoint_every"] = 1
    grid = {"lr": ["0.05", "0.2"]}
    reference = run_sweep(None, fixed, grid, [0, 1], tmp_path / "ref.db")
    db = tmp_path / "runs.db"
    # the eighth round trained: lr 0.2, seed 0, its second round
    with power_cut_at(monkeypatch, call=8), pytest.raises(RuntimeError):
        run_sweep(None, fixed, grid, [0, 1], db)
    before = {r["run_id"]: r["status"] for r in RunStore(db).runs()}
    assert sorted(before.values()) == ["done", "done", "failed"]
    out = run_sweep(None, fixed, grid, [0, 1], db, resume=True)
    assert set(before) <= set(out["run_ids"]) and len(RunStore(db).runs()) == 4
    assert out["selected"] == reference["selected"]
    for ours, ref in zip(out["points"], reference["points"], strict=True):
        assert ours["val"] == pytest.approx(ref["val"])
        assert ours["metrics"]["worst"] == pytest.approx(ref["metrics"]["worst"])
    again = run_sweep(None, fixed, grid, [0, 1], db, resume=True)
    assert again["run_ids"] == out["run_ids"] and len(RunStore(db).runs()) == 4


def test_a_degenerate_point_is_never_selected_over_a_working_one():
    def point(val, degenerate):
        return {"val": val, "metrics": {"worst": 50.0, "degenerate": degenerate}}

    # a constant predictor at chance (49.4) against a shortcut model (36.6) on CMNIST
    assert select_point([point(36.6, False), point(49.4, True), point(49.5, True)]) == (0, True)
    assert select_point([point(30.0, False), point(36.6, False)]) == (1, True)
    assert select_point([point(36.6, False), point(36.6, False)]) == (0, True)  # earliest
    assert select_point([point(40.0, True), point(49.4, True)]) == (1, False)


def test_a_diverged_point_is_reported_and_the_sweep_goes_on(tmp_path):
    """lr = 1e30 makes the first grid point diverge (non-finite model); the sweep records
    it as diverged, skips its second seed, runs the next point and selects it."""
    db = tmp_path / "r.db"
    args = ["sweep", "--set", "scenario=digits-shortcut", "--grid", "lr=1e30,0.05"]
    args += ["--seeds", "0,1", "--rounds", "2", "--db", str(db), "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    bad, good = s["points"]
    assert "diverged" in bad["diverged"] and bad["val"] is None and len(bad["run_ids"]) == 1
    assert good["diverged"] is None and len(good["run_ids"]) == 2
    assert s["selected"] == 1 and s["selected_params"] == {"lr": "0.05"}
    status = {r["run_id"]: r["status"] for r in RunStore(db).runs()}
    assert status[bad["run_ids"][0]] == "diverged"
    assert "‡ lr=1e30" in res.output and "never selected" in res.output
    # every point diverged: one sentence, exit 2
    args = ["sweep", "--set", "scenario=digits-shortcut", "--grid", "lr=1e30,1e31"]
    res = runner.invoke(app, [*args, "--rounds", "2", "--db", str(db)])
    assert res.exit_code == 2 and "every grid point diverged" in res.output, res.output


def test_sweep_rejects_bad_input_before_running(tmp_path):
    db = tmp_path / "r.db"
    base = ["sweep", "--set", "scenario=digits-shortcut", "--rounds", "1", "--db", str(db)]
    for extra in (
        ["--grid", "algorithm.nosuch=1,2"],
        ["--grid", "scenario.clients=4,0"],
        ["--grid", "seed=0,1"],
        ["--seeds", "0,x"],
        ["--grid", "lr"],
    ):
        res = runner.invoke(app, [*base, *extra])
        assert res.exit_code == 2, (extra, res.output)
        assert "Traceback" not in res.output
    assert not db.exists() or not RunStore(db).runs()


def test_folds_score_each_seed_by_the_mean_over_its_folds(tmp_path):
    """A leave-one-domain-out table is scored by the mean over its folds: with ``--folds``
    every grid point runs each fold for each seed, a seed's validation score is the mean
    over its folds and its test metrics combine the folds as ``reproduce`` does (each
    fold's average an environment), and mean ± std are over seeds."""
    db = tmp_path / "r.db"
    args = ["sweep", "--set", "scenario=digits-shortcut", "--grid", "lr=0.05,0.2"]
    args += ["--folds", "scenario.p_val=0.1,0.9", "--seeds", "0,1", "--rounds", "1"]
    res = runner.invoke(app, [*args, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    assert s["folds"] == {"scenario.p_val": ["0.1", "0.9"]} and len(s["run_ids"]) == 8
    assert "mean over scenario.p_val = 0.1, 0.9" in " ".join(res.stderr.split())
    stored = {r["run_id"]: r for r in RunStore(db).runs()}
    for p in s["points"]:
        runs = [stored[r] for r in p["run_ids"]]  # seed-major, then fold
        assert [(r["seed"], float(r["config"]["scenario.p_val"])) for r in runs] == [
            (0, 0.1), (0, 0.9), (1, 0.1), (1, 0.9),
        ]  # fmt: skip
        per_seed = [runs[i : i + 2] for i in (0, 2)]
        val = [sum(r["val"] for r in rs) / 2 for rs in per_seed]
        assert p["val"] == pytest.approx(sum(val) / 2)
        assert p["val_std"] == pytest.approx(abs(val[0] - val[1]) / 2**0.5)
        worst = [min(r["metrics"]["average"] for r in rs) for rs in per_seed]  # lowest fold
        average = [sum(r["metrics"]["average"] for r in rs) / 2 for rs in per_seed]
        assert p["metrics"]["worst"] == pytest.approx(sum(worst) / 2)
        assert p["metrics_std"]["worst"] == pytest.approx(abs(worst[0] - worst[1]) / 2**0.5)
        assert p["metrics"]["average"] == pytest.approx(sum(average) / 2)
        assert set(p["metrics"]["per_env"]) == {"p_val=0.1", "p_val=0.9"}
    # the folds' values do vary the validation: the two folds of a seed differ
    first = [stored[r]["val"] for r in s["points"][0]["run_ids"][:2]]
    assert first[0] != first[1]
    for bad in (["--folds", "lr=0.1,0.2"], ["--folds", "seed=0,1"], ["--folds", "lr"]):
        res = runner.invoke(app, [*args[:5], *bad, "--rounds", "1", "--db", str(db)])
        assert res.exit_code == 2 and "Traceback" not in res.output, (bad, res.output)


def test_a_table_row_sweeps_with_the_rows_settings_over_the_tables_folds(tmp_path):
    """``fedshift sweep TABLE --method NAME``: every run takes the row's settings (the
    configs ``reproduce`` gives it), and a table run once per fold is swept over its folds
    unless told otherwise."""
    from test_run_table_row import TINY

    from fedshift.reproduce import reproduce

    table = tmp_path / "tiny.toml"
    table.write_text(TINY + '\n[sweep]\nkey = "scenario.p_val"\nvalues = [0.1, 0.9]\n')
    db = tmp_path / "r.db"
    args = ["sweep", str(table), "--method", "FedProx (mu 0.1)", "--grid", "lr=0.1,0.3"]
    res = runner.invoke(app, [*args, "--rounds", "1", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    s = last_json(res.stdout)
    assert s["table"] == {"id": "tiny", "method": "FedProx (mu 0.1)"}
    assert s["folds"] == {"scenario.p_val": ["0.1", "0.9"]} and len(s["run_ids"]) == 4
    # --rounds 1 against the table's 2: the summary and the output say it selected at
    # another scale
    assert s["scale"] == {"rounds": {"sweep": 1, "table": 2}}
    assert "another scale" in res.output and "rounds 1 (table: 2)" in res.output
    ours = reproduce(
        str(table), methods=["FedProx (mu 0.1)"], seeds=1, rounds=1, db=db,
        out_dir=tmp_path / "rep",
    )  # fmt: skip
    store = RunStore(db)
    row_runs = ours["methods"][0]["run_ids"]  # the row's own lr, 0.1: the sweep's first point
    assert [store.run(r)["config"] for r in row_runs] == [
        store.run(r)["config"] for r in s["points"][0]["run_ids"]
    ]
    cfg = store.run(s["points"][1]["run_ids"][0])["config"]
    assert cfg["algorithm"] == "fedprox" and float(cfg["algorithm.mu"]) == 0.1
    assert cfg["local_steps"] == 3 and float(cfg["lr"]) == 0.3  # the row's, and the grid's
    point = s["points"][0]
    assert point["metrics"]["per_env"] == {
        f"p_val={v}": store.run(r)["metrics"]["average"]
        for v, r in zip(("0.1", "0.9"), point["run_ids"], strict=True)
    }
    # --set of the fold key runs that fold only; a preset with --method is refused
    res = runner.invoke(
        app, [*args, "--set", "scenario.p_val=0.5", "--rounds", "1", "--db", str(db), "--json"]
    )
    assert res.exit_code == 0 and last_json(res.stdout)["folds"] == {}, res.output
    at_scale = ["--set", "scenario.p_val=0.5", "--set", "scenario.clients=4"]  # as text
    res = runner.invoke(app, [*args[:4], *at_scale, "--db", str(db), "--json"])
    assert res.exit_code == 0 and last_json(res.stdout)["scale"] == {}, res.output
    assert "another scale" not in res.output
    res = runner.invoke(app, ["sweep", "mnist-iid-fedavg", "--method", "FedAvg", "--db", str(db)])
    assert res.exit_code == 2 and "not a table" in res.output, res.output
