"""Reports that cannot flatter: a model that answers one class is marked degenerate, and a
published gap holds only beyond seed noise."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest
import torch

import fedshift as fs
from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.base import Prediction, register_algorithm
from fedshift.algorithms.fedavg import FedAvg
from fedshift.eval.metrics import (
    EvalCounts,
    constant_clients,
    flag_chance_fit_on_training,
    flag_chance_loss,
    flag_saturated_logits,
    loss_at_chance,
    over_seeds,
)
from fedshift.results.comparison import MethodResult, compare, gap_test
from fedshift.results.store import RunStore
from fedshift.tables import Method, Table

CONSTANT = "test-constant-predictor"
if CONSTANT not in ALGORITHMS:

    @register_algorithm(CONSTANT)
    class ConstantPredictor(FedAvg):
        """FedAvg whose evaluated model answers class 0 whatever the input: every weight
        zero, the last layer's bias favouring class 0."""

        def predictor(self, server, state, cohort) -> Prediction:
            pred = super().predictor(server, state, cohort)
            params = {k: torch.zeros_like(v) for k, v in pred.params.items()}
            last = list(params)[-1]
            params[last][0] = 5.0
            return Prediction(params, pred.buffers, pred.shared)


BACKWARDS = "test-backwards-predictor"
if BACKWARDS not in ALGORITHMS:

    @register_algorithm(BACKWARDS)
    class BackwardsPredictor(FedAvg):
        """FedAvg whose evaluated model is its trained model with the logits negated: it
        ranks the classes backwards (as a model reading a shortcut backwards does), is not
        constant and trained to a good loss."""

        def predictor(self, server, state, cohort) -> Prediction:
            pred = super().predictor(server, state, cohort)
            params = dict(pred.params)
            for name in list(params)[-2:]:  # the last layer's weight and bias
                params[name] = -params[name]
            return Prediction(params, pred.buffers, pred.shared)


EXPLODED = "test-exploded-predictor"
if EXPLODED not in ALGORITHMS:

    @register_algorithm(EXPLODED)
    class ExplodedPredictor(FedAvg):
        """FedAvg whose evaluated model is its trained model with the last layer scaled by
        10⁷: the same predictions, but logit gaps in the millions (FedSDR's prediction
        estimator at γ ≥ 10⁴ leaves its personal models so)."""

        def predictor(self, server, state, cohort) -> Prediction:
            pred = super().predictor(server, state, cohort)
            params = dict(pred.params)
            for name in list(params)[-2:]:
                params[name] = params[name] * 1e7
            return Prediction(params, pred.buffers, pred.shared)


def test_constant_clients_compares_predictions_with_labels():
    labels = torch.tensor([[50, 50], [97, 3], [50, 50], [50, 50]])
    predicted = torch.tensor([[100, 0], [100, 0], [60, 40], [0, 0]])
    # client 0 answers one class on balanced labels; client 1 may rightly predict its 97 %
    # class (99 % < 97 % + 5 points would not be flagged either); client 2 reads the input;
    # client 3 has no data
    assert constant_clients(predicted, labels).tolist() == [True, False, False, False]
    balanced = torch.tensor([[50, 50]])
    # 91 % one class on balanced labels: the near-constant FedPIN models of
    # docs/methods/invariant.md (worst case 47 %, passed the old 95 % rule)
    for share, flagged in ((96, True), (91, True), (90, True), (89, False), (60, False)):
        predicted = torch.tensor([[share, 100 - share]])
        assert constant_clients(predicted, balanced).tolist() == [flagged], share
    # an imbalanced client may predict its 88 % class 92 % of the time (< 88 + 5)
    assert constant_clients(torch.tensor([[92, 8]]), torch.tensor([[88, 12]])).tolist() == [False]
    assert constant_clients(torch.tensor([[94, 6]]), torch.tensor([[88, 12]])).tolist() == [True]


