"""The invariant methods do what their algorithm boxes say (issue 18's departures): FedSDR
trains every client's personal model each round and its environment classifiers for K
epochs; FedSR keeps r_μ, r_σ and C on each client; FedPIN, FedSDR+pFedMe and FedSR average
uniformly; PerInvFL's IRMv1 terms see the client's whole training set."""

from __future__ import annotations

import pytest
import torch
from test_invariant_methods import SETTINGS, SIZES, env_toy, run
from toy import toy_data

from fedshift.algorithms.base import RoundInfo
from fedshift.api import make_config
from fedshift.engine.tree import flatten, stack, unflatten
from fedshift.experiment import build_experiment


def experiment(algorithm, options=None, data=None, **kw):
    cfg = make_config(algorithm=algorithm, algorithm_options=options or {}, **{**SETTINGS, **kw})
    return build_experiment(cfg, data=data if data is not None else env_toy())


def record_training(exp) -> list[tuple[str, list[int], int | None]]:
    """Wrap ctx.train to record (purpose, client ids, epochs) of every call."""
    calls, train = [], exp.ctx.train

    def recording(loss_fn, params, buffers, cohort, purpose="train", **kw):
        calls.append((purpose, cohort.ids.tolist(), kw.get("epochs")))
        return train(loss_fn, params, buffers, cohort, purpose, **kw)

    object.__setattr__(exp.ctx, "train", recording)  # a spy on the frozen context
    return calls


# ---- FedSDR: Alg. 2 line 4 (every client) and line 12 (K epochs) ---------------------------


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


# ---- FedSR: r_μ, r_σ, C stay on the client ---------------------------------------------------


def test_fedsr_reference_distributions_and_scale_stay_per_client():
    exp = experiment("fedsr", rounds=2, participation=0.5, data=toy_data(sizes=SIZES))
    exp.runner.run()
    server, state = exp.runner.server, exp.runner.store.state
    assert not any("ref_" in k or "scale" in k for k in server["p"])
    assert set(state) == {"p"}  # client state: {"p": {r_μ, r_σ, C}}
    state = state["p"]
    assert set(state) == {"fedsr.ref_mu", "fedsr.ref_sigma", "fedsr.scale"}
    k, d = exp.ctx.data.num_classes, exp.ctx.model.feature_dim
    assert state["fedsr.ref_mu"].shape == (len(SIZES), k, d)
    moved = [not torch.equal(state["fedsr.ref_mu"][c], torch.zeros(k, d)) for c in range(4)]
    assert 0 < sum(moved) <= 4  # clients that trained moved theirs ...
    trained = [c for c in range(4) if moved[c]]
    if len(trained) > 1:  # ... each to its own values
        a, b = trained[:2]
        assert not torch.equal(state["fedsr.ref_mu"][a], state["fedsr.ref_mu"][b])
    for c in range(4):
        if not moved[c]:  # never sampled: still the authors' initialisation
            torch.testing.assert_close(state["fedsr.scale"][c], torch.ones(()))


# ---- uniform averaging (the boxes' 1/|S^t| Σ) ----------------------------------------------


def uniform_check(exp, keys, aggregate):
    """``keys``: flattened names (``"sd/p/fc1.weight"``) of the entries averaged uniformly."""
    server = flatten(exp.runner.server)
    weights = torch.tensor([1.0, 9.0])  # very unequal n_u must not matter
    uploads = unflatten({k: torch.stack([server[k] + 1.0, server[k] + 3.0]) for k in keys})
    info = RoundInfo(torch.tensor([0, 1]), weights, 0)
    out = flatten(aggregate(exp.runner.server, uploads, info))
    for k in keys:
        torch.testing.assert_close(out[k], server[k] + 2.0)


def test_fedpin_averages_the_global_models_uniformly():
    exp = experiment("fedpin")
    server = flatten(exp.runner.server)
    shared = [k for k in server if not k.startswith("aux.client")]
    keys = [k for k in shared if server[k].is_floating_point()]

    def aggregate(server, uploads, info):
        rows = {k: server[k][info.ids] for k in ("aux.client_weight", "aux.client_bias")}
        return exp.runner.alg.aggregate(server, {**uploads, **rows}, info)

    uniform_check(exp, keys, aggregate)


