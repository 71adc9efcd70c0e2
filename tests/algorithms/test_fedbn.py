"""FedBN (src/fedshift/algorithms/fedbn.py): BatchNorm parameters and statistics stay local."""

from __future__ import annotations

import pytest
import torch
from helpers import PFL_SETTINGS as SETTINGS
from helpers import PFL_SIZES as SIZES
from helpers import pfl_run as run
from toy import toy_data

from fedshift.api import make_config
from fedshift.experiment import build_experiment
from fedshift.models.layers import batchnorm_keys

BN_MODEL = dict(model="dfl-cnn", model_options={"channels": [2], "feature_dim": 4})


def test_fedbn_keeps_batchnorm_local():
    data = toy_data(SIZES, dim=16)
    exp = build_experiment(make_config(algorithm="fedbn", **{**SETTINGS, **BN_MODEL}), data=data)
    result = exp.runner.run()
    bn = batchnorm_keys(exp.ctx.model)
    assert bn and not any(k in bn for part in result.server.values() for k in part)
    local = exp.runner.store.state  # {"p": BN γ, β, "b": BN statistics}
    assert {k for part in local.values() for k in part} == bn
    mean = local["b"]["extractor.bn1.running_mean"]
    assert not torch.allclose(mean[0], mean[1])  # each client its own statistics


def test_fedbn_statistics_only_averages_gamma_beta_and_keeps_statistics_local():
    data = toy_data(SIZES, dim=16)
    opts = {**SETTINGS, **BN_MODEL, "algorithm_options": {"local": "statistics"}}
    exp = build_experiment(make_config(algorithm="fedbn", **opts), data=data)
    result = exp.runner.run()
    stats = {k for k in batchnorm_keys(exp.ctx.model) if k in exp.ctx.initial_buffers}
    assert "extractor.bn1.weight" in result.server["p"]  # γ is averaged with the weights
    assert not any(k in stats for part in result.server.values() for k in part)
    local = exp.runner.store.state
    assert {k for part in local.values() for k in part} == stats
    mean = local["b"]["extractor.bn1.running_mean"]
    assert not torch.allclose(mean[0], mean[1])


def test_fedbn_without_batchnorm_is_fedavg_with_a_warning():
    with pytest.warns(UserWarning, match="no BatchNorm"):
        a = run("fedbn")
    b = run("fedavg")
    assert a.metrics["per_client"] == pytest.approx(b.metrics["per_client"], abs=1e-9)
    for k, v in b.result.server.items():
        torch.testing.assert_close(a.result.server[k], v)


def test_fedbn_with_batchnorm_does_not_depend_on_the_cohort_width():
    """FedBN on a model that has BatchNorm layers (the registry-wide test in
    algorithms/test_all_algorithms.py runs an MLP, where FedBN is FedAvg): widths 1 and all
    give the same server state, per-client accuracies and round extras."""
    data = toy_data(SIZES, dim=16)
    data.train.env = torch.cat([torch.full((n,), i % 2) for i, n in enumerate(SIZES)])
    outs = [run("fedbn", data=data, cohort_size=c, **BN_MODEL) for c in (1, 0)]
    assert outs[1].metrics["per_client"] == pytest.approx(outs[0].metrics["per_client"], abs=1e-9)
    for k, v in outs[0].result.server.items():
        torch.testing.assert_close(outs[1].result.server[k], v, rtol=1e-5, atol=1e-6)
    extras = outs[1].result.rounds[-1].extras
    for k, v in outs[0].result.rounds[-1].extras.items():
        assert extras[k] == pytest.approx(v, rel=1e-4)
