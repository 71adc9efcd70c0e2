"""FedIIR (src/fedshift/algorithms/fediir.py): zero penalty is FedAvg."""

from __future__ import annotations

import torch
from helpers import baseline_experiment as experiment


def test_fediir_zero_penalty_is_fedavg():
    _, a = experiment("fediir", algorithm_options={"penalty": 0.0})
    _, b = experiment("fedavg")
    for k, v in b.server.items():
        torch.testing.assert_close(a.server[k], v)
    assert a.server["has_gbar"].item() == 1.0