def test_fedsdr_pfedme_averages_the_global_model_uniformly():
    exp = experiment("fedsdr-pfedme", {"inner_steps": 1})
    server = flatten(exp.runner.server)
    keys = [k for k in server if k.startswith(("p/", "sd/p/"))]
    rest = {k: v for k, v in server.items() if k.startswith(("env.", "sd/b/", "b/"))}

    def aggregate(server, uploads, info):
        uploads = unflatten({**flatten(uploads), **stack(rest, 2)})
        return exp.runner.alg.aggregate(server, uploads, info)

    uniform_check(exp, keys, aggregate)


def test_fedsr_averages_uniformly():
    exp = experiment("fedsr", data=toy_data(sizes=SIZES))
    params = exp.runner.server["p"]  # Φ, A and ω
    uploads = {"p": {k: torch.stack([v + 1.0, v + 3.0]) for k, v in params.items()}}
    weights = torch.tensor([1.0, 9.0])  # very unequal n_u must not matter
    info = RoundInfo(torch.tensor([0, 1]), weights, 0)
    out = exp.runner.alg.aggregate(exp.runner.server, uploads, info)
    for k, v in params.items():
        torch.testing.assert_close(out["p"][k], v + 2.0)


# ---- PerInvFL: L_INV on the client's training set (Alg. 1 lines 8-9) -----------------------


def test_perinvfl_penalty_sees_the_whole_client_training_set():
    options = {"anneal_rounds": 1, "irm_lambda": 10.0, "personal_steps": 2}
    a = run("perinvfl", options, batch_size=4)
    b = run("perinvfl", options, batch_size=64)
    for k, v in a.result.server.items():  # the run's batch size does not enter
        torch.testing.assert_close(b.result.server[k], v)
    c = flatten(run("perinvfl", {**options, "batch": "minibatch"}, batch_size=4).result.server)
    assert any(not torch.equal(c[k], v) for k, v in flatten(a.result.server).items())
    exp = experiment("perinvfl", options, rounds=1)
    calls = record_training(exp)
    exp.runner.run()
    assert len(calls) == 1  # one call: R = local_steps full-batch iterations


# ---- FedPIN: the estimate of I(E,U;Y|Φ_g) ----------------------------------------------------


def fedpin_global_value(options, scale: float) -> tuple[float, float]:
    """FedPIN's global objective on client 0's first 16 rows (inputs × ``scale``) and the
    risk R_g of (Φ_g, ω_g) on them."""
    from fedshift.algorithms.common.global_model import split_state
    from fedshift.algorithms.common.losses import cross_entropy

    exp = experiment("fedpin", options)
    alg, server = exp.runner.alg, exp.runner.server
    params, buffers = split_state(server)
    aux = {k: server[k] for k in ("aux.weight", "aux.bias")}
    aux |= {k: server[k][0] for k in ("aux.client_weight", "aux.client_bias")}
    rows = slice(0, 16)
    x, y = exp.ctx.data.train.x[rows] * scale, exp.ctx.data.train.y[rows]
    w = torch.ones(len(y))
    value = alg.global_loss({**params, **aux}, buffers, {"alpha": torch.tensor(100.0)}, x, y, w)
    risk = cross_entropy(exp.ctx.forward(params, buffers, x), y, w)
    return float(value), float(risk)


def test_fedpin_aux_fit_from_the_head_never_rewards_raising_the_aux_risk():
    """The exact ω_a = argmin holds ω_g in its class, so (1+α)R_g − αR_a ≥ R_g. Fitted from
    ω_g's head in steps of 1/L the estimate keeps that property even on large features;
    fitted from ω_a's own weights with a fixed step it does not (the objective falls below
    the risk: Φ_g is paid to raise R_a, the blow-up seen on Arjovsky's CMNIST)."""
    head = {"aux_init": "head", "aux_steps": 10}
    for scale in (1.0, 50.0):
        value, risk = fedpin_global_value(head, scale)
        assert value >= risk - 1e-5, (scale, value, risk)
    value, risk = fedpin_global_value({"aux_steps": 10, "aux_lr": 1.0}, 50.0)
    assert value < risk - 1.0
    with pytest.raises(Exception, match="aux_steps >= 1"):
        experiment("fedpin", {"aux_init": "head"})
