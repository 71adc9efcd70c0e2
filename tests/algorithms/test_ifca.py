"""IFCA (src/fedshift/algorithms/ifca.py): cluster choice and the one-cluster reduction."""

from __future__ import annotations

import torch
from helpers import PFL_SIZES as SIZES
from helpers import pfl_run as run

from fedshift.api import make_config
from fedshift.data.federated import FederatedData, Split
from fedshift.engine.contract import flatten
from fedshift.experiment import build_experiment


def test_ifca_picks_the_cluster_with_lowest_loss():
    same = torch.zeros(4, 2)
    parts = [(same, torch.zeros(4, dtype=torch.long)), (same, torch.ones(4, dtype=torch.long))]
    split = Split.from_clients(parts * 2)  # clients 0, 2 all class 0; clients 1, 3 class 1
    data = FederatedData("c", 2, (2,), split, {"test": split}, default_model="mlr")
    exp = build_experiment(make_config(algorithm="ifca", model="mlr", rounds=1), data=data)
    alg = exp.algorithm
    server = alg.init()
    server["p"]["head.weight"] = torch.zeros(4, 2, 2)
    server["p"]["head.bias"] = torch.tensor([[0.0, 3.0], [3.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    chosen = alg.choose(server, exp.ctx.cohort(torch.arange(4), 0))
    # class-0 clients: model 1 (bias 3 on class 0); class-1 clients: model 0
    assert chosen.tolist() == [1, 0, 1, 0]


def test_ifca_one_cluster_is_fedavg_and_logs_assignments():
    a, b = run("ifca", algorithm_options={"num_clusters": 1}), run("fedavg")
    clusters = flatten(a.result.server)
    for k, v in flatten(b.result.server).items():
        torch.testing.assert_close(clusters[k][0], v)
    assert a.result.rounds[0].extras["cluster"] == [0] * len(SIZES)
