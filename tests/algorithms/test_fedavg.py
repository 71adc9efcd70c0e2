"""FedAvg (src/fedshift/algorithms/fedavg.py) with FedOpt's server step: one full-batch step
plus FedAdam is centralised Adam (issue 18's IRM anchor)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import ADAM, two_equal_clients

import fedshift as fs
from fedshift.models.registry import build_model


def centralised_adam(server0, hidden, lr, rounds, l2, data):
    """Full-batch torch.optim.Adam on the pooled mean loss, from the run's initial model."""
    model = build_model("mlp", (6,), 2, {"hidden": hidden})
    model.load_state_dict(server0["p"])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(rounds):
        loss = F.cross_entropy(model(data.train.x), data.train.y)
        loss = loss + l2 * sum((p**2).sum() for p in model.parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_one_full_batch_step_plus_fedadam_is_centralised_adam(l2):
    data = two_equal_clients()
    kw = dict(data=data, lr=1.0, batch_size=0, local_steps=1, model_options={"hidden": [8]})
    opts = {**ADAM, "server_lr": 0.01}
    start = fs.run(algorithm="fedavg", rounds=0, algorithm_options=opts, **kw).result.server
    out = fs.run(
        algorithm="fedavg", rounds=5, algorithm_options=opts, weight_decay=2 * l2, **kw
    ).result.server
    ref = centralised_adam(start, [8], 0.01, 5, l2, data)
    for k, v in ref.items():
        torch.testing.assert_close(out["p"][k], v, rtol=1e-4, atol=1e-6)
    assert (out["p"]["head.weight"] - start["p"]["head.weight"]).abs().max() > 0.02  # it moved
    # IRM† with λ = 0 and its own L2 term is the same training
    irm = fs.run(
        algorithm="irm",
        rounds=5,
        algorithm_options={**opts, "lambda_": 0.0, "anneal_rounds": 0, "l2_regularizer": l2},
        **kw,
    ).result.server
    for k, v in ref.items():
        torch.testing.assert_close(irm["p"][k], v, rtol=1e-4, atol=1e-6)
