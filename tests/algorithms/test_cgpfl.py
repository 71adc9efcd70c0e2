"""CGPFL (src/fedshift/algorithms/cgpfl.py): the server step by hand and the K = 1 reduction
to pFedMe's local solver."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import seed_experiment as experiment
from helpers import seed_run as run

from fedshift.algorithms.base import RoundInfo
from fedshift.engine.schedule import make_schedule


def test_cgpfl_server_step_by_hand():
    exp = experiment("cgpfl", K=2, alpha=0.5)
    alg, server = exp.algorithm, exp.runner.server
    w0 = {k: v[0] for k, v in server["ctx"]["p"].items()}
    shift = torch.tensor([1.0, 1, 1, 1, -1, -1, -1])
    uploads = {"p": {k: v + shift.view(-1, *([1] * v.dim())) for k, v in w0.items()}}
    info = RoundInfo(torch.arange(7), torch.ones(7), 0)
    new = alg.aggregate(server, uploads, info)
    a, b = int(new["assign"][0]), int(new["assign"][4])
    assert a != b and (new["assign"][:4] == a).all() and (new["assign"][4:] == b).all()
    for k, v in w0.items():  # Ω_k ← Ω_k − α(Ω_k − mean of its uploads): w0 ± 0.5
        torch.testing.assert_close(new["ctx"]["p"][k][a], v + 0.5)
        torch.testing.assert_close(new["ctx"]["p"][k][b], v - 0.5)
    assert info.log["contexts"] == 2


@pytest.mark.parametrize("omega_step", ["pfedme", "thesis"])
def test_cgpfl_k1_is_pfedme_local_solver(omega_step):
    """K = 1, α = 1: one round equals pFedMe's bi-level local solver written out by hand,
    with the ω̃ step β·λ(ω̃ − θ) (pFedMe, default) or β·(2/N)(ω̃ − θ) (thesis line 10)."""
    lam, s_steps, r_iters, lr = 2.0, 2, 3, 0.05
    c = lam if omega_step == "pfedme" else 2 / 7  # toy data: N = 7
    out = run(
        "cgpfl",
        rounds=1,
        algorithm_options={
            "K": 1,
            "lambda_": lam,
            "inner_steps": s_steps,
            "local_iterations": r_iters,
            "personal_lr": 0.03,
            "omega_step": omega_step,
        },
    )
    exp = experiment("cgpfl", K=1)
    ctx, data = exp.ctx, exp.ctx.data.train
    model = ctx.model
    w0 = {k: v.clone() for k, v in ctx.initial_params.items()}
    sched = make_schedule(
        data, torch.arange(7), seed=0, round_=0, purpose="train", batch_size=8, steps=r_iters
    )
    omegas = []
    for i in range(7):
        theta = {k: v.clone() for k, v in w0.items()}
        omega = {k: v.clone() for k, v in w0.items()}
        for r in range(r_iters):
            x, y = data.x[sched.index[i, r]], data.y[sched.index[i, r]]
            for _ in range(s_steps):
                th = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
                logits = torch.func.functional_call(model, th, (x,))
                f = F.cross_entropy(logits, y) + lam / 2 * sum(
                    ((th[k] - omega[k]) ** 2).sum() for k in th
                )
                grads = torch.autograd.grad(f, list(th.values()))
                theta = {k: (th[k] - 0.03 * g).detach() for (k, g) in zip(th, grads, strict=True)}
            omega = {k: omega[k] - lr * c * (omega[k] - theta[k]) for k in omega}
        omegas.append(omega)
    server = out.result.server
    for k in w0:
        ref = torch.stack([o[k] for o in omegas]).mean(0)
        torch.testing.assert_close(server["ctx"]["p"][k][0], ref, rtol=1e-4, atol=1e-5)
