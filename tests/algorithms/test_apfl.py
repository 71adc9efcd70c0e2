"""APFL (src/fedshift/algorithms/apfl.py): reductions and the adaptive mixing weight."""

from __future__ import annotations

import pytest
import torch
from helpers import PFL_SETTINGS as SETTINGS
from helpers import PFL_SIZES as SIZES
from helpers import pfl_run as run
from toy import toy_data

from fedshift.api import make_config
from fedshift.experiment import build_experiment


def test_apfl_alpha_zero_is_fedavg_and_alpha_one_is_local():
    zero, fedavg = run("apfl", algorithm_options={"alpha": 0.0}), run("fedavg")
    assert zero.metrics["per_client"] == pytest.approx(fedavg.metrics["per_client"], abs=1e-9)
    for k, v in fedavg.result.server.items():
        torch.testing.assert_close(zero.result.server[k], v)
    one, local = run("apfl", algorithm_options={"alpha": 1.0}), run("local")
    assert one.metrics["per_client"] == pytest.approx(local.metrics["per_client"], abs=1e-9)


def test_apfl_adaptive_alpha_moves_and_stays_in_unit_interval():
    exp = build_experiment(
        make_config(algorithm="apfl", algorithm_options={"adaptive": True}, **SETTINGS),
        data=toy_data(SIZES),
    )
    exp.runner.run()
    alpha = exp.runner.store.state["alpha"]
    assert ((alpha >= 0) & (alpha <= 1)).all() and (alpha != 0.25).any()
