"""DFL (src/fedshift/algorithms/dfl.py): donor traffic, the specific branch's MI term and the
invariant branch's BatchNorm statistics."""

from __future__ import annotations

import pytest
import torch
from helpers import seed_experiment as experiment
from helpers import seed_run as run

from fedshift.algorithms.common.mi import init_critic
from fedshift.api import make_config
from fedshift.experiment import build_experiment


def test_dfl_counts_donor_traffic():
    with_t = run("dfl", rounds=2)
    without = run("dfl", rounds=2, algorithm_options={"lambda_": 0.0})
    assert with_t.result.rounds[1].bytes_down > without.result.rounds[1].bytes_down
    assert with_t.result.rounds[0].bytes_up > without.result.rounds[0].bytes_up


def test_dfl_only_the_specific_branch_minimises_i_s():
    """Algorithm 2: E_s descends ∇_{ω_s} I_s, E_c is updated by F_k − I_c alone, and the
    I_s critic ascends its estimate. So E_c's gradient must not depend on the I_s critic,
    while E_s's does (MI terms only: λ = 0 and a zero head isolate them)."""
    from fedshift.algorithms.common.global_model import split_state
    from fedshift.algorithms.dfl import HEAD, INV, SPEC

    exp = experiment("dfl", lambda_=0.0)
    alg = exp.algorithm
    server = alg.init()
    glob_p, glob_b = split_state(server)
    local_p, local_b = split_state(alg.init_client_state(server))
    extras = {"global": server}
    x, y = exp.data.train.x[:16], exp.data.train.y[:16]
    w = torch.ones(16)

    def grads(critic_seed):
        g = torch.Generator().manual_seed(critic_seed)
        fresh = init_critic(alg.net.feature_dim, alg.hp.critic_hidden, g)
        critic = {f"critic_s.{k}": v for k, v in fresh.items()}
        p = {**glob_p, **local_p, **critic}
        p = {k: (torch.zeros_like(v) if k.startswith(HEAD) else v) for k, v in p.items()}
        p = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        loss = alg.loss(p, {**glob_b, **local_b}, extras, x, y, w)
        keys = list(p)
        return dict(zip(keys, torch.autograd.grad(loss, [p[k] for k in keys]), strict=True))

    a, b = grads(1), grads(2)
    inv = [k for k in a if k.startswith(INV)]
    spec = [k for k in a if k.startswith(SPEC)]
    assert inv and spec
    for k in inv:  # I_c's gradient only, the same whatever the I_s critic
        torch.testing.assert_close(a[k], b[k])
    assert any(not torch.allclose(a[k], b[k]) for k in spec)  # E_s minimises I_s
    assert any(a[k].abs().sum() > 0 for k in a if k.startswith("critic_s."))  # critic ascends


@pytest.mark.parametrize("mode", ["local", "global"])
def test_dfl_invariant_bn_statistics(mode):
    """invariant_bn=local: a trained client is evaluated with E_c^G's weights and its own
    E_c BatchNorm statistics (which differ between clients of shifted inputs); global: with
    the server's averaged statistics."""
    from fedshift.data.federated import FederatedData, Split

    g = torch.Generator().manual_seed(0)

    def part(n, shift):
        x = torch.rand(n, 1, 8, 8, generator=g) + shift
        return x, torch.randint(0, 3, (n,), generator=g)

    shifts = (0.0, 1.0, 3.0)
    train = Split.from_clients([part(n, s) for n, s in zip((20, 30, 12), shifts, strict=True)])
    test = {"test": Split.from_clients([part(10, s) for s in shifts])}
    cfg = make_config(
        algorithm="dfl",
        rounds=1,
        lr=0.05,
        batch_size=8,
        local_steps=2,
        model="dfl-cnn",
        model_options={"channels": [4], "feature_dim": 8},
        algorithm_options={"invariant_bn": mode, "donors": 1},
    )
    exp = build_experiment(cfg, data=FederatedData("tiny", 3, (1, 8, 8), train, test))
    exp.runner.run()
    server, ids = exp.runner.server, torch.arange(3)
    state = exp.runner.store.take(ids, "cpu")
    pred = exp.algorithm.predictor(server, state, exp.ctx.cohort(ids, 0))
    key = "extractor.invariant.bn1.running_mean"
    got, avg = pred.buffers[key], server["b"][key]
    if mode == "local":
        torch.testing.assert_close(got, state["b"][key])
        assert not torch.allclose(got[0], got[2]) and not torch.allclose(got[0], avg)
    else:
        assert key not in state.get("b", {})
        for row in got:
            torch.testing.assert_close(row, avg)
