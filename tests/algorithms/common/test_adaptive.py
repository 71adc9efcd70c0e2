"""FedOpt's server steps and Adam (src/fedshift/algorithms/common/adaptive.py) against
hand computations and torch.optim.Adam."""

from __future__ import annotations

import torch
from helpers import ADAM

from fedshift.algorithms.common.adaptive import (
    ServerOptHyper,
    adam_step,
    server_opt_state,
    server_update,
)
from fedshift.engine.contract import flatten


def test_fedadam_step_matches_hand_computation():
    hp = ServerOptHyper(server_opt="adam", server_lr=0.1, server_beta1=0.5, server_beta2=0.75)
    server = {"p": {"w": torch.tensor([1.0, -2.0])}, "b": {"n": torch.tensor([3.0])}}
    server = {**server, **server_opt_state(hp, server)}
    average = {"p": {"w": torch.tensor([0.5, -2.5])}, "b": {"n": torch.tensor([5.0])}}
    out = server_update(hp, server, average)
    # g = x − avg = [0.5, 0.5]; m = 0.5·g = 0.25; v = 0.25·g² = 0.0625; √v = 0.25
    # x − 0.1·0.25/(0.25 + 1e-3) (Reddi et al. Alg. 2: no bias correction)
    step = 0.1 * 0.25 / (0.25 + 1e-3)
    torch.testing.assert_close(out["p"]["w"], torch.tensor([1.0 - step, -2.0 - step]))
    torch.testing.assert_close(out["b"]["n"], torch.tensor([5.0]))  # buffers are averaged
    torch.testing.assert_close(out["opt"]["m"]["p"]["w"], torch.tensor([0.25, 0.25]))
    torch.testing.assert_close(out["opt"]["v"]["p"]["w"], torch.tensor([0.0625, 0.0625]))
    assert list(flatten(out)) == ["p/w", "b/n", "opt/m/p/w", "opt/v/p/w", "opt/k"]
    # with bias correction the first step is lr·sign(g)·|g|/(|g| + τ) — torch's Adam
    hp = ServerOptHyper(server_lr=0.1, **ADAM)
    out = server_update(hp, {**server, **server_opt_state(hp, server)}, average)
    torch.testing.assert_close(out["p"]["w"], torch.tensor([0.9, -2.1]))


def test_fedyogi_and_fedadagrad_second_moments():
    server = {"p": {"w": torch.tensor([0.0])}}
    average = {"p": {"w": torch.tensor([-2.0])}}  # g = 2, g² = 4
    for rule, v in (("yogi", 4.0 * 0.01), ("adagrad", 4.0)):
        hp = ServerOptHyper(server_opt=rule, server_lr=1.0, server_beta2=0.99, server_tau=0.5)
        state = {**server, **server_opt_state(hp, server)}
        state["opt"]["v"]["p"]["w"] = torch.tensor([0.0])
        out = server_update(hp, state, average)
        # yogi: v = 0 − 0.01·4·sign(0 − 4) = 0.04; adagrad: v = 0 + 4; m = 0.1·2 = 0.2
        torch.testing.assert_close(out["opt"]["v"]["p"]["w"], torch.tensor([v]))
        torch.testing.assert_close(out["p"]["w"], torch.tensor([-0.2 / (v**0.5 + 0.5)]))


def test_server_sgd_default_is_the_plain_average():
    hp = ServerOptHyper()
    avg = {"p": {"w": torch.tensor([0.3])}}
    assert server_update(hp, {"p": {"w": torch.tensor([1.0])}}, avg) is avg
    hp = ServerOptHyper(server_lr=0.5)
    out = server_update(hp, {"p": {"w": torch.tensor([1.0])}}, avg)
    torch.testing.assert_close(out["p"]["w"], torch.tensor([0.65]))


def test_adam_step_is_torch_adam():
    p = torch.randn(5, dtype=torch.float64)
    ref = p.clone().requires_grad_()
    opt = torch.optim.Adam([ref], lr=0.01)
    zeros = torch.zeros(5, dtype=torch.float64)
    params, m, v, k = {"p": p}, {"p": zeros}, {"p": zeros}, torch.zeros(())
    for i in range(4):
        g = torch.sin(params["p"] * (i + 1))
        params, m, v, k = adam_step(params, {"p": g}, m, v, k, 0.01)
        opt.zero_grad()
        ref.grad = torch.sin(ref.detach() * (i + 1))
        opt.step()
    # k is a float32 step count (as in the server state), so the corrections are float32
    torch.testing.assert_close(params["p"], ref.detach(), rtol=1e-5, atol=1e-6)
