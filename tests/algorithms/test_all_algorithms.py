"""Every registered algorithm, on a tiny problem with training environments: it runs, its
accuracies are percentages, and the batched cohort gives the sequential numbers and client
state."""

from __future__ import annotations

import math

import pytest
import torch
from toy import algorithm_test_data

from fedshift.algorithms import ALGORITHMS
from fedshift.api import make_config
from fedshift.experiment import build_experiment

SETTINGS = dict(lr=0.05, batch_size=8, rounds=2, model_options={"hidden": [8]})


# Options that reach code the defaults do not: research views and estimators, inner
# solvers, clustering from round 0, adaptive mixing (this test is the one cohort-invariance
# test of the registry; the method families' files no longer repeat it)
VARIANTS = [
    ("pfedme", {"inner_steps": 2}),
    ("fedsdr", {"personal_epochs": 1, "gamma": 0.1, "shortcut_view": "disagreement"}),
    ("fedsdr", {"personal_epochs": 1, "gamma": 1.0, "mi_estimator": "prediction"}),
    ("fedsdr", {"personal_epochs": 1, "gamma": 1.0, "shortcut_view": "signature"}),
    ("fedsdr-fedavg", {"personal_epochs": 1, "gamma": 0.1, "mi_estimator": "correlation"}),
    ("fedsdr-pfedme", {"personal_epochs": 1, "gamma": 0.1, "inner_steps": 2}),
    ("fedsdr-pfedme", {"gamma": 0.1, "inner_steps": 2, "shortcut_view": "signature"}),
    ("perinvfl", {"anneal_rounds": 1, "irm_lambda": 10.0, "personal_steps": 2}),
    ("perinvfl", {"inv": "groupdro", "personal_steps": 2}),
    ("perinvfl", {"optimizer": "sgd", "anneal_rounds": 1, "irm_lambda": 10.0}),
    ("apfl", {"adaptive": True}),
    ("ifca", {"num_clusters": 2}),
    ("cfl", {"warmup_rounds": 0, "eps1": 10.0, "eps2": 0.0}),
    ("fedfomo", {"num_models": 2}),
    ("dfl", {"donors": 2}),
]
CASES = [(name, {}) for name in ALGORITHMS.names()] + VARIANTS


def assert_same_extra(got, want, key: str) -> None:
    """A round extra (a number, or lists / mappings of them) equal to float32 rounding."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), key
        for k in want:
            assert_same_extra(got[k], want[k], f"{key}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), key
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_extra(g, w, f"{key}[{i}]")
    else:
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6, nan_ok=True), key


def case_id(case) -> str:
    name, options = case
    return name + "".join(f"-{k}={v}" for k, v in options.items())


@pytest.mark.parametrize("algorithm,options", CASES, ids=map(case_id, CASES))
def test_cohort_size_does_not_change_results(algorithm, options):
    """Cohort widths 1, 3 and all give the same server state, per-client accuracies,
    round extras and persistent per-client state (personal models, control variates,
    local heads …), at partial participation so that the unsampled clients' updates
    (pFedMe, FedSDR) count."""
    data = algorithm_test_data(algorithm)
    runs = []
    for c in (1, 3, 0):
        cfg = make_config(
            algorithm=algorithm,
            algorithm_options=options,
            cohort_size=c,
            participation=0.6,
            **SETTINGS,
        )
        exp = build_experiment(cfg, data=data())
        runs.append((exp.runner.run(), exp.runner.store.state or {}))
    (ref, ref_state), others = runs[0], runs[1:]
    acc = ref.accuracy
    assert acc.numel() and bool(((acc >= 0) & (acc <= 100)).all())
    assert all(0.0 <= v <= 100.0 and not math.isnan(v) for v in ref.metrics["per_client"])
    for result, state in others:
        assert result.metrics["per_client"] == pytest.approx(ref.metrics["per_client"], abs=1e-6)
        for k, v in ref.server.items():
            torch.testing.assert_close(result.server[k], v, rtol=1e-5, atol=1e-6)
        extras = result.rounds[-1].extras
        for k, v in ref.rounds[-1].extras.items():
            assert_same_extra(extras[k], v, k)
        assert sorted(state) == sorted(ref_state)
        for k, v in ref_state.items():
            torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6, msg=k)
