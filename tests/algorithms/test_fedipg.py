"""FedIPG (src/fedshift/algorithms/fedipg.py): the λ = 0 reduction, the exit strategy and the
contributions of eq. (12) by hand."""

from __future__ import annotations

import torch
from helpers import SEED_SETTINGS as SETTINGS
from helpers import seed_run as run
from toy import toy_data

import fedshift as fs


def test_fedipg_lambda_zero_is_fedavg():
    a = run("fedipg", algorithm_options={"lambda_": 0.0})
    b = fs.run(algorithm="fedavg", data=toy_data(), local_steps=4, **SETTINGS)
    for part, tree in b.result.server.items():  # {"p": …, "b": …}
        for k, v in tree.items():
            torch.testing.assert_close(a.result.server[part][k], v)
    assert len(a.result.rounds[0].extras["contribution"]) == 7


def test_fedipg_exit_strategy_ignores_exited_uploads():
    """Alg. 1 line 6 aggregates I_ID only: whatever the exited clients 1 and 3 hold, the
    global model is the same (it would change if their uploads were averaged in)."""

    def corrupt(data):  # clients 1 and 3: other features and labels, same sizes
        x, y, off, sizes = data.train.x, data.train.y, data.train.offsets, data.train.sizes()
        for i in (1, 3):
            rows = slice(int(off[i]), int(off[i] + sizes[i]))
            x[rows] = -5 * x[rows] + 3
            y[rows] = (y[rows] + 1) % data.num_classes
        return data

    opts = dict(algorithm="fedipg", local_steps=4, **SETTINGS)
    exit_ = {"lambda_": 0.01, "exit_clients": [1, 3]}
    a = fs.run(data=toy_data(), algorithm_options=exit_, **opts)
    b = fs.run(data=corrupt(toy_data()), algorithm_options=exit_, **opts)
    for k, v in a.result.server["p"].items():
        torch.testing.assert_close(b.result.server["p"][k], v)
    assert a.result.rounds[-1].extras["exited"] == [1, 3]
    kept = fs.run(data=corrupt(toy_data()), algorithm_options={"lambda_": 0.01}, **opts)
    assert any(
        not torch.allclose(kept.result.server["p"][k], v) for k, v in a.result.server["p"].items()
    )  # the corruption matters when 1 and 3 aggregate


def test_fedipg_contribution_by_hand():
    """Eq. (12) with ĝ_{-i}: four clients, three pull one way and one the other (η = 1,
    one step each, so g_i = w^t − w_i)."""
    from types import SimpleNamespace

    from fedshift.algorithms.fedipg import FedIPG

    g = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    server = {"p": {"w": torch.zeros(2)}}
    models = {"p": {"w": -g}}
    ones = torch.ones(4)

    def contributions(smoothness, weights):
        fake = SimpleNamespace(
            ctx=SimpleNamespace(sgd=SimpleNamespace(lr=1.0)),
            hp=SimpleNamespace(smoothness=smoothness),
        )
        return FedIPG.contributions(fake, server, models, ones, weights, ones)

    # L = 0: C_0 = p⟨ĝ_{-0}, g_0⟩/‖ĝ_{-0}‖² = ¼·⅓/(1/9) = 0.75; C_3 = ¼·(−1)/1 = −0.25
    c = contributions(0.0, ones)
    torch.testing.assert_close(c, torch.tensor([0.75, 0.75, 0.75, -0.25]))
    # L = 1 adds −(L/2)η p²‖g_i‖² = −1/32 to the numerator
    c = contributions(1.0, ones)
    torch.testing.assert_close(c, torch.tensor([0.46875, 0.46875, 0.46875, -0.28125]))
    # client 3 exited (weight 0): the others are judged against the two remaining
    # regular clients, client 3 against all three
    c = contributions(0.0, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(c, torch.tensor([0.25, 0.25, 0.25, -0.25]))
