"""FedFomo (src/fedshift/algorithms/fedfomo.py): the weights by hand, and finite models for
a client without validation rows (issue 19)."""

from __future__ import annotations

import torch
from helpers import PFL_SETTINGS as SETTINGS
from toy import toy_data

import fedshift as fs
from fedshift.data.federated import Split
from fedshift.engine.contract import leaves


def finite(tree) -> bool:
    return all(torch.isfinite(v).all() for v in leaves(tree) if v.is_floating_point())


def test_fedfomo_client_without_validation_rows_keeps_finite_model():
    """A client with no validation rows scores every model +inf; inf − inf must not turn
    its weights, then its model (and every model that downloads it), into NaN."""
    data = toy_data()
    x, y = data.val["val"].client(1)
    empty = (x[:0], y[:0])
    clients = [data.val["val"].client(i) for i in range(data.num_clients)]
    clients[0] = empty
    clients[3] = empty
    data.val = {"val": Split.from_clients(clients)}
    opts = {**SETTINGS, "rounds": 3}
    out = fs.run(algorithm="fedfomo", data=data, algorithm_options={"num_models": 3}, **opts)
    # the engine drops a non-finite update and logs it: there must be none
    events = [e for r in out.result.rounds for e in r.extras.get("events", [])]
    assert not [e for e in events if e["event"] == "nonfinite"], events
    assert finite(out.result.server)  # the server holds every client's latest model
    init = fs.run(
        algorithm="fedfomo", data=data, algorithm_options={"num_models": 3}, **{**opts, "rounds": 0}
    )
    start = init.result.server["m"]["p"]  # clients 0 and 3 trained (locally) all the same
    for k, v in out.result.server["m"]["p"].items():
        assert not torch.equal(v[0], start[k][0])


def test_fedfomo_weights_by_hand():
    from fedshift.algorithms.fedfomo import fomo_weights

    own = torch.tensor([1.0, 2.0])
    other = torch.tensor([[0.5, 1.5], [2.0, 1.0]])
    dist = torch.tensor([[0.5, 0.0], [2.0, 4.0]])
    expected = torch.tensor([[1.0, 0.0], [0.0, 0.25]])  # (1 − 0.5)/0.5; equal model → 0
    torch.testing.assert_close(fomo_weights(own, other, dist), expected)
