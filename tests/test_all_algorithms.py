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


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_cohort_size_does_not_change_results(algorithm):
    """Cohort widths 1, 3 and all give the same server state, per-client accuracies and
    persistent per-client state (personal models, control variates, local heads …), at
    partial participation so that the unsampled clients' updates (pFedMe, FedSDR) count."""
    data = algorithm_test_data(algorithm)
    runs = []
    for c in (1, 3, 0):
        cfg = make_config(algorithm=algorithm, cohort_size=c, participation=0.6, **SETTINGS)
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
        assert sorted(state) == sorted(ref_state)
        for k, v in ref_state.items():
            torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6, msg=k)