def test_summary_is_degenerate_when_most_clients_are_constant():
    counts = EvalCounts.zeros(3, 2, 2)
    counts.correct[:] = torch.tensor([[50, 50], [50, 50], [80, 70]])
    counts.total[:] = 100
    counts.labels[:] = 100
    counts.predicted[:] = torch.tensor([[200, 0], [0, 200], [110, 90]])
    _, summary = counts.summary(["p=0.0", "p=1.0"])
    assert summary["constant_clients"] == 2 and summary["degenerate"] is True
    assert "2 of 3 clients" in summary["degenerate_why"]
    assert summary["average_pooled"] == pytest.approx((100 * 180 / 300 + 100 * 170 / 300) / 2)
    counts.predicted[1] = torch.tensor([120, 80])
    _, summary = counts.summary(["p=0.0", "p=1.0"])
    assert summary["constant_clients"] == 1 and summary["degenerate"] is False


def test_pooled_accuracy_weights_clients_by_samples():
    counts = EvalCounts.zeros(2, 1, 2)
    counts.correct[:, 0] = torch.tensor([9, 10])
    counts.total[:, 0] = torch.tensor([10, 100])
    counts.labels[:] = 50
    counts.predicted[:] = torch.tensor([[5, 5], [50, 50]])
    _, s = counts.summary(["e"])
    assert s["average"] == pytest.approx((90 + 10) / 2)
    assert s["average_pooled"] == pytest.approx(100 * 19 / 110)


def test_chance_loss_flags_only_a_loss_that_stays_at_ln_k():
    ln2 = math.log(2)
    assert loss_at_chance([0.9, 0.8] + [ln2] * 3, 2, 5)
    assert not loss_at_chance([ln2] * 4 + [0.5], 2, 5)  # it left chance at the end
    assert not loss_at_chance([ln2, ln2], 2, 2)  # too few rounds to say
    assert not loss_at_chance([float("nan")] * 5, 2, 5)
    m = flag_chance_loss({"degenerate": False, "degenerate_why": None}, [ln2] * 10, 2)
    assert m["degenerate"] and "ln 2" in m["degenerate_why"]


def test_a_run_whose_model_answers_one_class_is_marked_degenerate(tmp_path):
    settings = dict(scenario="digits-shortcut", rounds=1, seed=0, db=None)
    bad = fs.run(algorithm=CONSTANT, **settings)
    assert bad.metrics["degenerate"] is True
    assert bad.metrics["constant_clients"] == 8
    # flat at the share of class 0 in every environment: the worst case looks "fine"
    per_env = list(bad.metrics["per_env"].values())
    assert max(per_env) - min(per_env) < 1e-9 and 5 < per_env[0] < 15
    good = fs.run(algorithm="fedavg", lr=0.05, batch_size=10, **{**settings, "rounds": 3})
    assert good.metrics["degenerate"] is False and good.metrics["constant_clients"] == 0


def test_training_fit_flags_a_fit_under_or_just_over_the_majority_share():
    def metrics(acc, share):
        return {
            "degenerate": False,
            "degenerate_why": None,
            "train_accuracy_pooled": acc,
            "train_majority_share": share,
        }

    flagged = flag_chance_fit_on_training(metrics(30.0, 50.0))
    assert flagged["degenerate"] and "backwards" in flagged["degenerate_why"]
    near = flag_chance_fit_on_training(metrics(50.9, 50.3))  # FedPIN at γ = 100
    assert near["degenerate"] and "next to nothing" in near["degenerate_why"]
    assert flag_chance_fit_on_training(metrics(46.0, 50.0))["degenerate"]  # under, not backwards
    assert flag_chance_fit_on_training(metrics(54.9, 50.0))["degenerate"]
    assert not flag_chance_fit_on_training(metrics(55.0, 50.0))["degenerate"]  # 5 points over
    assert not flag_chance_fit_on_training(metrics(75.0, 50.0))["degenerate"]  # CMNIST's 75
    assert not flag_chance_fit_on_training(metrics(15.5, 10.0))["degenerate"]  # 10 classes
    kept = flag_chance_fit_on_training({**metrics(20.0, 50.0), "degenerate_why": "x"})
    assert kept["degenerate_why"].startswith("x; ")
    assert not flag_chance_fit_on_training({"degenerate": False})["degenerate"]  # no data


