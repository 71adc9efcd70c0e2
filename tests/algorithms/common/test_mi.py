"""The JSD mutual-information estimator (src/fedshift/algorithms/common/mi.py) on a known case."""

from __future__ import annotations

import math

import torch

from fedshift.algorithms.common.mi import critic_score, init_critic, jsd_bound, jsd_mi


def test_jsd_estimator_known_case():
    # joint P over 4 cells vs product of marginals Q (uniform); optimal critic T* = log(P/Q)
    p = torch.tensor([0.4, 0.1, 0.1, 0.4], dtype=torch.float64)
    q = torch.full((4,), 0.25, dtype=torch.float64)
    t = torch.log(p / q)
    m = (p + q) / 2
    jsd = 0.5 * (p * torch.log(p / m)).sum() + 0.5 * (q * torch.log(q / m)).sum()
    torch.testing.assert_close(jsd_bound(t, t, p, q), 2 * jsd - 2 * math.log(2))
    # any other critic gives a lower value (the bound is a supremum over T)
    assert jsd_bound(t * 0.5, t * 0.5, p, q) < 2 * jsd - 2 * math.log(2)
    # jsd_mi pairs a_i with b_i (joint) and with b_{i+1} (product of marginals)
    g = torch.Generator().manual_seed(0)
    critic = init_critic(4, 5, g)
    a, b, w = torch.randn(6, 2), torch.randn(6, 2), torch.ones(6)
    hand = jsd_bound(critic_score(critic, a, b), critic_score(critic, a, b.roll(1, 0)), w, w)
    torch.testing.assert_close(jsd_mi(critic, a, b, w), hand)
