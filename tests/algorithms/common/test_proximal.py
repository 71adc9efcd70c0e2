"""The proximal solver and report_as (src/fedshift/algorithms/common/proximal.py)."""

from __future__ import annotations

import pytest
import torch

from fedshift.algorithms.common.proximal import prox_solve, report_as


def test_prox_solve_on_a_quadratic():
    # f(θ) = ½‖θ − a‖², prox weight λ: each GD step θ ← θ − η((θ − a) + λ(θ − w))
    a, w0, t0 = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([1.0])
    lam, lr, k = 3.0, 0.1, 4
    out = prox_solve(lambda t: 0.5 * ((t["v"] - a) ** 2).sum(), {"v": t0}, {"v": w0}, lam, lr, k)
    t = t0.clone()
    for _ in range(k):
        t = t - lr * ((t - a) + lam * (t - w0))
    torch.testing.assert_close(out["v"], t)


def test_prox_solve_with_a_written_gradient_takes_the_same_steps():
    """The written-gradient path (θ ← (1 − ηλ)θ + ηλw − η∇f) is the autograd path's steps."""
    g = torch.Generator().manual_seed(0)
    a, w0, t0 = (torch.randn(3, 4, generator=g) for _ in range(3))

    def f(t):
        return 0.5 * ((t["v"] - a) ** 2).sum() + (t["v"] ** 3).sum() / 3

    def written(t):
        return {"v": (t["v"] - a) + t["v"] ** 2}

    got = prox_solve(f, {"v": t0}, {"v": w0}, 3.0, 0.05, 6, written)
    want = prox_solve(f, {"v": t0}, {"v": w0}, 3.0, 0.05, 6)
    torch.testing.assert_close(got["v"], want["v"])
    assert not torch.allclose(got["v"], t0)
    with pytest.raises(ValueError, match="autograd"):
        prox_solve(f, {"v": t0}, {"v": w0}, 3.0, 0.05, 6, written, with_value=True)


def test_report_as_keeps_the_gradient_and_shows_the_value():
    x = torch.tensor(2.0, requires_grad=True)
    r = report_as(x**2, torch.tensor(7.0))
    (gx,) = torch.autograd.grad(r, x)
    assert r.item() == 7.0 and gx.item() == 4.0
