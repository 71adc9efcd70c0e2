"""CFL (src/fedshift/algorithms/cfl.py): the split criterion, the bipartition and the
clusters' updates."""

from __future__ import annotations

import torch
from toy import toy_data

from fedshift.algorithms.base import RoundInfo
from fedshift.algorithms.cfl import bipartition, should_split
from fedshift.api import make_config
from fedshift.experiment import build_experiment


def test_cfl_split_criterion_and_bipartition():
    g = torch.Generator().manual_seed(0)
    up = torch.tensor([3.0, 0.0, 0.0, 0.0])
    noise = 0.1 * torch.randn(6, 4, generator=g)
    updates = torch.cat([up.expand(3, 4), -up.expand(3, 4)]) + noise
    labels = bipartition(updates)
    assert len(set(labels[:3].tolist())) == 1 and len(set(labels[3:].tolist())) == 1
    assert labels[0] != labels[3]
    mean_norm, max_norm = float(updates.mean(0).norm()), float(updates.norm(dim=1).max())
    assert should_split(mean_norm, max_norm, eps1=0.4, eps2=1.6)
    assert not should_split(mean_norm, max_norm, eps1=0.4, eps2=5.0)  # nobody moves enough
    assert not should_split(float(updates[:3].mean(0).norm()), max_norm, 0.4, 1.6)  # agree


def test_cfl_aggregate_splits_opposed_clients_and_updates_each_cluster():
    sizes = (10, 10, 10, 10, 10, 10)
    exp = build_experiment(
        make_config(algorithm="cfl", rounds=1, model="mlr", algorithm_options={"warmup_rounds": 0}),
        data=toy_data(sizes, dim=2, classes=2),
    )
    alg, server = exp.algorithm, exp.algorithm.init()
    sign = torch.tensor([1.0, 1, 1, -1, -1, -1]).view(6, 1, 1)
    d = {"d": {"head.weight": sign * torch.tensor([[2.0, 0.0], [0.0, 0.0]]).expand(6, 2, 2)}}
    d["d"]["head.bias"] = torch.zeros(6, 2)
    info = RoundInfo(torch.arange(6), torch.full((6,), 10.0), 0)
    new = alg.aggregate(server, d, info)
    assert new["cluster"].tolist() in ([0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0])
    w0 = server["m"]["p"]["head.weight"][0]
    got = new["m"]["p"]["head.weight"][new["cluster"][0]] - w0
    torch.testing.assert_close(got, torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    assert info.log["clusters"] == 2
