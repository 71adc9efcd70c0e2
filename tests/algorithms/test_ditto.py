"""Ditto (src/fedshift/algorithms/ditto.py): λ = 0 gives Local personal models, and the global
model is always FedAvg's."""

from __future__ import annotations

import pytest
from helpers import assert_trees_close, client_state
from helpers import baseline_experiment as experiment


def test_ditto_lambda_zero_personal_models_are_local_and_global_is_fedavg():
    ditto, d = experiment("ditto", algorithm_options={"lambda_": 0.0})
    local, loc = experiment("local")
    assert_trees_close(client_state(ditto), client_state(local))
    assert d.metrics["per_client"] == pytest.approx(loc.metrics["per_client"], abs=1e-9)
    _, fedavg = experiment("fedavg")
    assert_trees_close(d.server, fedavg.server)
    _, d1 = experiment("ditto")  # the global model never depends on λ
    assert_trees_close(d1.server, fedavg.server)
    assert d1.metrics["per_client"] != pytest.approx(loc.metrics["per_client"], abs=1e-9)
