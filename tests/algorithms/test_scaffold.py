"""SCAFFOLD (src/fedshift/algorithms/scaffold.py): control variates against Algorithm 1
written out by hand."""

from __future__ import annotations

import torch

import fedshift as fs
from fedshift.api import make_config
from fedshift.data.federated import FederatedData, Split
from fedshift.experiment import build_experiment


def two_clients() -> FederatedData:
    x0 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    x1 = torch.tensor([[0.0, 1.0]])
    split = Split.from_clients([(x0, torch.tensor([0, 1])), (x1, torch.tensor([1]))])
    return FederatedData("two", 2, (2,), split, {"test": split}, default_model="mlr")


def ce_grad(weight, bias, x, y):
    """Gradient of the mean cross-entropy of logits x·Wᵀ + b, by the softmax formula."""
    err = torch.softmax(x @ weight.T + bias, 1) - torch.nn.functional.one_hot(y, 2).double()
    return err.T @ x / len(y), err.mean(0)


def test_scaffold_control_variates_match_hand_computation():
    data, steps, lr, server_lr, rounds = two_clients(), 3, 0.5, 0.5, 3
    opts = dict(rounds=rounds, lr=lr, batch_size=0, local_steps=steps, model="mlr")
    out = fs.run(
        algorithm="scaffold", data=data, algorithm_options={"server_lr": server_lr}, **opts
    )
    exp = build_experiment(make_config(algorithm="scaffold", **opts), data=data)
    x = [exp.ctx.initial_params[k].double() for k in ("head.weight", "head.bias")]
    c = [torch.zeros_like(t) for t in x]
    c_i = [[torch.zeros_like(t) for t in x] for _ in range(2)]
    for _ in range(rounds):  # Algorithm 1, option II, full participation
        dy, dc = [], []
        for i in range(2):
            xi, yi = data.train.client(i)
            y = [t.clone() for t in x]
            for _ in range(steps):
                g = ce_grad(*y, xi.double(), yi)
                y = [y[j] - lr * (g[j] - c_i[i][j] + c[j]) for j in range(2)]
            plus = [c_i[i][j] - c[j] + (x[j] - y[j]) / (steps * lr) for j in range(2)]
            dy.append([y[j] - x[j] for j in range(2)])
            dc.append([plus[j] - c_i[i][j] for j in range(2)])
            c_i[i] = plus
        x = [x[j] + server_lr * (dy[0][j] + dy[1][j]) / 2 for j in range(2)]
        c = [c[j] + (dc[0][j] + dc[1][j]) / 2 for j in range(2)]
    server = out.result.server
    for j, k in enumerate(("head.weight", "head.bias")):
        torch.testing.assert_close(server["p"][k].double(), x[j], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(server["c"][k].double(), c[j], atol=1e-5, rtol=1e-5)
        # with full participation c stays the mean of the clients' control variates
        torch.testing.assert_close(c[j], (c_i[0][j] + c_i[1][j]) / 2)
    assert server["c"]["head.bias"].abs().sum() > 0