def test_a_stored_run_gets_a_fit_rule_newer_than_it(tmp_path):
    """A run recorded before the near-chance rule reads back degenerate under it, from the
    fit it stored; one the rule passes, or one already degenerate, reads back as stored."""
    db = tmp_path / "runs.db"
    run = fs.run(algorithm="fedavg", scenario="digits-shortcut", rounds=2, seed=0, db=str(db))
    fit = run.metrics["train_accuracy_pooled"]
    assert not run.metrics["degenerate"] and fit >= run.metrics["train_majority_share"] + 5
    store = RunStore(db)
    with sqlite3.connect(db) as conn:
        old = {**run.metrics, "train_majority_share": fit - 1.0}  # as if near chance
        conn.execute("UPDATE runs SET metrics=? WHERE run_id=?", (json.dumps(old), run.run_id))
    got = store.run(run.run_id)["metrics"]
    assert got["degenerate"] and "next to nothing" in got["degenerate_why"]
    with sqlite3.connect(db) as conn:
        old = {**old, "degenerate": True, "degenerate_why": "x"}
        conn.execute("UPDATE runs SET metrics=? WHERE run_id=?", (json.dumps(old), run.run_id))
    assert store.run(run.run_id)["metrics"]["degenerate_why"] == "x"


def test_a_model_that_reads_its_data_backwards_is_marked_degenerate():
    """Neither constant nor at ln K, it would pass the other checks; scored on its own
    training rows it falls far under answering the most common class."""
    settings = dict(scenario="digits-shortcut", rounds=3, seed=0, db=None, lr=0.05, batch_size=10)
    bad = fs.run(algorithm=BACKWARDS, **settings)
    assert bad.metrics["constant_clients"] < 4, "not caught by the constant-predictor rule"
    assert bad.metrics["train_accuracy_pooled"] < bad.metrics["train_majority_share"] - 5
    assert bad.metrics["degenerate"] is True
    assert "own training data" in bad.metrics["degenerate_why"]
    good = fs.run(algorithm="fedavg", **settings)
    assert good.metrics["train_accuracy_pooled"] > 80 and good.metrics["degenerate"] is False


def test_saturated_logits_flag_only_most_rows_past_the_gap():
    def metrics(share):
        return {"degenerate": False, "degenerate_why": None, "train_saturated_share": share}

    flagged = flag_saturated_logits(metrics(80.0))
    assert flagged["degenerate"] and "blown up" in flagged["degenerate_why"]
    assert not flag_saturated_logits(metrics(50.0))["degenerate"]  # half is not most
    assert not flag_saturated_logits(metrics(0.0))["degenerate"]
    assert not flag_saturated_logits({"degenerate": False})["degenerate"]  # no data


def test_a_model_whose_logits_blew_up_is_marked_degenerate():
    """It predicts what the trained model predicts (not constant, not backwards, its loss
    not at ln K), so only its logit gaps on its own training rows tell."""
    settings = dict(scenario="digits-shortcut", rounds=3, seed=0, db=None, lr=0.05, batch_size=10)
    bad = fs.run(algorithm=EXPLODED, **settings)
    good = fs.run(algorithm="fedavg", **settings)
    assert bad.metrics["per_env"] == good.metrics["per_env"]  # the same predictions
    assert bad.metrics["train_saturated_share"] > 90 and good.metrics["train_saturated_share"] == 0
    assert bad.metrics["degenerate"] is True and "blown up" in bad.metrics["degenerate_why"]
    assert good.metrics["degenerate"] is False


