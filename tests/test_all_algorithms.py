"""Every registered algorithm, on a tiny problem with training environments: it runs, its
accuracies are percentages, and the batched cohort gives the sequential numbers."""

from __future__ import annotations

import math

import pytest
import torch
from toy import algorithm_test_data

import fedshift as fs
from fedshift.algorithms import ALGORITHMS

SETTINGS = dict(lr=0.05, batch_size=8, rounds=2, model_options={"hidden": [8]})


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_cohort_size_does_not_change_results(algorithm):
    data = algorithm_test_data(algorithm)
    outs = [fs.run(algorithm=algorithm, data=data(), cohort_size=c, **SETTINGS) for c in (1, 3, 0)]
    ref = outs[0]
    acc = ref.result.accuracy
    assert acc.numel() and bool(((acc >= 0) & (acc <= 100)).all())
    assert all(0.0 <= v <= 100.0 and not math.isnan(v) for v in ref.metrics["per_client"])
    for o in outs[1:]:
        assert o.metrics["per_client"] == pytest.approx(ref.metrics["per_client"], abs=1e-6)
        for k, v in ref.result.server.items():
            torch.testing.assert_close(o.result.server[k], v, rtol=1e-5, atol=1e-6)
