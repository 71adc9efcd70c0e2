"""The fused CNN step equals the general path (and torch.optim.SGD) to float32 rounding, is
taken only where it applies, and ``execution`` pinned keeps the general path."""

from __future__ import annotations

import pytest
import torch
from test_execution import assert_same_run, tiny_images

import fedshift as fs
from fedshift.engine.fused_conv import FusedConvStep
from fedshift.engine.sgd import SGDConfig
from fedshift.experiment import build_experiment
from fedshift.models import build_model
from fedshift.models.chain import channels_last, conv_chain

CNNS = ["fedavg-cnn", "lenet5", "cmnist-cnn"]


def count_calls(monkeypatch, owner, name: str) -> list:
    """A list that grows by one at each call of ``owner.name`` (patched for the test)."""
    calls = []
    original = getattr(owner, name)

    def counted(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.fixture
def count_fused(monkeypatch):
    """How many fused CNN steps a run took."""
    return count_calls(monkeypatch, FusedConvStep, "step")


@pytest.mark.parametrize("model", CNNS)
@pytest.mark.parametrize("sgd", [{}, {"momentum": 0.9, "weight_decay": 0.01}])
@pytest.mark.parametrize("workers", [1, 2])
def test_fused_cnn_step_equals_the_general_path(model, sgd, workers, count_fused, monkeypatch):
    monkeypatch.setattr("fedshift.engine.local.default_workers", lambda device: workers)
    common = dict(algorithm="fedavg", model=model, lr=0.05, batch_size=8, rounds=2, **sgd)
    fused = fs.run(data=tiny_images(), execution="auto", **common)
    assert count_fused, "auto takes the fused CNN step for plain cross-entropy of a CNN"
    taken = len(count_fused)
    general = fs.run(data=tiny_images(), execution="sequential", **common)
    assert len(count_fused) == taken, "a pinned execution keeps the general path"
    assert_same_run(general, fused)


@pytest.mark.parametrize("algorithm", ["fedprox", "scaffold", "ditto"])
@pytest.mark.parametrize("model", ["fedavg-cnn", "lenet5"])
def test_proximal_and_corrected_objectives_take_it_too(algorithm, model, count_fused):
    """FedProx's pull, SCAFFOLD's correction, Ditto's two objectives (per-client metrics:
    its personal models)."""
    common = dict(algorithm=algorithm, model=model, lr=0.05, batch_size=8, rounds=2)
    common.update(momentum=0.5, weight_decay=0.01)
    fused = fs.run(data=tiny_images(), execution="auto", **common)
    assert count_fused
    general = fs.run(data=tiny_images(), execution="sequential", **common)
    assert_same_run(general, fused)


def test_frozen_layers_stay_frozen_and_the_rest_matches():
    """FedRep trains the head and the body in turns (``trainable``): the fused step must
    leave the frozen part bit for bit as it was."""
    data = tiny_images()
    exp = build_experiment(
        fs.make_config(algorithm="fedavg", model="lenet5", lr=0.05, batch_size=8), data=data
    )
    ctx, alg = exp.ctx, exp.algorithm
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    from fedshift.engine.tree import flatten, stack

    head = lambda name: name.startswith("head.")  # noqa: E731
    outs = []
    for execution in ("auto", "sequential"):
        ctx.trainer.execution = execution
        p = stack(ctx.initial_params, len(cohort))
        b = stack(ctx.initial_buffers, len(cohort))
        outs.append(flatten(ctx.train(alg.loss, p, b, cohort, trainable=head).params))
    before = flatten(stack(ctx.initial_params, len(cohort)))
    for k, v in outs[1].items():
        torch.testing.assert_close(outs[0][k], v, rtol=1e-5, atol=1e-6)
        if not k.startswith("head."):
            assert torch.equal(outs[0][k], before[k])
        else:
            assert not torch.equal(outs[0][k], before[k])


def test_fused_cnn_step_matches_torch_optim_sgd_with_a_short_batch():
    """One client, two steps, the second batch half empty (zero weights)."""
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 12, 12), 4, {})
    cfg = SGDConfig(0.1, momentum=0.5, weight_decay=0.05)
    keys = tuple(k for k, _ in model.named_parameters())
    step = FusedConvStep(conv_chain(model), cfg, keys)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    mom = {k: torch.zeros_like(v) for k, v in params.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5, weight_decay=0.05)
    x, y = torch.rand(2, 4, 1, 12, 12), torch.randint(0, 4, (2, 4))
    w = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    for s in range(2):
        real = w[s] > 0
        opt.zero_grad()
        ref = torch.nn.functional.cross_entropy(model(x[s][real]), y[s][real])
        ref.backward()
        opt.step()
        loss = step.step(params, mom, x[s], y[s], w[s])
        torch.testing.assert_close(loss, ref.detach())
    for k, v in model.named_parameters():
        torch.testing.assert_close(params[k], v.detach(), rtol=1e-5, atol=1e-6)


def test_the_chain_is_read_only_from_models_it_handles():
    image = (1, 28, 28)
    kinds = [op.kind for op in conv_chain(build_model("fedavg-cnn", image, 10, {}))]
    assert kinds == ["image", "conv", "pool", "conv", "pool", "flatten", "linear", "linear"]
    assert [op.relu for op in conv_chain(build_model("fedavg-cnn", image, 10, {}))][1] is True
    assert conv_chain(build_model("lenet5", image, 10, {})) is not None
    assert conv_chain(build_model("cmnist-cnn", (2, 14, 14), 2, {})) is not None
    assert conv_chain(build_model("mlp", image, 10, {"hidden": [8]})) is None  # no convolution
    assert conv_chain(build_model("dfl-cnn", image, 10, {})) is None  # batch norm
    assert conv_chain(build_model("resnet18", (3, 32, 32), 10, {})) is None

    class Doubled(type(build_model("lenet5", image, 10, {}))):
        def forward(self, x):  # not head(extractor(x)): the chain would be wrong
            return 2 * super().forward(x)

    assert conv_chain(Doubled(image, 10)) is None


