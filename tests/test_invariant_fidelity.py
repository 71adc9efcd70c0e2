"""The invariant methods do what their algorithm boxes say (issue 18's departures): FedSDR
trains every client's personal model each round and its environment classifiers for K
epochs."""

from __future__ import annotations

import pytest
import torch
from test_invariant_methods import SETTINGS, SIZES, env_toy

from fedshift.api import make_config
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

    exp.ctx.train = recording
    return calls


# ---- FedSDR: Alg. 2 line 4 (every client) and line 12 (K epochs) ---------------------------


@pytest.mark.parametrize("algorithm", ["fedsdr", "fedsdr-fedavg", "fedsdr-pfedme"])
def test_fedsdr_every_personal_model_trains_when_only_some_clients_are_sampled(algorithm):
    options = {"personal_epochs": 1, "gamma": 0.1, "inner_steps": 1}
    if algorithm != "fedsdr-pfedme":
        options.pop("inner_steps")
    half = experiment(algorithm, options, rounds=1, participation=0.5)
    calls = record_training(half)
    init = {k: v.clone() for k, v in half.runner.store._ensure().items()}
    half.runner.run()
    sampled = {c for p, ids, _ in calls if p.startswith("fedsdr/psi") for c in ids}
    assert len(sampled) == 2  # two of four clients upload ...
    state = half.runner.store.state
    for c in range(len(SIZES)):  # ... yet every client's personal model moved
        assert any(not torch.equal(state[k][c], init[k][c]) for k in state), c
    # and a client outside S^t trains exactly as it would have inside it (same Ψ^t, same data)
    full = experiment(algorithm, options, rounds=1, participation=1.0)
    full.runner.run()
    for k, v in full.runner.store.state.items():
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
