"""The fused step of grouped linear heads (src/fedshift/engine/fused_heads.py, FedSDR's
environment classifiers) equals the general path, both its written gradient and autograd
of the loss it declares, and is taken only where it applies."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.data.federated import Split
from fedshift.engine import local
from fedshift.engine.fused_heads import FusedGroupedHeads
from fedshift.engine.sgd import SGDConfig
from fedshift.engine.tree import stack
from fedshift.experiment import build_experiment

ENV = ("env.weight", "env.bias")


def mixed_env_data():
    """toy data whose clients each hold rows of all three environments, unevenly, so that a
    minibatch mixes groups and some batches miss one (its head gets no gradient)."""
    d = toy_data(sizes=(5, 17, 30, 9))
    n = d.train.y.shape[0]
    env = (torch.arange(n) * 7 // 3) % 3
    d.train = Split(d.train.x, d.train.y, d.train.offsets, env)
    d.train_env_names = ["a", "b", "c"]
    return d


def train_heads(mode: str, sgd: SGDConfig, monkeypatch):
    """One ctx.train call of FedSDR's environment classifiers on fixed random features:
    ``fused``, ``written`` (the general path's written gradient) or ``autograd``."""
    data = mixed_env_data()
    cfg = fs.make_config(
        algorithm="fedsdr", lr=0.1, batch_size=8, local_epochs=1, model_options={"hidden": [6]}
    )
    exp = build_experiment(cfg, data=data)
    ctx, alg = exp.ctx, exp.algorithm
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    server = alg.init()
    g = torch.Generator().manual_seed(3)
    heads = stack({k: server[k] for k in ENV}, len(cohort))  # every client's own copy
    params = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in heads.items()}
    z = torch.randn(data.train.y.shape[0], ctx.model.feature_dim, generator=g)
    ctx.trainer.fused = mode == "fused"
    if mode == "autograd":
        monkeypatch.setattr(local, "written_gradient", lambda loss: None)
    calls = []
    train = FusedGroupedHeads.train
    monkeypatch.setattr(
        FusedGroupedHeads, "train", lambda self, *a, **k: calls.append(1) or train(self, *a, **k)
    )
    out = ctx.train(alg.env_risk, params, {}, cohort, "test/env", epochs=3, inputs=z, sgd=sgd)
    monkeypatch.undo()
    assert calls == ([1] if mode == "fused" else [])
    return out


@pytest.mark.parametrize(
    "sgd", [SGDConfig(0.1), SGDConfig(0.05, momentum=0.9), SGDConfig(0.05, 0.5, weight_decay=0.01)]
)
@pytest.mark.parametrize("other", ["written", "autograd"])
def test_fused_heads_equal_the_general_path(monkeypatch, sgd, other):
    fused = train_heads("fused", sgd, monkeypatch)
    general = train_heads(other, sgd, monkeypatch)
    assert torch.equal(fused.steps, general.steps)
    torch.testing.assert_close(fused.loss, general.loss, rtol=1e-5, atol=1e-6)
    for k in ENV:
        torch.testing.assert_close(fused.params[k], general.params[k], rtol=1e-5, atol=1e-6)
    start = train_heads("fused", SGDConfig(1e-30), monkeypatch).params
    assert not torch.allclose(fused.params["env.weight"], start["env.weight"])


def test_fused_heads_only_where_they_apply():
    exp = build_experiment(fs.make_config(algorithm="fedsdr"), data=mixed_env_data())
    loss = exp.algorithm.env_risk
    params = dict.fromkeys(ENV, torch.zeros(1))
    env = torch.zeros(3)
    assert FusedGroupedHeads.applies(loss, params, ENV, env, None, False) == ENV
    assert FusedGroupedHeads.applies(loss, params, ENV, None, None, False) is None  # no groups
    assert FusedGroupedHeads.applies(loss, params, ENV[:1], env, None, False) is None  # frozen
    assert FusedGroupedHeads.applies(loss, params, ENV, env, {"n": (2,)}, False) is None
    assert FusedGroupedHeads.applies(loss, params, ENV, env, None, True) is None  # extras
    assert FusedGroupedHeads.applies(exp.algorithm.sd_loss, params, ENV, env, None, False) is None
