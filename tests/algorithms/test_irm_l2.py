"""IRM†-L2 (src/fedshift/algorithms/irm_l2.py): the global model is IRM†'s, and a zero pull
gives Local personal models."""

from __future__ import annotations

from helpers import assert_trees_close, client_state
from helpers import baseline_experiment as experiment


def test_irm_l2_global_model_is_irm_and_zero_weight_is_local():
    opts = {"anneal_rounds": 1, "lambda_": 10.0}
    l2, res = experiment("irm-l2", algorithm_options={**opts, "l2": 0.0})
    _, irm = experiment("irm", algorithm_options=opts)
    assert_trees_close(res.server, irm.server)
    local, _ = experiment("local")
    assert_trees_close(client_state(l2), client_state(local))
