"""FedSDR (src/fedshift/algorithms/fedsdr.py): reductions, Alg. 2's schedule (every client's
personal model each round, K epochs of the environment classifiers), shortcut discovery's
pieces and the small-CMNIST ordering. The tests parametrized over the family (fedsdr,
fedsdr-fedavg, fedsdr-pfedme) pin the shared ``ShortcutDiscovery`` of fedsdr.py."""

from __future__ import annotations

import pytest
import torch
from helpers import INVARIANT_SETTINGS as SETTINGS
from helpers import INVARIANT_SIZES as SIZES
from helpers import invariant_experiment as experiment
from helpers import invariant_run as run
from helpers import record_training, same_clients
from toy import toy_data

import fedshift as fs
from fedshift.engine.contract import flatten
from fedshift.errors import FedshiftError


def test_fedsdr_gamma_zero_personal_models_ignore_discovery():
    a = run("fedsdr", {"gamma": 0.0, "lambda_": 0.0, "personal_epochs": 1})
    b = run("fedsdr", {"gamma": 0.0, "lambda_": 0.5, "personal_epochs": 1})
    same_clients(a, b)
    sd_a, sd_b = a.result.server["sd"]["p"], b.result.server["sd"]["p"]
    assert any(not torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


@pytest.mark.parametrize("algorithm", ["fedsdr", "fedsdr-fedavg", "fedsdr-pfedme"])
@pytest.mark.parametrize("view", ["features", "disagreement"])
def test_fedsdr_features_computed_once_train_as_features_computed_per_step(
    monkeypatch, algorithm, view
):
    """Ψ is fixed in stage 2 and while the environment classifiers train, so its outputs
    are computed once per pass (client_rows); the models must be those of the per-step
    computation up to float rounding (a different matmul shape), and moved by training."""
    from fedshift.algorithms.fedsdr import ShortcutDiscovery

    options = {"gamma": 1.0, "personal_epochs": 2, "shortcut_view": view}
    once = run(algorithm, options)
    monkeypatch.setattr(ShortcutDiscovery, "per_sample", lambda self: False)
    per_step = run(algorithm, options)
    for k, v in per_step.result.server.items():
        torch.testing.assert_close(once.result.server[k], v, rtol=1e-4, atol=1e-5, msg=k)
    torch.testing.assert_close(once.result.accuracy, per_step.result.accuracy)  # personal models
    w0 = run(algorithm, options, rounds=0).result.server
    assert not torch.allclose(once.result.server["env.weight"], w0["env.weight"])


def test_fedsdr_environment_classifiers_average_over_holders_only():
    out = run("fedsdr", {"personal_epochs": 1, "gamma": 0.1}, rounds=1)
    w0 = run("fedsdr", {"personal_epochs": 1, "gamma": 0.1}, rounds=0).result.server
    # both environments are held by some client, so both classifiers moved
    for e in range(2):
        assert not torch.equal(out.result.server["env.weight"][e], w0["env.weight"][e])


def test_fedsdr_needs_environment_ids():
    with pytest.raises(FedshiftError, match="environment ids"):
        fs.run(algorithm="fedsdr", data=toy_data(sizes=SIZES), **SETTINGS)


@pytest.mark.parametrize("algorithm", ["fedsdr", "fedsdr-fedavg", "fedsdr-pfedme"])
def test_fedsdr_every_personal_model_trains_when_only_some_clients_are_sampled(algorithm):
    options = {"personal_epochs": 1, "gamma": 0.1, "inner_steps": 1}
    if algorithm != "fedsdr-pfedme":
        options.pop("inner_steps")
    half = experiment(algorithm, options, rounds=1, participation=0.5)
    calls = record_training(half)
    init = {k: v.clone() for k, v in flatten(half.runner.store._ensure()).items()}
    half.runner.run()
    sampled = {c for p, ids, _ in calls if p.startswith("fedsdr/psi") for c in ids}
    assert len(sampled) == 2  # two of four clients upload ...
    state = flatten(half.runner.store.state)
    for c in range(len(SIZES)):  # ... yet every client's personal model moved
        assert any(not torch.equal(state[k][c], init[k][c]) for k in state), c
    # and a client outside S^t trains exactly as it would have inside it (same Ψ^t, same data)
    full = experiment(algorithm, options, rounds=1, participation=1.0)
    full.runner.run()
    for k, v in flatten(full.runner.store.state).items():
        torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6)


