"""OOD baselines: IRM† (federated IRMv1)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.common.invariance import irm_weight, irmv1_penalty

SETTINGS = dict(lr=0.1, batch_size=8, local_epochs=2, rounds=3, model_options={"hidden": [16]})


def run(algorithm, **kw):
    return fs.run(algorithm=algorithm, data=toy_data(), **{**SETTINGS, **kw})


def test_irmv1_penalty_matches_hand_computation():
    # binary logistic model as 2-class logits [0, z]: d/ds CE(s·z) at s=1 = mean((σ(z) − y)·z)
    z = torch.tensor([1.0, -2.0, 0.5])
    y = torch.tensor([1, 0, 0])
    logits = torch.stack([torch.zeros(3), z], 1)
    hand = (((torch.sigmoid(z) - y.float()) * z).mean()) ** 2
    torch.testing.assert_close(irmv1_penalty(logits, y, torch.ones(3)), hand)
    # empty slots (w = 0) are ignored
    w = torch.tensor([1.0, 1.0, 0.0])
    hand2 = (((torch.sigmoid(z) - y.float()) * z)[:2].mean()) ** 2
    torch.testing.assert_close(irmv1_penalty(logits, y, w), hand2)


def test_irmv1_penalty_gradcheck():
    y = torch.tensor([0, 1, 2, 1])
    logits = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.ones(4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda z: irmv1_penalty(z, y, w), (logits,))
    assert F.cross_entropy(logits, y).dtype == torch.float64


def test_irm_weight_anneals():
    assert irm_weight(torch.tensor(2.0), 3, 1e4).item() == 1.0
    assert irm_weight(torch.tensor(3.0), 3, 1e4).item() == 1e4


def test_irm_lambda_zero_after_annealing_is_fedavg():
    a = run("irm", algorithm_options={"lambda_": 0.0, "anneal_rounds": 0})
    b = run("fedavg")
    for k, v in b.result.server.items():
        torch.testing.assert_close(a.result.server[k], v)


def test_groupdro_weight_step_by_hand():
    from fedshift.algorithms.common.invariance import groupdro_weights

    q = torch.tensor([0.25, 0.25, 0.5])
    out = groupdro_weights(q, torch.tensor([0, 2]), torch.tensor([1.0, 2.0]), 0.5)
    raw = torch.tensor([0.25 * torch.e**0.5, 0.25, 0.5 * torch.e])
    torch.testing.assert_close(out, raw / raw.sum())


def test_groupdro_cohort_invariance_and_q_simplex():
    outs = [run("groupdro", cohort_size=c) for c in (1, 3, 0)]
    for o in outs[1:]:
        assert o.metrics["per_client"] == pytest.approx(outs[0].metrics["per_client"], abs=1e-9)
        for k, v in outs[0].result.server.items():
            torch.testing.assert_close(o.result.server[k], v, rtol=1e-5, atol=1e-6)
    q = outs[0].result.server["q"]
    assert q.sum().item() == pytest.approx(1.0) and (q > 0).all()
