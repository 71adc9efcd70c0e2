"""Model zoo: names, shapes, and exact agreement of the batched (vmap over clients)
functional forward / gradient / BatchNorm statistics with one model object per client."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedshift.errors import FedshiftError
from fedshift.models import MODELS, FedModel, batchnorm_keys, build_model

# small inputs so every model runs in well under a second on a laptop CPU
CASES = {
    "mlr": ((1, 6, 6), {}),
    "mlp": ((1, 6, 6), {"hidden": [8, 7]}),
    "fedavg-cnn": ((1, 8, 8), {}),
    "lenet5": ((3, 12, 12), {}),
    "cmnist-cnn": ((2, 14, 14), {"feature_dim": 16}),
    "dfl-cnn": ((2, 14, 14), {"channels": [4, 8, 16], "feature_dim": 12}),
    "resnet18": ((3, 8, 8), {}),
}
# 16 samples per client: ResNet-18's layer4 maps are 1x1 here, and train-mode BatchNorm over
# fewer values is too ill-conditioned for a tight float32 comparison.
CLIENTS, BATCH, CLASSES = 3, 16, 5
# batched (grouped) and per-client convolutions differ by float32 rounding only
TOL = {"rtol": 1e-3, "atol": 1e-5}


def test_every_registered_model_has_a_case():
    assert sorted(CASES) == MODELS.names()
    assert MODELS.names() == [
        "cmnist-cnn",
        "dfl-cnn",
        "fedavg-cnn",
        "lenet5",
        "mlp",
        "mlr",
        "resnet18",
    ]


def _clients(name: str) -> tuple[list[FedModel], dict, dict, torch.Tensor, torch.Tensor]:
    """CLIENTS independently initialised models (BatchNorm statistics perturbed per
    client), their stacked parameters and buffers, and one batch per client."""
    shape, options = CASES[name]
    models = []
    for c in range(CLIENTS):
        torch.manual_seed(100 + c)
        model = build_model(name, shape, CLASSES, options)
        for buf in model.buffers():
            if buf.is_floating_point():  # distinct starting running stats per client
                buf.copy_(buf * (0.5 + torch.rand_like(buf)) + 0.1 * torch.randn_like(buf).abs())
        models.append(model)
    params = {
        k: torch.stack([dict(m.named_parameters())[k].detach() for m in models])
        for k, _ in models[0].named_parameters()
    }
    buffers = {
        k: torch.stack([dict(m.named_buffers())[k] for m in models])
        for k, _ in models[0].named_buffers()
    }
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(CLIENTS, BATCH, *shape, generator=gen)
    y = torch.randint(0, CLASSES, (CLIENTS, BATCH), generator=gen)
    return models, params, buffers, x, y


def _has_batchnorm(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def _clone(tree: dict) -> dict:
    return {k: v.clone() for k, v in tree.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_names_shapes_and_feature_dim(name):
    shape, options = CASES[name]
    model = build_model(name, shape, CLASSES, options)
    assert isinstance(model, FedModel)
    names = [k for k, _ in model.named_parameters()] + [k for k, _ in model.named_buffers()]
    assert names and all(k.startswith(("extractor.", "head.")) for k in names)
    assert any(k.startswith("head.") for k, _ in model.named_parameters())
    x = torch.randn(BATCH, *shape)
    assert model.features(x).shape == (BATCH, model.feature_dim)
    assert model(x).shape == (BATCH, CLASSES)


BATCHNORM_MODELS = ("dfl-cnn", "resnet18")  # train mode differs from eval mode only with BN
FORWARD_CASES = [(n, False) for n in sorted(CASES)] + [(n, True) for n in BATCHNORM_MODELS]


@pytest.mark.parametrize(("name", "train"), FORWARD_CASES)
def test_vmapped_forward_equals_per_client_forward(name, train):
    models, params, buffers, x, _ = _clients(name)
    assert not train or _has_batchnorm(models[0])
    for m in models:
        m.train(train)
    stacked = _clone(buffers)
    out = vmap(lambda p, b, xi: functional_call(models[0], (p, b), (xi,)))(params, stacked, x)
    with torch.no_grad():
        expected = torch.stack([m(x[c]) for c, m in enumerate(models)])
    assert out.shape == (CLIENTS, BATCH, CLASSES)
    torch.testing.assert_close(out, expected, **TOL)
    # BatchNorm: each client's running statistics were updated from its own batch only
    for k, v in stacked.items():
        torch.testing.assert_close(
            v, torch.stack([dict(m.named_buffers())[k] for m in models]), **TOL
        )
    if not train:
        for k, v in stacked.items():
            assert torch.equal(v, buffers[k]), "eval mode must not touch running statistics"


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmapped_grad_equals_per_client_autograd(name):
    models, params, buffers, x, y = _clients(name)
    model = models[0]
    for m in models:
        m.train()

    def loss(p, b, xi, yi):
        return F.cross_entropy(functional_call(model, (p, b), (xi,)), yi)

    stacked = _clone(buffers)
    grads = vmap(grad(loss))(params, stacked, x, y)
    for c, m in enumerate(models):
        m.zero_grad()
        F.cross_entropy(m(x[c]), y[c]).backward()
        for k, p in m.named_parameters():
            # float32 rounding scales with the gradient: ResNet-18's conv1 gradients reach 3,
            # and on one thread one of 9,408 entries differs by 1.7e-5 (summed in another order)
            tol = {**TOL, "atol": TOL["atol"] * max(1.0, float(p.grad.abs().max()))}
            torch.testing.assert_close(grads[k][c], p.grad, **tol, msg=f"{name} client {c} {k}")
        for k, b in m.named_buffers():  # BatchNorm statistics, updated in place per client
            torch.testing.assert_close(stacked[k][c], b, **TOL, msg=f"{name} client {c} {k}")
    assert not torch.allclose(grads["head.weight"][0], grads["head.weight"][1])


@pytest.mark.parametrize("name", ["dfl-cnn", "resnet18"])
def test_batchnorm_clients_do_not_leak(name):
    models, params, buffers, x, _ = _clients(name)
    models[0].train()

    def forward(xs):
        stacked = _clone(buffers)
        out = vmap(lambda p, b, xi: functional_call(models[0], (p, b), (xi,)))(params, stacked, xs)
        return out, stacked

    out, stats = forward(x)
    x2 = x.clone()
    x2[0] = 10 * x2[0] + 3  # change client 0's batch only
    out2, stats2 = forward(x2)
    assert not torch.allclose(out[0], out2[0])
    torch.testing.assert_close(out[1:], out2[1:], rtol=0, atol=0)
    bn = [k for k in stats if k.endswith("running_mean")]
    assert bn and all(not torch.equal(stats[k][0], stats2[k][0]) for k in bn)
    for k in stats:
        assert torch.equal(stats[k][1:], stats2[k][1:]), k
    assert all(k.startswith("extractor.") for k in batchnorm_keys(models[0]))
    assert set(buffers) <= batchnorm_keys(models[0])


def test_batchnorm_keys():
    dfl = build_model("dfl-cnn", (2, 14, 14), 2)
    assert batchnorm_keys(dfl) == {
        f"extractor.bn{i}.{k}"
        for i in (1, 2, 3)
        for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }
    assert batchnorm_keys(build_model("mlp", (4,), 2)) == set()


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_mlp_hidden_option_sets_layer_sizes():
    model = build_model("mlp", (1, 28, 28), 10, {"hidden": [200, 200]})  # FedAvg's 2NN
    assert _count(model) == 199_210
    assert model.feature_dim == 200
    shapes = [tuple(p.shape) for p in model.parameters() if p.dim() == 2]
    assert shapes == [(200, 784), (200, 200), (10, 200)]
    default = build_model("mlp", (784,), 10)
    assert [tuple(p.shape) for p in default.parameters() if p.dim() == 2] == [(100, 784), (10, 100)]
    assert build_model("mlp", (784,), 10, {"hidden": "[32,16]"}).feature_dim == 16


def test_paper_parameter_counts():
    assert _count(build_model("mlr", (784,), 10)) == 7_850
    assert _count(build_model("fedavg-cnn", (1, 28, 28), 10)) == 1_663_370  # McMahan et al.
    assert _count(build_model("lenet5", (1, 28, 28), 10)) == 61_706
    assert _count(build_model("resnet18", (3, 224, 224), 1000)) == 11_689_512  # torchvision


@pytest.mark.parametrize(
    "name,shape",
    [
        ("fedavg-cnn", (784,)),  # flat square → 1×28×28
        ("fedavg-cnn", (3, 32, 32)),
        ("lenet5", (1, 28, 28)),
        ("lenet5", (2, 5, 7)),  # padded up to 12×12
        ("cmnist-cnn", (3, 2, 2)),
        ("dfl-cnn", (1, 28, 28)),
        ("resnet18", (16, 16)),
    ],
)
def test_convolutional_models_accept_other_input_shapes(name, shape):
    model = build_model(name, shape, 3)
    assert model(torch.randn(2, *shape)).shape == (2, 3)


def test_resnet_small_input_stem():
    model = build_model("resnet18", (3, 8, 8), 10, {"small_input": True})
    assert tuple(model.extractor.conv1.weight.shape) == (64, 3, 3, 3)
    assert isinstance(model.extractor.maxpool, torch.nn.Identity)
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 10)


def _torchvision_state(model: FedModel) -> dict[str, torch.Tensor]:
    """The model's state under torchvision's resnet18 key names."""
    out = {}
    for k, v in model.state_dict().items():
        out["fc." + k[5:] if k.startswith("head.") else k[len("extractor.") :]] = v.clone()
    return out


def test_resnet_state_dict_uses_torchvision_names():
    state = _torchvision_state(build_model("resnet18", (3, 32, 32), 1000))
    assert len(state) == 122  # torchvision resnet18().state_dict()
    for key in (
        "conv1.weight",
        "bn1.running_var",
        "layer1.1.conv2.weight",
        "layer2.0.downsample.0.weight",
        "layer4.1.bn2.num_batches_tracked",
        "fc.weight",
    ):
        assert key in state
    assert tuple(state["fc.weight"].shape) == (1000, 512)


def test_resnet_weights_round_trip(tmp_path):
    torch.manual_seed(0)
    source = build_model("resnet18", (3, 16, 16), 10)
    state = _torchvision_state(source)
    state["bn1.running_mean"] += 1.0  # non-default buffers travel too
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)

    torch.manual_seed(1)
    loaded = build_model("resnet18", (3, 16, 16), 10, {"weights": str(path)})
    for k, v in _torchvision_state(loaded).items():
        assert torch.equal(v, state[k]), k

    # other class count: extractor loaded, head skipped (fresh initialisation)
    torch.manual_seed(1)
    fresh = build_model("resnet18", (3, 16, 16), 7)
    torch.manual_seed(1)
    other = build_model("resnet18", (3, 16, 16), 7, {"weights": str(path)})
    assert torch.equal(
        other.extractor.layer3[1].conv1.weight, source.extractor.layer3[1].conv1.weight
    )
    assert torch.equal(other.head.weight, fresh.head.weight)

    # published torchvision files have no num_batches_tracked entries
    legacy = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    torch.save(legacy, tmp_path / "legacy.pth")
    model = build_model("resnet18", (3, 16, 16), 10, {"weights": str(tmp_path / "legacy.pth")})
    assert torch.equal(model.extractor.conv1.weight, state["conv1.weight"])


def test_resnet_weights_errors(tmp_path):
    missing = tmp_path / "nope.pth"
    with pytest.raises(FedshiftError, match="nope.pth.*no such file"):
        build_model("resnet18", (3, 16, 16), 10, {"weights": str(missing)})

    garbage = tmp_path / "garbage.pth"
    garbage.write_text("not a checkpoint")
    with pytest.raises(FedshiftError, match="garbage.pth.*cannot be read"):
        build_model("resnet18", (3, 16, 16), 10, {"weights": str(garbage)})

    state = _torchvision_state(build_model("resnet18", (3, 16, 16), 10))
    torch.save(state, tmp_path / "big_stem.pth")
    with pytest.raises(FedshiftError, match=r"big_stem.pth.*conv1\.weight is \(64, 3, 7, 7\)"):
        build_model(
            "resnet18",
            (3, 16, 16),
            10,
            {"weights": str(tmp_path / "big_stem.pth"), "small_input": True},
        )

    del state["layer4.1.bn2.weight"]
    state["extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "partial.pth")
    with pytest.raises(FedshiftError, match="missing layer4.1.bn2.weight.*unexpected extra"):
        build_model("resnet18", (3, 16, 16), 10, {"weights": str(tmp_path / "partial.pth")})

    torch.save([torch.zeros(1)], tmp_path / "list.pth")
    with pytest.raises(FedshiftError, match="not a state_dict"):
        build_model("resnet18", (3, 16, 16), 10, {"weights": str(tmp_path / "list.pth")})


@pytest.mark.parametrize(
    "name,shape,options,match",
    [
        ("mlp", (4,), {"hidden": []}, "at least one"),
        ("mlp", (4,), {"hidden": [8, -1]}, "positive"),
        ("mlp", (4,), {"hidden": "abc"}, "model.hidden"),
        ("mlp", (4,), {"depth": 3}, "unknown option 'model.depth'"),
        ("dfl-cnn", (1, 8, 8), {"channels": []}, "at least one"),
        ("dfl-cnn", (1, 8, 8), {"feature_dim": 0}, "feature_dim"),
        ("cmnist-cnn", (2, 14, 14), {"feature_dim": -3}, "feature_dim"),
        ("fedavg-cnn", (1, 8, 8), {"feature_dim": 0}, "feature_dim"),
        ("resnet18", (3, 8, 8), {"small_input": "maybe"}, "small_input"),
        ("fedavg-cnn", (1, 2, 2), {}, "too small"),
        ("fedavg-cnn", (10,), {}, "image input_shape"),
        ("lenet5", (2, 3, 4, 5), {}, "image input_shape"),
        ("cmnist-cnn", (2, 0, 14), {}, "non-positive"),
    ],
)
def test_bad_options_and_shapes_raise_one_clear_error(name, shape, options, match):
    with pytest.raises(FedshiftError, match=match):
        build_model(name, shape, 10, options)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_class_count(name):
    with pytest.raises(FedshiftError, match="num_classes"):
        build_model(name, CASES[name][0], 0, CASES[name][1])


def test_mlr_is_flatten_then_linear():
    model = build_model("mlr", (3, 4, 4), 6)
    assert model.feature_dim == math.prod((3, 4, 4))
    assert [k for k, _ in model.named_parameters()] == ["head.weight", "head.bias"]
    x = torch.randn(5, 3, 4, 4)
    torch.testing.assert_close(model(x), x.reshape(5, -1) @ model.head.weight.T + model.head.bias)


def test_binary_head_is_one_logit_bce():
    model = build_model("mlp", (4,), 2, {"hidden": [3], "binary_head": True, "init": "xavier"})
    x, y = torch.randn(7, 4), torch.randint(0, 2, (7,))
    logits = model(x)
    assert (logits[:, 0] == 0).all()
    z = logits[:, 1]
    torch.testing.assert_close(
        F.cross_entropy(logits, y), F.binary_cross_entropy_with_logits(z, y.float())
    )
    assert all((m.bias == 0).all() for m in model.modules() if isinstance(m, torch.nn.Linear))