def test_fedsdr_environment_classifiers_train_k_epochs_per_local_iteration():
    exp = experiment(
        "fedsdr",
        {"personal_epochs": 3, "gamma": 0.1},
        rounds=1,
        local_epochs=2,
        local_steps=0,
        participation=1.0,
    )
    calls = record_training(exp)
    exp.runner.run()
    env = [e for p, _, e in calls if p.startswith("fedsdr/env")]
    psi = [e for p, _, e in calls if p.startswith("fedsdr/psi")]
    personal = [e for p, _, e in calls if p == "fedsdr/personal"]
    assert env == [3, 3] and psi == [1, 1] and personal == [3]  # R = 2 iterations, K = 3
    exp = experiment(
        "fedsdr",
        {"personal_epochs": 3, "env_epochs": 2},
        rounds=1,
        local_epochs=2,
        local_steps=0,
        participation=1.0,
    )
    calls = record_training(exp)
    exp.runner.run()
    assert [e for p, _, e in calls if p.startswith("fedsdr/env")] == [2, 2]


def test_fedsdr_written_environment_gradient_is_autograds():
    from fedshift.algorithms.fedsdr import ShortcutDiscovery as SD

    class Heads:
        env_logits = SD.env_logits
        env_risk = SD.env_risk
        env_risk_gradient = SD.env_risk_gradient

    g = torch.Generator().manual_seed(0)
    c, e, k, d, b = 2, 3, 4, 5, 11  # a cohort of two clients: the gradient is batched
    params = {
        "env.weight": torch.randn(c, e, k, d, generator=g),
        "env.bias": torch.randn(c, e, k, generator=g),
    }
    z, y = torch.randn(c, b, d, generator=g), torch.randint(0, k, (c, b), generator=g)
    w = torch.ones(c, b)
    w[0, -2:] = 0  # empty slots of a short batch
    env = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 1, 2, 2])  # client 0: env 2 only in padding
    extras = {"env": torch.stack([env, env.flip(0)])}
    heads = Heads()
    grads, loss = heads.env_risk_gradient(params, {}, extras, z, y, w)
    per_client = (0, None, 0, 0, 0, 0)
    want = torch.func.vmap(torch.func.grad(heads.env_risk), in_dims=per_client)(
        params, {}, extras, z, y, w
    )
    risk = torch.func.vmap(heads.env_risk, in_dims=per_client)(params, {}, extras, z, y, w)
    torch.testing.assert_close(loss, risk)
    for key in params:
        torch.testing.assert_close(grads[key], want[key])
    assert grads["env.weight"][0, 2].abs().max() == 0  # no real sample of environment 2
    assert grads["env.weight"][1, 2].abs().max() > 0


