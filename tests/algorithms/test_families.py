"""Parametrized tests over several methods of different source modules, kept whole: split
per method they would repeat their code (every other test of tests/algorithms/ is in the
file of its method's or helper's source module)."""

from __future__ import annotations

import pytest
import torch
from helpers import PFL_SIZES as SIZES
from helpers import pfl_run as run
from toy import power_cut_at, toy_data

import fedshift as fs
from fedshift.data.federated import FederatedData, Split
from fedshift.engine.contract import flatten


@pytest.mark.parametrize(
    "algorithm, options",
    [
        ("scaffold", {}),
        ("l2sgd", {}),
        ("cfl", {"warmup_rounds": 0, "eps1": 10.0, "eps2": 0.0}),  # splits: state changes shape
        ("fedfomo", {"num_models": 2}),
    ],
)
def test_resume_after_a_crash_is_bit_identical(tmp_path, monkeypatch, algorithm, options):
    from fedshift.api import resume
    from fedshift.results.store import RunStore

    kw = dict(rounds=4, algorithm_options=options, eval_every=2)
    reference = run(algorithm, **kw)
    with power_cut_at(monkeypatch, 3), pytest.raises(RuntimeError):
        run(algorithm, db=tmp_path / "runs.db", checkpoint_every=2, **kw)
    (rec,) = RunStore(tmp_path / "runs.db").runs()
    resumed = resume(rec["run_id"], tmp_path / "runs.db", data=toy_data(SIZES))
    assert resumed.metrics == reference.metrics
    got = flatten(resumed.result.server)
    for k, v in flatten(reference.result.server).items():
        assert torch.equal(got[k], v)


@pytest.mark.parametrize("algorithm", ["fedipg", "ucfl"])
def test_batchnorm_models_run(algorithm):
    """BatchNorm running statistics are updated in place: the double back-prop of FedIPG and
    UCFL's per-user gradients must take them as inputs, not capture them."""

    g = torch.Generator().manual_seed(0)

    def part(n):
        return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    train = Split.from_clients([part(n) for n in (20, 30, 12)])
    test = {"test": Split.from_clients([part(10) for _ in range(3)])}
    data = FederatedData("tiny", 3, (1, 8, 8), train, test)
    out = fs.run(
        algorithm=algorithm,
        data=data,
        rounds=1,
        lr=0.05,
        batch_size=8,
        model="dfl-cnn",
        model_options={"channels": [4], "feature_dim": 8},
        algorithm_options={"stat_batch": 8} if algorithm == "ucfl" else {},
    )
    assert out.metrics["average"] is not None