def test_the_fused_cnn_step_only_where_it_applies():
    cnn = build_model("fedavg-cnn", (1, 28, 28), 10, {})
    exp = build_experiment(
        fs.make_config(algorithm="fedavg", model="lenet5", batch_size=8), data=tiny_images()
    )
    loss = exp.algorithm.loss
    assert FusedConvStep.applies(loss, cnn, {}, None, "cpu") is not None
    assert FusedConvStep.applies(loss, cnn, {}, {"eps": (3,)}, "cpu") is None  # noise
    assert FusedConvStep.applies(loss, cnn, {"bn": torch.zeros(1)}, None, "cpu") is None
    assert FusedConvStep.applies(loss, cnn, {}, None, "cuda") is None  # batched on a GPU
    prox = build_experiment(
        fs.make_config(algorithm="fedprox", model="lenet5", batch_size=8), data=tiny_images()
    )
    assert FusedConvStep.applies(prox.algorithm.loss, cnn, {}, None, "cpu") is not None
    fedsr = build_experiment(
        fs.make_config(algorithm="fedsr", model="lenet5", batch_size=8), data=tiny_images()
    )
    assert FusedConvStep.applies(fedsr.algorithm.loss, cnn, {}, None, "cpu") is None


def test_an_objective_of_its_own_keeps_the_general_path(count_fused):
    fs.run(data=tiny_images(), algorithm="fedsr", model="lenet5", rounds=1, batch_size=8)
    assert not count_fused


def test_channels_last_of_one_channel_is_channels_last_for_a_convolution():
    x = torch.rand(3, 1, 6, 6)
    y = channels_last(x)
    assert torch.equal(x, y)
    out = torch.nn.functional.conv2d(y, torch.rand(4, 1, 3, 3))
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("model", ["fedavg-cnn", "lenet5"])
def test_pfedme_inner_descent_on_a_cnn(model, monkeypatch):
    """pFedMe's K inner steps per minibatch through the fused CNN step, client by client:
    the same run as autograd's (pinned sequential), per-client (personal) metrics too."""
    calls = count_calls(monkeypatch, FusedConvStep, "prox_descent")
    common = dict(algorithm="pfedme", model=model, lr=0.05, batch_size=8, rounds=2)
    fused = fs.run(data=tiny_images(), execution="auto", **common)
    assert calls
    taken = len(calls)
    general = fs.run(data=tiny_images(), execution="sequential", **common)
    assert len(calls) == taken
    assert_same_run(general, fused)


def test_prox_descent_equals_prox_solve():
    from fedshift.algorithms.common.losses import cross_entropy
    from fedshift.algorithms.common.proximal import prox_solve

    torch.manual_seed(1)
    model = build_model("lenet5", (1, 12, 12), 4, {})
    keys = tuple(k for k, _ in model.named_parameters())
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    anchor = {k: v + 0.05 * torch.randn_like(v) for k, v in theta.items()}
    x, y, w = torch.rand(6, 1, 12, 12), torch.randint(0, 4, (6,)), torch.ones(6)
    solver = FusedConvStep(conv_chain(model), SGDConfig(0.1), keys, mu=15.0)
    before = {k: v.clone() for k, v in theta.items()}
    solved, risk = solver.prox_descent(theta, anchor, x, y, w, 5)
    assert all(torch.equal(theta[k], before[k]) for k in keys), "theta itself is not changed"

    def loss(t):
        return cross_entropy(torch.func.functional_call(model, t, (x,)), y, w)

    expected = prox_solve(loss, theta, anchor, 15.0, 0.1, 5)
    for k, v in expected.items():
        torch.testing.assert_close(solved[k], v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(risk, loss(expected), rtol=1e-5, atol=1e-6)
    assert not torch.equal(solved[keys[0]], theta[keys[0]])


@pytest.mark.parametrize("algorithm", ["fedavg", "ditto"])  # a shared model; personal ones
def test_evaluation_by_the_chain_counts_as_the_module(algorithm, monkeypatch):
    from fedshift.eval import evaluate

    def run():
        return fs.run(data=tiny_images(), algorithm=algorithm, model="lenet5", rounds=1)

    seen = count_calls(monkeypatch, evaluate, "_chain_counts")
    by_chain = run()
    assert seen, "a CNN chain on a CPU is evaluated by the fused step's forward pass"
    monkeypatch.setattr(evaluate, "_cpu_chain", lambda *args: None)
    by_module = run()
    assert by_chain.metrics["per_client"] == by_module.metrics["per_client"]
    assert torch.equal(by_chain.result.accuracy, by_module.result.accuracy)
    assert by_chain.metrics["constant_clients"] == by_module.metrics["constant_clients"]


def test_pfedme_keeps_autograd_when_compiled_or_pinned():
    for setting in ({"compile": True}, {"execution": "sequential"}):
        cfg = fs.make_config(algorithm="pfedme", model="lenet5", batch_size=8, **setting)
        exp = build_experiment(cfg, data=tiny_images())
        assert exp.ctx.fused_cnn() is None and exp.algorithm.conv_solver() is None
    exp = build_experiment(fs.make_config(algorithm="pfedme", model="lenet5"), data=tiny_images())
    assert exp.algorithm.conv_solver() is not None
