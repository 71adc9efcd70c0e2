"""Builders shared by the method tests of tests/algorithms/ (one file per source module of
src/fedshift/algorithms/): each family of methods keeps the small problem and settings
its tests were written against."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.base import RoundInfo
from fedshift.api import make_config
from fedshift.data.federated import FederatedData, Split
from fedshift.engine.tree import flatten, unflatten
from fedshift.experiment import build_experiment

# ---- personalized and invariant baselines: Ditto, FedRep, FedRoD, FedPAC, DRFA, FedSR,
# FedIIR, IRM†-FT, IRM†-L2 (run to completion, then inspected) ------------------------------

BASELINE_SETTINGS = dict(
    lr=0.1, batch_size=16, local_epochs=1, rounds=2, model_options={"hidden": [16]}
)


def baseline_experiment(algorithm, **kw):
    data = toy_data()
    cfg = make_config(algorithm=algorithm, scenario=data.name, **{**BASELINE_SETTINGS, **kw})
    exp = build_experiment(cfg, data=data)
    return exp, exp.runner.run()


def client_state(exp):
    return exp.runner.store.state or {}


def assert_trees_close(a, b, **tol):
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], **tol)


# ---- invariant personalized methods: FedPIN, FedSDR (+FedAvg, +pFedMe), PerInvFL, pFedMe,
# FedSR, on clients that each hold one of two training environments ---------------------------

INVARIANT_SETTINGS = dict(
    lr=0.1, batch_size=8, local_steps=3, rounds=2, model_options={"hidden": [8]}
)
INVARIANT_SIZES = (5, 17, 30, 9)


def env_toy() -> FederatedData:
    """toy data whose clients hold one of two training environments (even/odd client)."""
    d = toy_data(sizes=INVARIANT_SIZES)
    sizes = d.train.sizes()
    env = torch.repeat_interleave(torch.arange(len(INVARIANT_SIZES)) % 2, sizes)
    d.train = Split(d.train.x, d.train.y, d.train.offsets, env)
    d.train_env_names = ["even", "odd"]
    return d


def invariant_run(algorithm, options=None, **kw):
    return fs.run(
        algorithm=algorithm,
        data=env_toy(),
        algorithm_options=options or {},
        **{**INVARIANT_SETTINGS, **kw},
    )


def same_clients(a, b):
    assert a.metrics["per_client"] == pytest.approx(b.metrics["per_client"], abs=1e-9)


def invariant_experiment(algorithm, options=None, data=None, **kw):
    cfg = make_config(
        algorithm=algorithm, algorithm_options=options or {}, **{**INVARIANT_SETTINGS, **kw}
    )
    return build_experiment(cfg, data=data if data is not None else env_toy())


def record_training(exp) -> list[tuple[str, list[int], int | None]]:
    """Wrap ctx.train to record (purpose, client ids, epochs) of every call."""
    calls, train = [], exp.ctx.train

    def recording(loss_fn, params, buffers, cohort, purpose="train", **kw):
        calls.append((purpose, cohort.ids.tolist(), kw.get("epochs")))
        return train(loss_fn, params, buffers, cohort, purpose, **kw)

    object.__setattr__(exp.ctx, "train", recording)  # a spy on the frozen context
    return calls


def uniform_check(exp, keys, aggregate):
    """``keys``: flattened names (``"sd/p/fc1.weight"``) of the entries averaged uniformly."""
    server = flatten(exp.runner.server)
    weights = torch.tensor([1.0, 9.0])  # very unequal n_u must not matter
    uploads = unflatten({k: torch.stack([server[k] + 1.0, server[k] + 3.0]) for k in keys})
    info = RoundInfo(torch.tensor([0, 1]), weights, 0)
    out = flatten(aggregate(exp.runner.server, uploads, info))
    for k in keys:
        torch.testing.assert_close(out[k], server[k] + 2.0)


# ---- personalized / clustered baselines of issue 6 and the personalization methods'
# fidelity tests of issue 19 (SCAFFOLD, APFL, Per-FedAvg, L2SGD, IFCA, FedBN, CFL, FedFomo,
# pFedMe, FedPAC) ----------------------------------------------------------------------------

PFL_SIZES = (5, 37, 60, 24, 9)
PFL_SETTINGS = dict(lr=0.1, batch_size=8, local_epochs=1, rounds=2, model_options={"hidden": [8]})


def pfl_run(algorithm, data=None, **kw):
    return fs.run(algorithm=algorithm, data=data or toy_data(PFL_SIZES), **{**PFL_SETTINGS, **kw})


# ---- seed methods of issue 6: CGPFL, UCFL, FedIPG, DFL ---------------------------------------

SEED_SETTINGS = dict(lr=0.05, batch_size=8, local_epochs=1, rounds=2, model_options={"hidden": [8]})
SEED_FAST = {
    "cgpfl": {"local_iterations": 2, "inner_steps": 2},
    "cgpfl-heur": {"local_iterations": 2, "inner_steps": 2},
    "ucfl": {},
    "fedipg": {"lambda_": 0.01},
    "dfl": {"donors": 2},
}


SEED_STEPS = {"dfl": 4, "fedipg": 4}  # fixed local steps keep the double back-prop tests quick


def seed_run(algorithm, **kw):
    opts = {**SEED_FAST[algorithm], **kw.pop("algorithm_options", {})}
    if algorithm in SEED_STEPS and "local_steps" not in kw:
        kw["local_steps"] = SEED_STEPS[algorithm]
    return fs.run(
        algorithm=algorithm, data=toy_data(), algorithm_options=opts, **{**SEED_SETTINGS, **kw}
    )


def seed_experiment(algorithm, cohort_size=0, **opts):
    cfg = make_config(
        algorithm=algorithm, algorithm_options=opts, cohort_size=cohort_size, **SEED_SETTINGS
    )
    return build_experiment(cfg, data=toy_data())


# ---- OOD baselines: IRM†, GroupDRO ----------------------------------------------------------

OOD_SETTINGS = dict(lr=0.1, batch_size=8, local_epochs=2, rounds=3, model_options={"hidden": [16]})


def ood_run(algorithm, **kw):
    return fs.run(algorithm=algorithm, data=toy_data(), **{**OOD_SETTINGS, **kw})


# ---- the IRM external anchor (issue 18): FedOpt's server Adam, two equal clients ------------

ADAM = dict(server_opt="adam", server_beta2=0.999, server_tau=1e-8, server_bias_correction=True)


def two_equal_clients():
    return toy_data(sizes=(40, 40), dim=6, classes=2, seed=1)
