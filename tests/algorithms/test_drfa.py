"""DRFA (src/fedshift/algorithms/drfa.py): the λ step by hand, γ = 0, and the checkpoint's
names."""

from __future__ import annotations

import pytest
import torch
from helpers import BASELINE_SETTINGS as SETTINGS
from helpers import baseline_experiment as experiment
from toy import toy_data

from fedshift.algorithms.drfa import drfa_lambda_step
from fedshift.api import make_config
from fedshift.experiment import build_experiment


def test_drfa_lambda_step_by_hand():
    lam = torch.tensor([0.5, 0.5], dtype=torch.float64)
    # v = [N/|U|·1, 0] = [2, 0]; λ + γτv = [0.9, 0.5]; projection: θ = 0.2 → [0.7, 0.3]
    out = drfa_lambda_step(lam, torch.tensor([0]), torch.tensor([1.0]), gamma=0.1, tau=2)
    torch.testing.assert_close(out, torch.tensor([0.7, 0.3], dtype=torch.float64))
    floored = drfa_lambda_step(lam, torch.tensor([0]), torch.tensor([10.0]), gamma=1.0, tau=1)
    assert floored.min() > 0 and floored.sum().item() == pytest.approx(1.0)


def test_drfa_gamma_zero_keeps_sample_weights():
    _, res = experiment("drfa", algorithm_options={"gamma": 0.0})
    sizes = toy_data().train.sizes().double()
    torch.testing.assert_close(res.server["lambda"], sizes / sizes.sum())
    _, res2 = experiment("drfa")
    assert res2.server["lambda"].sum().item() == pytest.approx(1.0)
    assert not torch.allclose(res2.server["lambda"], sizes / sizes.sum())


def test_drfa_checkpoint_names_are_the_flat_names_of_before():
    """DRFA's state is nested (``{"p", "b", "snap": {"p", "b"}, …}``); a checkpoint stores
    it flattened under exactly the names the flat state of older versions had (written out
    here), so their checkpoints load, and the names load back into the nested state."""
    data = toy_data(dim=16)
    bn = dict(model="dfl-cnn", model_options={"channels": [2], "feature_dim": 4})
    cfg = make_config(algorithm="drfa", scenario=data.name, **{**SETTINGS, "rounds": 1, **bn})
    exp = build_experiment(cfg, data=data)
    saved = exp.runner.state_dict(exp.runner.run(), 1)
    params, buffers = exp.ctx.initial_params, exp.ctx.initial_buffers
    model = [f"p/{k}" for k in params] + [f"b/{k}" for k in buffers]
    assert buffers and list(saved["server"]) == [
        *model,
        *(f"snap/{k}" for k in model),
        "lambda",
        "has_snap",
    ]
    exp.runner.load_state_dict(saved)
    server = exp.runner.server
    assert list(server) == ["p", "b", "snap", "lambda", "has_snap"]
    assert list(server["snap"]) == ["p", "b"] and list(server["snap"]["b"]) == list(buffers)