def test_over_seeds_keeps_a_degenerate_seed_visible():
    base = {"worst": 50.0, "average": 60.0, "worst_client": 40.0, "per_env": {}, "per_client": []}
    mean, _ = over_seeds(
        [{**base, "degenerate": False}, {**base, "degenerate": True, "degenerate_why": "x"}]
    )
    assert mean["degenerate"] is True and mean["degenerate_seeds"] == 1


def test_gap_test_needs_three_seeds_and_a_difference_beyond_noise():
    assert gap_test([60, 61], [50, 51]) == ("untested", None)
    status, p = gap_test([60, 61, 62], [50, 51, 52])  # constant +10: no spread
    assert status == "held" and p == 0.0
    status, p = gap_test([60, 52, 61, 55], [50, 55, 51, 56])  # mixed signs: noise
    assert status == "within noise" and p > 0.05
    status, _ = gap_test([50.0, 51.0, 52.5], [60.0, 61.5, 62.0])
    assert status == "reversed"
    status, _ = gap_test([50.0, 55.0, 50.0], [52.0, 50.0, 54.0])
    assert status == "reversed, within noise"
    assert gap_test([50, 50, 50], [50, 50, 50])[0] == "tie"
    status, p = gap_test([70.1, 72.3, 69.8, 71.0], [60.2, 63.0, 58.9, 61.7])
    assert status == "held" and p < 0.01


def _result(name: str, worst: list[float], degenerate: bool = False, published=None):
    per_seed = [
        {"worst": w, "average": w, "per_env": {}, "degenerate": degenerate and i == 0}
        for i, w in enumerate(worst)
    ]
    mean = sum(worst) / len(worst)
    return MethodResult(
        Method(name, "fedavg", published=published or {}),
        [f"{name}{i}" for i in range(len(worst))],
        per_seed,
        {"worst": mean},
        {"worst": 0.0},
        {},
    )


def test_compare_never_counts_a_degenerate_model():
    table = Table("t", "t", "s", ["worst"], {}, [], gap=5.0)
    results = [
        _result("Ours", [51.0, 51.5, 52.0], degenerate=True, published={"worst": 53.9}),
        _result("Other", [30.0, 32.0, 31.0], published={"worst": 40.0}),
        _result("FedAvg", [1.0, 2.0, 1.5], published={"worst": 3.4}),
        _result("Ditto", [2.0, 3.0, 2.5], published={"worst": 3.0}),
    ]
    c = compare(table, results)["worst"]
    assert c["degenerate"] == ["Ours"] and c["methods"] == 3
    by_pair = {(g["better"], g["worse"]): g for g in c["gaps"]}
    assert by_pair[("Ours", "FedAvg")]["status"] == "degenerate"
    assert not by_pair[("Ours", "FedAvg")]["holds"]
    assert by_pair[("Other", "FedAvg")]["status"] == "held"
    assert c["gaps_held"] == sum(g["status"] == "held" for g in c["gaps"]) == 2
    # the rank correlation is over Other, FedAvg, Ditto only: published order Other >
    # FedAvg > Ditto, ours Other > Ditto > FedAvg
    assert c["spearman"] == pytest.approx(0.5)


def test_fedshift_runs_marks_a_degenerate_run(tmp_path):
    """The run list (table and --json) says which runs are no result, not only report and
    compare."""
    import json

    from typer.testing import CliRunner

    from fedshift.cli import app

    db = tmp_path / "runs.db"
    bad = fs.run(algorithm=CONSTANT, scenario="digits-shortcut", rounds=1, seed=0, db=db)
    res = CliRunner().invoke(app, ["runs", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output.strip().splitlines()[-1])
    assert row["run_id"] == bad.run_id and row["metrics"]["degenerate"] is True
    res = CliRunner().invoke(app, ["runs", "--db", str(db)], env={"COLUMNS": "200"})
    assert "†" in res.output and "degenerate" in res.output