@pytest.mark.parametrize("hidden", [[8], [8, 6]])
@pytest.mark.parametrize("lambda_", [0.5, 1e3])  # ℓ_dis below the clamp, then above it
@pytest.mark.parametrize("estimator", ["moment", "correlation", "prediction"])
def test_fedsdr_written_objectives_are_autograds_for_the_cohort(hidden, lambda_, estimator):
    """ℓ_SD (Ψ's risk minus the clamped environment disagreement) and ℓ_SR (risk + γ·each
    estimator of Î against a fixed Ψ) differentiated by hand for a cohort of three at
    once, against autograd per client, with a short batch, away from the initialisation."""
    from fedshift.engine import local

    options = {"gamma": 3.0, "lambda_": lambda_, "mi_estimator": estimator}
    alg = experiment("fedsdr", options, model_options={"hidden": hidden}).algorithm
    assert local.written_gradient(alg.sd_loss) is not None
    assert local.written_gradient(alg.sr_risk) is not None
    g = torch.Generator().manual_seed(0)
    server = alg.init()
    sd = {**server["sd"]["p"], "env.weight": server["env.weight"], "env.bias": server["env.bias"]}
    c, b = 3, 9
    sd = {k: v + 0.3 * torch.randn(c, *v.shape, generator=g) for k, v in sd.items()}
    x = torch.randn(c, b, *alg.ctx.data.input_shape, generator=g)
    y = torch.randint(0, alg.ctx.data.num_classes, (c, b), generator=g)
    w = torch.ones(c, b)
    w[2, 5:] = 0  # a short batch
    model = {k: v for k, v in sd.items() if not k.startswith("env.")}
    psi = {"psi": torch.randn(c, b, 4, generator=g)}
    cases = [
        (alg.sd_loss_gradient, alg.sd_loss, sd, {}),
        (alg.sr_risk_gradient, alg.sr_risk, model, psi),
    ]
    for written, loss, params, extras in cases:
        dims = (0, None, 0 if extras else None, 0, 0, 0)
        grads, value = written(params, {}, extras, x, y, w)  # the whole cohort at once
        want = torch.func.vmap(torch.func.grad(loss), in_dims=dims)(params, {}, extras, x, y, w)
        torch.testing.assert_close(
            value, torch.func.vmap(loss, in_dims=dims)(params, {}, extras, x, y, w)
        )
        for name in model:  # ω_e are fixed in ℓ_SD (not trained by it)
            torch.testing.assert_close(grads[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


# the correlation estimators' L1 of normalised correlations amplifies float rounding (its
# gradient jumps where an entry changes sign): autograd alone, batched against client after
# client, differs by 8e-4 in the personal weights after 3 rounds (moment: 2e-7), so those
# are compared after one round
@pytest.mark.parametrize("estimator, rounds", [("moment", 3), ("prediction", 1)])
def test_fedsdr_written_objectives_train_as_autograd(monkeypatch, estimator, rounds):
    from fedshift.engine import local

    options = {"gamma": 3.0, "personal_epochs": 2, "mi_estimator": estimator}
    written = run("fedsdr", options, rounds=rounds)
    monkeypatch.setattr(local, "written_gradient", lambda loss: None)
    autograd = run("fedsdr", options, rounds=rounds)
    got = flatten(written.result.server)
    for name, v in flatten(autograd.result.server).items():
        torch.testing.assert_close(got[name], v, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(written.result.accuracy, autograd.result.accuracy)


def _cmnist_available() -> bool:
    import os
    from pathlib import Path

    root = Path(os.environ.get("FEDSHIFT_DATA", ""))
    return (root / "mnist").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _cmnist_available(), reason="needs MNIST under $FEDSHIFT_DATA")
def test_fedsdr_worst_case_above_fedavg_on_small_cmnist():
    """Reduced-scale ordering of thesis Table 4.2 with a model that reads the digit: FedSDR's
    worst case ≫ FedAvg's (the colour model), its accuracy flat over p_te and above the
    50 % of a constant predictor (which this test must reject: on a binary task a constant
    scores ≈ 50 % everywhere, above any colour model's worst case). At this scale the thesis's
    moment estimator has no working γ (seed 0, 5 rounds: γ ≤ 0.03 keeps the colour, worst
    ≤ 11; 0.05 gives 35 / 53 still tilted; γ ≥ 0.1 is a constant), so this uses the
    ``prediction`` estimator (ours, docs/methods/invariant.md): 53.1 / 55.6 at seed 0."""
    common = dict(
        scenario="cmnist",
        scenario_options={"samples": 4000, "test_samples": 2000},
        rounds=5,
        lr=0.05,
        batch_size=128,
    )
    avg = fs.run(algorithm="fedavg", **common)
    options = {"gamma": 1.0, "personal_epochs": 2, "mi_estimator": "prediction"}
    sdr = fs.run(algorithm="fedsdr", algorithm_options=options, **common)
    m = sdr.metrics
    assert not m["degenerate"], m["degenerate_why"]
    assert m["worst"] >= avg.metrics["worst"] + 25
    assert m["average"] >= 54.0  # reads the digit, not a constant
    per_env = list(m["per_env"].values())
    assert max(per_env) - min(per_env) <= 10.0  # flat over p_te: not reading the colour


@pytest.mark.parametrize("algorithm", ["fedsdr", "fedsdr-fedavg", "fedsdr-pfedme"])
def test_fedsdr_records_stage_one_clamp_every_round(algorithm):
    """Each round's record carries λ·ℓ_dis of the participants' final stage-1 models (median)
    and the share of them below α_th, so a run shows when −min(α_th, λ·ℓ_dis) passes no
    gradient. With α_th = 0 the clamp passes nothing: λ then leaves training unchanged and
    the recorded value is exactly λ times ℓ_dis."""
    one = run(algorithm, {"alpha_th": 0.0, "lambda_": 1.0, "personal_epochs": 1})
    two = run(algorithm, {"alpha_th": 0.0, "lambda_": 2.0, "personal_epochs": 1})
    for a, b in zip(one.result.rounds, two.result.rounds, strict=True):
        assert a.extras["lambda_dis"] > 0.0 and a.extras["clamp_open"] == 0.0
        assert b.extras["lambda_dis"] == 2 * a.extras["lambda_dis"]
    wide = run(algorithm, {"alpha_th": 1e9, "personal_epochs": 1})
    assert [r.extras["clamp_open"] for r in wide.result.rounds] == [100.0] * len(wide.result.rounds)
