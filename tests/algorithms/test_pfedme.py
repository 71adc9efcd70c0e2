"""pFedMe (src/fedshift/algorithms/pfedme.py): zero inner steps, one step of the update rule by
hand, and every client trained each round (issue 19)."""

from __future__ import annotations

import pytest
import torch
from helpers import INVARIANT_SETTINGS as SETTINGS
from helpers import INVARIANT_SIZES as SIZES
from helpers import PFL_SETTINGS
from helpers import invariant_run as run
from toy import toy_data

from fedshift.algorithms.pfedme import PFedMe, PFedMeHyper
from fedshift.api import make_config
from fedshift.engine.contract import flatten
from fedshift.experiment import build_experiment


def test_pfedme_zero_inner_steps_keeps_the_global_model():
    init = run("pfedme", {"inner_steps": 2}, rounds=0).result.server
    out = run("pfedme", {"inner_steps": 0}).result.server
    for k, v in init.items():
        torch.testing.assert_close(out[k], v)


@pytest.mark.parametrize("written", [True, False])
def test_pfedme_step_matches_algorithm_by_hand(monkeypatch, written):
    """One step of pFedMe's update rule = K personal steps, then w ← w − ηλ(w − θ̃); with
    the MLP risk's gradient written out (the default for an MLP) and with autograd."""
    if not written:
        monkeypatch.setattr(PFedMe, "inner_gradient", lambda self: None)
    exp = build_experiment(
        make_config(algorithm="pfedme", **{**SETTINGS, "lr": 0.05}),
        data=toy_data(sizes=SIZES),
    )
    ctx = exp.ctx
    hp = PFedMeHyper(lambda_=4.0, inner_steps=3, personal_lr=0.2)
    alg = PFedMe(hp, ctx)
    assert (alg.inner_gradient() is not None) == written
    g = torch.Generator().manual_seed(1)
    w = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in ctx.initial_params.items()}
    theta = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    x, y = ctx.data.train.x[:6], ctx.data.train.y[:6]
    ones = torch.ones(6)
    params = {**w, "pm": theta}
    new, _ = alg.local_step(params, {}, {}, x, y, ones)
    new = flatten(new)
    # by hand
    t = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
    for _ in range(3):
        risk = torch.nn.functional.cross_entropy(ctx.forward(t, {}, x), y)
        prox = sum(((t[k] - w[k]) ** 2).sum() for k in w)
        gr = torch.autograd.grad(risk + 2.0 * prox, list(t.values()))
        steps = zip(t.items(), gr, strict=True)
        t = {k: (v - 0.2 * gk).detach().requires_grad_(True) for (k, v), gk in steps}
    for k in w:
        torch.testing.assert_close(new[f"pm/{k}"], t[k].detach(), rtol=1e-5, atol=1e-6)
        hand_w = w[k] - 0.05 * 4.0 * (w[k] - t[k].detach())
        torch.testing.assert_close(new[k], hand_w, rtol=1e-5, atol=1e-6)


def test_pfedme_trains_every_client_but_only_sampled_ones_upload():
    """The authors' server trains every user each round and averages the sampled ones:
    under partial participation an unsampled client's θ_i is trained from the latest w,
    while the server model depends on the sampled clients only."""
    from fedshift.api import make_config
    from fedshift.engine.sampling import sample_clients
    from fedshift.experiment import build_experiment

    cfg = make_config(algorithm="pfedme", clients_per_round=2, **{**PFL_SETTINGS, "rounds": 1})
    exp = build_experiment(cfg, data=toy_data())
    runner = exp.runner
    runner.run()
    sampled = set(sample_clients(exp.data.num_clients, runner.k, exp.ctx.seed, 0).tolist())
    state = runner.store.state
    init = exp.ctx.initial_params
    for i in set(range(exp.data.num_clients)) - sampled:
        assert any(not torch.equal(state["p"][k][i].cpu(), v.cpu()) for k, v in init.items())


@pytest.mark.parametrize("hidden", [[8], [16, 8]])
def test_pfedme_cohort_step_is_the_per_client_step(hidden):
    """For an MLP the engine runs pFedMe's update rule for the whole cohort at once
    (``cohort_step``, a batched update rule: no vmap; its K inner steps fuse each weight's
    gradient into the update, ``MLPChain.prox_descent``): each client's new values and loss
    equal ``local_step`` (``prox_solve`` with the written gradient) on that client alone,
    at one and two hidden layers."""
    settings = {**SETTINGS, "lr": 0.05, "model_options": {"hidden": hidden}}
    exp = build_experiment(make_config(algorithm="pfedme", **settings), data=toy_data(sizes=SIZES))
    ctx = exp.ctx
    alg = PFedMe(PFedMeHyper(lambda_=4.0, inner_steps=3, personal_lr=0.2), ctx)
    g = torch.Generator().manual_seed(2)
    c, b = 3, 6
    w = {k: v + 0.1 * torch.randn(c, *v.shape, generator=g) for k, v in ctx.initial_params.items()}
    theta = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    x = ctx.data.train.x[: c * b].view(c, b, *ctx.data.input_shape)
    y = ctx.data.train.y[: c * b].view(c, b)
    mask = torch.ones(c, b)
    mask[2, 4:] = 0  # a short batch
    before = {k: v.clone() for k, v in flatten({**w, "pm": theta}).items()}
    new, loss = alg.cohort_step({**w, "pm": theta}, {}, {}, x, y, mask)
    assert loss.shape == (c,)
    for k, v in flatten({**w, "pm": theta}).items():  # the inputs are left as they were
        assert torch.equal(v, before[k]), k
    for i in range(c):
        one = {**{k: v[i] for k, v in w.items()}, "pm": {k: v[i] for k, v in theta.items()}}
        want, want_loss = alg.local_step(one, {}, {}, x[i], y[i], mask[i])
        torch.testing.assert_close(loss[i], want_loss)
        for k, v in flatten(want).items():
            torch.testing.assert_close(flatten(new)[k][i], v, msg=k)


@pytest.mark.parametrize("execution", ["batched", "sequential"])
def test_pfedme_trains_the_same_through_the_cohort_step(monkeypatch, execution):
    """A run through the batched rule gives the numbers of the vmapped per-client rule."""
    settings = {**SETTINGS, "rounds": 2, "execution": execution}
    cohort = run("pfedme", {"inner_steps": 2}, **settings)
    monkeypatch.setattr(PFedMe, "cohort_step", PFedMe.local_step)
    per_client = run("pfedme", {"inner_steps": 2}, **settings)
    for k, v in flatten(per_client.result.server).items():
        torch.testing.assert_close(flatten(cohort.result.server)[k], v, msg=k)
    torch.testing.assert_close(cohort.result.accuracy, per_client.result.accuracy)


def test_pfedme_warns_when_its_step_overshoots_the_personal_model():
    """lr·λ > 2 moves w further from θ̃ than it was (|1 − lr·λ| > 1): warned, named as
    pFedMe's step, not an SGD lr; lr·λ ≤ 2 is silent."""
    import warnings

    from fedshift.errors import FedshiftWarning

    exp = build_experiment(
        make_config(algorithm="pfedme", **{**SETTINGS, "lr": 0.3}), data=toy_data(sizes=SIZES)
    )
    with pytest.warns(FedshiftWarning, match=r"pfedme: lr × λ = 4.5 > 2"):
        PFedMe(PFedMeHyper(lambda_=15.0), exp.ctx)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PFedMe(PFedMeHyper(lambda_=6.0), exp.ctx)  # lr·λ = 1.8
