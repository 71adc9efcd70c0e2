"""Personalized / clustered baselines of issue 6: SCAFFOLD, APFL, Per-FedAvg (HF), L2SGD,
IFCA, FedBN, CFL, FedFomo — hand-computed cases, reductions, cohort invariance."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.base import RoundInfo
from fedshift.algorithms.cfl import bipartition, should_split
from fedshift.algorithms.perfedavg import hvp
from fedshift.api import make_config
from fedshift.data.federated import FederatedData, Split
from fedshift.engine.contract import flatten
from fedshift.experiment import build_experiment
from fedshift.models.layers import batchnorm_keys

SIZES = (5, 37, 60, 24, 9)
SETTINGS = dict(lr=0.1, batch_size=8, local_epochs=1, rounds=2, model_options={"hidden": [8]})
BN_MODEL = dict(model="dfl-cnn", model_options={"channels": [2], "feature_dim": 4})


def run(algorithm, data=None, **kw):
    return fs.run(algorithm=algorithm, data=data or toy_data(SIZES), **{**SETTINGS, **kw})


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


def test_ifca_picks_the_cluster_with_lowest_loss():
    same = torch.zeros(4, 2)
    parts = [(same, torch.zeros(4, dtype=torch.long)), (same, torch.ones(4, dtype=torch.long))]
    split = Split.from_clients(parts * 2)  # clients 0, 2 all class 0; clients 1, 3 class 1
    data = FederatedData("c", 2, (2,), split, {"test": split}, default_model="mlr")
    exp = build_experiment(make_config(algorithm="ifca", model="mlr", rounds=1), data=data)
    alg = exp.algorithm
    server = alg.init()
    server["p"]["head.weight"] = torch.zeros(4, 2, 2)
    server["p"]["head.bias"] = torch.tensor([[0.0, 3.0], [3.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    chosen = alg.choose(server, exp.ctx.cohort(torch.arange(4), 0))
    # class-0 clients: model 1 (bias 3 on class 0); class-1 clients: model 0
    assert chosen.tolist() == [1, 0, 1, 0]


def test_ifca_one_cluster_is_fedavg_and_logs_assignments():
    a, b = run("ifca", algorithm_options={"num_clusters": 1}), run("fedavg")
    clusters = flatten(a.result.server)
    for k, v in flatten(b.result.server).items():
        torch.testing.assert_close(clusters[k][0], v)
    assert a.result.rounds[0].extras["cluster"] == [0] * len(SIZES)


def test_cfl_split_criterion_and_bipartition():
    g = torch.Generator().manual_seed(0)
    up = torch.tensor([3.0, 0.0, 0.0, 0.0])
    noise = 0.1 * torch.randn(6, 4, generator=g)
    updates = torch.cat([up.expand(3, 4), -up.expand(3, 4)]) + noise
    labels = bipartition(updates)
    assert len(set(labels[:3].tolist())) == 1 and len(set(labels[3:].tolist())) == 1
    assert labels[0] != labels[3]
    mean_norm, max_norm = float(updates.mean(0).norm()), float(updates.norm(dim=1).max())
    assert should_split(mean_norm, max_norm, eps1=0.4, eps2=1.6)
    assert not should_split(mean_norm, max_norm, eps1=0.4, eps2=5.0)  # nobody moves enough
    assert not should_split(float(updates[:3].mean(0).norm()), max_norm, 0.4, 1.6)  # agree


def test_cfl_aggregate_splits_opposed_clients_and_updates_each_cluster():
    sizes = (10, 10, 10, 10, 10, 10)
    exp = build_experiment(
        make_config(algorithm="cfl", rounds=1, model="mlr", algorithm_options={"warmup_rounds": 0}),
        data=toy_data(sizes, dim=2, classes=2),
    )
    alg, server = exp.algorithm, exp.algorithm.init()
    sign = torch.tensor([1.0, 1, 1, -1, -1, -1]).view(6, 1, 1)
    d = {"d": {"head.weight": sign * torch.tensor([[2.0, 0.0], [0.0, 0.0]]).expand(6, 2, 2)}}
    d["d"]["head.bias"] = torch.zeros(6, 2)
    info = RoundInfo(torch.arange(6), torch.full((6,), 10.0), 0)
    new = alg.aggregate(server, d, info)
    assert new["cluster"].tolist() in ([0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0])
    w0 = server["m"]["p"]["head.weight"][0]
    got = new["m"]["p"]["head.weight"][new["cluster"][0]] - w0
    torch.testing.assert_close(got, torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    assert info.log["clusters"] == 2


def test_apfl_alpha_zero_is_fedavg_and_alpha_one_is_local():
    zero, fedavg = run("apfl", algorithm_options={"alpha": 0.0}), run("fedavg")
    assert zero.metrics["per_client"] == pytest.approx(fedavg.metrics["per_client"], abs=1e-9)
    for k, v in fedavg.result.server.items():
        torch.testing.assert_close(zero.result.server[k], v)
    one, local = run("apfl", algorithm_options={"alpha": 1.0}), run("local")
    assert one.metrics["per_client"] == pytest.approx(local.metrics["per_client"], abs=1e-9)


def test_apfl_adaptive_alpha_moves_and_stays_in_unit_interval():
    exp = build_experiment(
        make_config(algorithm="apfl", algorithm_options={"adaptive": True}, **SETTINGS),
        data=toy_data(SIZES),
    )
    exp.runner.run()
    alpha = exp.runner.store.state["alpha"]
    assert ((alpha >= 0) & (alpha <= 1)).all() and (alpha != 0.25).any()


def test_perfedavg_hvp_matches_autograd():
    torch.manual_seed(0)
    x, y = torch.randn(7, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0, 2, 2])
    params = {"w": torch.randn(3, 3, dtype=torch.float64), "b": torch.randn(3, dtype=torch.float64)}
    vec = {"w": torch.randn(3, 3, dtype=torch.float64), "b": torch.randn(3, dtype=torch.float64)}

    def f(p):
        return torch.nn.functional.cross_entropy(torch.tanh(x @ p["w"]) + p["b"], y)

    got = hvp(f, params, vec)
    _, ref = torch.autograd.functional.hvp(
        lambda w, b: f({"w": w, "b": b}), (params["w"], params["b"]), (vec["w"], vec["b"])
    )
    torch.testing.assert_close(got["w"], ref[0])
    torch.testing.assert_close(got["b"], ref[1])


def test_perfedavg_finite_difference_approaches_exact_hvp():
    exact = run("perfedavg", algorithm_options={"alpha": 0.05})
    diff = run("perfedavg", algorithm_options={"alpha": 0.05, "hessian": "difference"})
    for k, v in exact.result.server.items():
        torch.testing.assert_close(diff.result.server[k], v, atol=1e-4, rtol=1e-4)


def test_fedbn_keeps_batchnorm_local():
    data = toy_data(SIZES, dim=16)
    exp = build_experiment(make_config(algorithm="fedbn", **{**SETTINGS, **BN_MODEL}), data=data)
    result = exp.runner.run()
    bn = batchnorm_keys(exp.ctx.model)
    assert bn and not any(k in bn for part in result.server.values() for k in part)
    local = exp.runner.store.state  # {"p": BN γ, β, "b": BN statistics}
    assert {k for part in local.values() for k in part} == bn
    mean = local["b"]["extractor.bn1.running_mean"]
    assert not torch.allclose(mean[0], mean[1])  # each client its own statistics


def test_fedbn_statistics_only_averages_gamma_beta_and_keeps_statistics_local():
    data = toy_data(SIZES, dim=16)
    opts = {**SETTINGS, **BN_MODEL, "algorithm_options": {"local": "statistics"}}
    exp = build_experiment(make_config(algorithm="fedbn", **opts), data=data)
    result = exp.runner.run()
    stats = {k for k in batchnorm_keys(exp.ctx.model) if k in exp.ctx.initial_buffers}
    assert "extractor.bn1.weight" in result.server["p"]  # γ is averaged with the weights
    assert not any(k in stats for part in result.server.values() for k in part)
    local = exp.runner.store.state
    assert {k for part in local.values() for k in part} == stats
    mean = local["b"]["extractor.bn1.running_mean"]
    assert not torch.allclose(mean[0], mean[1])


def test_fedbn_without_batchnorm_is_fedavg_with_a_warning():
    with pytest.warns(UserWarning, match="no BatchNorm"):
        a = run("fedbn")
    b = run("fedavg")
    assert a.metrics["per_client"] == pytest.approx(b.metrics["per_client"], abs=1e-9)
    for k, v in b.result.server.items():
        torch.testing.assert_close(a.result.server[k], v)


def test_fedbn_with_batchnorm_does_not_depend_on_the_cohort_width():
    """FedBN on a model that has BatchNorm layers (the registry-wide test in
    algorithms/test_all_algorithms.py runs an MLP, where FedBN is FedAvg): widths 1 and all
    give the same server state, per-client accuracies and round extras."""
    data = toy_data(SIZES, dim=16)
    data.train.env = torch.cat([torch.full((n,), i % 2) for i, n in enumerate(SIZES)])
    outs = [run("fedbn", data=data, cohort_size=c, **BN_MODEL) for c in (1, 0)]
    assert outs[1].metrics["per_client"] == pytest.approx(outs[0].metrics["per_client"], abs=1e-9)
    for k, v in outs[0].result.server.items():
        torch.testing.assert_close(outs[1].result.server[k], v, rtol=1e-5, atol=1e-6)
    extras = outs[1].result.rounds[-1].extras
    for k, v in outs[0].result.rounds[-1].extras.items():
        assert extras[k] == pytest.approx(v, rel=1e-4)


def test_l2sgd_averaging_steps_and_step_size_check():
    from fedshift.algorithms.l2sgd import pull
    from fedshift.errors import FedshiftError

    x, mean = {"w": torch.tensor([4.0, 0.0])}, {"w": torch.tensor([1.0, 1.0])}
    # two averaging steps with θ = 0.5 keep (1 − θ)² = 1/4 of the distance to the mean
    torch.testing.assert_close(pull(x, mean, torch.tensor(0.25))["w"], torch.tensor([1.75, 0.75]))
    out = run("l2sgd", algorithm_options={"lambda_": 0.5, "p": 0.2})
    theta = 0.1 * 0.5 * 0.8 / 0.2
    steps = out.result.rounds[-1].extras["averaging_steps"]
    assert out.result.server["keep"].item() == pytest.approx((1 - theta) ** steps)
    with pytest.raises(FedshiftError, match="exceeds 1"):
        run("l2sgd", algorithm_options={"lambda_": 100.0, "p": 0.1})


def test_fedfomo_weights_by_hand():
    from fedshift.algorithms.fedfomo import fomo_weights

    own = torch.tensor([1.0, 2.0])
    other = torch.tensor([[0.5, 1.5], [2.0, 1.0]])
    dist = torch.tensor([[0.5, 0.0], [2.0, 4.0]])
    expected = torch.tensor([[1.0, 0.0], [0.0, 0.25]])  # (1 − 0.5)/0.5; equal model → 0
    torch.testing.assert_close(fomo_weights(own, other, dist), expected)


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
    from fedshift.engine.runner import Runner
    from fedshift.results.store import RunStore

    kw = dict(rounds=4, algorithm_options=options, eval_every=2)
    reference = run(algorithm, **kw)
    original = Runner.train_round

    def crash_in_round_3(self, r):
        if r == 3:
            raise RuntimeError("power cut")
        return original(self, r)

    monkeypatch.setattr(Runner, "train_round", crash_in_round_3)
    with pytest.raises(RuntimeError):
        run(algorithm, db=tmp_path / "runs.db", checkpoint_every=2, **kw)
    monkeypatch.setattr(Runner, "train_round", original)
    (rec,) = RunStore(tmp_path / "runs.db").runs()
    resumed = resume(rec["run_id"], tmp_path / "runs.db", data=toy_data(SIZES))
    assert resumed.metrics == reference.metrics
    got = flatten(resumed.result.server)
    for k, v in flatten(reference.result.server).items():
        assert torch.equal(got[k], v)
