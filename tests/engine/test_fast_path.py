"""The fused cross-entropy MLP step equals the general vmap(grad) path (and torch.optim.SGD),
keeps cohort-size invariance, and is only taken where it applies."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.common.losses import cross_entropy
from fedshift.engine import local
from fedshift.engine.contract import Algorithm
from fedshift.engine.fused import (
    FusedMLPStep,
    declares_corrected_cross_entropy,
    declares_plain_cross_entropy,
    mlp_layers,
    proximal_weight,
)
from fedshift.engine.sgd import SGDConfig
from fedshift.engine.tree import flatten, stack
from fedshift.experiment import build_experiment
from fedshift.models import build_model

SETTINGS = dict(lr=0.1, batch_size=8, local_epochs=2, rounds=1)


def train_both(sgd=None, hidden=(16, 8), model="mlp", trainable=None, seed=0):
    """(fused, general) TrainResult of one cohort call on the toy data."""
    data = toy_data(seed=seed)
    opts = {"hidden": list(hidden)} if model == "mlp" else {}
    exp = build_experiment(
        fs.make_config(algorithm="fedavg", model=model, model_options=opts, **SETTINGS),
        data=data,
    )
    ctx, alg = exp.ctx, exp.algorithm
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    n = len(cohort)
    outs = []
    for fused in (True, False):
        ctx.trainer.fused = fused
        p, b = stack(ctx.initial_params, n), stack(ctx.initial_buffers, n)
        outs.append(ctx.train(alg.loss, p, b, cohort, sgd=sgd, trainable=trainable))
    return outs


@pytest.mark.parametrize(
    "sgd",
    [SGDConfig(0.1), SGDConfig(0.05, momentum=0.9), SGDConfig(0.05, 0.5, weight_decay=0.01)],
)
@pytest.mark.parametrize("hidden", [(16,), (16, 8)])
def test_fused_step_equals_general_path(sgd, hidden):
    fused, general = train_both(sgd, hidden)
    assert torch.equal(fused.steps, general.steps)
    torch.testing.assert_close(fused.loss, general.loss, rtol=1e-5, atol=1e-6)
    for k, v in general.params.items():
        torch.testing.assert_close(fused.params[k], v, rtol=1e-5, atol=1e-6)


def test_fused_step_on_logistic_regression_and_frozen_layers():
    fused, general = train_both(model="mlr")
    for k, v in general.params.items():
        torch.testing.assert_close(fused.params[k], v, rtol=1e-5, atol=1e-6)
    head_only = lambda name: name.startswith("head.")  # noqa: E731
    fused, general = train_both(trainable=head_only)
    for k, v in general.params.items():
        torch.testing.assert_close(fused.params[k], v, rtol=1e-5, atol=1e-6)
        if not k.startswith("head."):  # frozen: untouched
            torch.testing.assert_close(v, fused.params[k], rtol=0, atol=0)


def test_fused_step_matches_torch_optim_sgd_with_a_short_batch():
    """One client, two steps, the second batch half empty (zero weights)."""
    torch.manual_seed(0)
    model = build_model("mlp", (5,), 3, {"hidden": [7]})
    layers = mlp_layers(model)
    cfg = SGDConfig(0.2, momentum=0.5, weight_decay=0.1)
    keys = tuple(k for k, _ in model.named_parameters())
    step = FusedMLPStep(layers, cfg, keys)
    params = {k: v.detach().clone().unsqueeze(0) for k, v in model.named_parameters()}
    mom = {k: torch.zeros_like(v) for k, v in params.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5, weight_decay=0.1)
    x, y = torch.randn(2, 4, 5), torch.randint(0, 3, (2, 4))
    w = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    for s in range(2):
        real = w[s] > 0
        opt.zero_grad()
        ref = torch.nn.functional.cross_entropy(model(x[s][real]), y[s][real])
        ref.backward()
        opt.step()
        loss = step(params, mom, x[s : s + 1], y[s : s + 1], w[s : s + 1])
        torch.testing.assert_close(loss[0], ref.detach())
    for k, v in model.named_parameters():
        torch.testing.assert_close(params[k][0], v.detach(), rtol=1e-5, atol=1e-6)


def test_cohort_size_invariance_on_the_fused_path():
    data = toy_data()
    outs = [
        fs.run(
            algorithm="fedavg", data=data, cohort_size=c, model_options={"hidden": [16]}, **SETTINGS
        )
        for c in (1, 3, 0)
    ]
    for o in outs[1:]:
        for k, v in outs[0].result.server.items():
            torch.testing.assert_close(o.result.server[k], v, rtol=1e-5, atol=1e-6)


def test_fused_step_only_where_it_applies():
    mlp = build_model("mlp", (1, 28, 28), 10, {"hidden": [32]})
    cnn = build_model("fedavg-cnn", (1, 28, 28), 10, {})
    assert [layer.relu for layer in mlp_layers(mlp)] == [True, False]
    assert mlp_layers(cnn) is None

    class Shifted(type(mlp)):
        def forward(self, x):  # not head(extractor(x)): the fused step would be wrong
            return super().forward(x) + 1.0

    shifted = Shifted.__new__(Shifted)
    shifted.__dict__.update(mlp.__dict__)
    assert mlp_layers(shifted) is None

    def plain(params, buffers, extras, x, y, w):
        return cross_entropy(x, y, w)

    assert not declares_plain_cross_entropy(plain)
    assert FusedMLPStep.applies(plain, mlp, {}, None) is None
    exp = build_experiment(fs.make_config(algorithm="fedavg", **SETTINGS), data=toy_data())
    loss = exp.algorithm.loss
    assert declares_plain_cross_entropy(loss)
    assert FusedMLPStep.applies(loss, mlp, {}, None) is not None
    assert FusedMLPStep.applies(loss, mlp, {}, {"eps": (3,)}) is None  # noise: general path
    prox = build_experiment(fs.make_config(algorithm="fedprox", **SETTINGS), data=toy_data())
    assert not declares_plain_cross_entropy(prox.algorithm.loss)  # overrides the loss


@pytest.mark.parametrize("algorithm", ["cfl", "fedfomo", "fedrep", "ifca", "l2sgd", "local"])
def test_the_engine_recognises_a_method_that_keeps_its_risk(algorithm):
    """No mark to remember: a method that does not override ``Algorithm.loss`` trains the
    engine's own empirical risk, and the fused step applies to it."""
    exp = build_experiment(fs.make_config(algorithm=algorithm, **SETTINGS), data=toy_data())
    assert type(exp.algorithm).loss is Algorithm.loss
    assert FusedMLPStep.applies(exp.algorithm.loss, exp.ctx.model, {}, None) is not None


@pytest.mark.parametrize(
    "cfg", [SGDConfig(0.1), SGDConfig(0.1, momentum=0.9), SGDConfig(0.1, 0.5, weight_decay=0.01)]
)
def test_in_place_sgd_update_equals_functional_sgd(cfg):
    from fedshift.engine.sgd import sgd_step, sgd_update_

    torch.manual_seed(0)
    p = {"w": torch.randn(3, 5, 4)}
    buf = {"w": torch.zeros(3, 5, 4)}
    p2 = {"w": p["w"].clone()}
    buf2 = {"w": buf["w"].clone()}
    for _ in range(3):
        g = torch.randn(3, 5, 4)
        p, buf = sgd_step(p, {"w": g}, buf, cfg)
        sgd_update_(p2, {"w": g.clone()}, buf2, cfg)
    torch.testing.assert_close(p2["w"], p["w"])


def test_keep_freed_memory_is_idempotent():
    from fedshift.engine.allocator import keep_freed_memory

    assert keep_freed_memory() == keep_freed_memory()


def test_fused_blocks_and_threads_do_not_change_the_result(monkeypatch):
    """Steps built in blocks of one step, and the single-thread tail (few clients left),
    give the same training as one block; the caller's thread count is restored."""
    import fedshift.engine.fused as fused_mod

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setenv("OMP_WAIT_POLICY", "passive")  # one thread once ≤ 3 clients remain
        assert fused_mod.passive_openmp()
        whole, _ = train_both(SGDConfig(0.1), [6])
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(fused_mod, "BLOCK_ELEMENTS", 1)
        monkeypatch.setattr(fused_mod, "FEW_CLIENTS", 0)
        blocked, _ = train_both(SGDConfig(0.1), [6])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(blocked.loss, whole.loss, rtol=1e-5, atol=1e-6)
    for k, v in whole.params.items():
        torch.testing.assert_close(blocked.params[k], v, rtol=1e-5, atol=1e-6)


def test_a_written_gradient_replaces_autograd_and_inputs_replace_the_images():
    """``gradient_by``: the engine steps with the loss's written gradient (here a
    deliberately wrong one, half of autograd's, so that using it shows); ``inputs`` and
    ``row_extras`` reach the loss row by row, on the same minibatches as the images."""
    from fedshift.engine.contract import gradient_by

    data = toy_data()
    exp = build_experiment(fs.make_config(algorithm="fedavg", **SETTINGS), data=data)
    ctx = exp.ctx
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    n, d = len(cohort), data.train.x.shape[1]
    shift = torch.randn(data.train.x.shape[0], d)

    def risk(p, b, extras, x, y, w):
        return cross_entropy((x + extras["shift"]) @ p["w"], y, w)

    def half(p, b, extras, x, y, w):
        g = torch.func.grad(risk)(p, b, extras, x, y, w)
        return {k: v / 2 for k, v in g.items()}, risk(p, b, extras, x, y, w)

    halved = gradient_by(half)(lambda *a: risk(*a))
    w0 = stack({"w": torch.randn(d, 3)}, n)
    sgd = SGDConfig(0.1)
    rows = {"row_extras": {"shift": shift}}
    plain = ctx.train(lambda p, b, e, x, y, w: cross_entropy(x @ p["w"], y, w), w0, {}, cohort,
                      sgd=sgd, inputs=data.train.x + shift)  # fmt: skip
    auto = ctx.train(risk, w0, {}, cohort, sgd=sgd, **rows)
    torch.testing.assert_close(auto.params["w"], plain.params["w"])
    written = ctx.train(halved, w0, {}, cohort, sgd=SGDConfig(0.2), **rows)
    torch.testing.assert_close(written.params["w"], auto.params["w"])
    with pytest.raises(ValueError, match="rows"):
        ctx.train(risk, w0, {}, cohort, row_extras={"shift": shift[:-1]})
    with pytest.raises(ValueError, match="inputs"):  # the engine's risk runs the model on x
        ctx.train(exp.algorithm.loss, w0, {}, cohort, inputs=data.train.x + shift)


@pytest.mark.parametrize("model,opts", [("mlp", {"hidden": [16, 8]}), ("mlr", {})])
def test_written_mlp_risk_gradient_is_autograds_under_vmap(model, opts):
    from fedshift.engine.contract import mlp_risk_gradient

    data = toy_data()
    m = build_model(model, data.input_shape, data.num_classes, opts)
    gradient = mlp_risk_gradient(m)
    assert gradient is not None
    params = stack({k: v.detach() for k, v in m.named_parameters()}, 3)
    params = {k: v + 0.1 * torch.randn_like(v) for k, v in params.items()}  # three clients
    x = torch.randn(3, 7, *data.input_shape)
    y = torch.randint(0, data.num_classes, (3, 7))
    w = torch.ones(3, 7)
    w[1, 4:] = 0  # a short batch

    def risk(p, x, y, w):
        return cross_entropy(torch.func.functional_call(m, p, (x,)), y, w)

    grads, loss = torch.func.vmap(gradient)(params, x, y, w)
    want = torch.func.vmap(torch.func.grad(risk))(params, x, y, w)
    torch.testing.assert_close(loss, torch.func.vmap(risk)(params, x, y, w))
    assert sorted(grads) == sorted(params)
    for k in params:
        torch.testing.assert_close(grads[k], want[k], msg=k)


def test_no_written_risk_gradient_for_other_models():
    from fedshift.engine.contract import mlp_risk_gradient

    data = toy_data()
    assert mlp_risk_gradient(build_model("mlp", data.input_shape, data.num_classes, {})) is not None
    cnn = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3))
    assert mlp_risk_gradient(cnn) is None


@pytest.mark.parametrize("algorithm", ["fedprox", "ditto", "irm-l2", "scaffold", "pfedme"])
def test_written_gradients_train_as_autograd(monkeypatch, algorithm):
    """FedProx's and Ditto's proximal objectives, SCAFFOLD's corrected step and pFedMe's
    inner problem use the MLP risk's gradient written out; the runs equal autograd's to
    float rounding."""
    from fedshift.algorithms.pfedme import PFedMe

    options = {"mu": 0.5} if algorithm == "fedprox" else {}
    settings = dict(SETTINGS, rounds=2, model_options={"hidden": [16]}, lr=0.05)

    def run():
        return fs.run(algorithm=algorithm, data=toy_data(), algorithm_options=options, **settings)

    alg = build_experiment(
        fs.make_config(algorithm=algorithm, algorithm_options=options, **settings), data=toy_data()
    ).algorithm
    if algorithm == "pfedme":
        assert alg.inner_gradient() is not None
    else:
        own = alg.loss if algorithm in ("fedprox", "scaffold") else alg.personal_loss
        assert local.written_gradient(own) is not None
    written = run()
    monkeypatch.setattr(local, "written_gradient", lambda loss: None)
    monkeypatch.setattr(PFedMe, "inner_gradient", lambda self: None)
    autograd = run()
    for k, v in autograd.result.server.items():
        torch.testing.assert_close(written.result.server[k], v, rtol=1e-4, atol=1e-5, msg=k)
    torch.testing.assert_close(written.result.accuracy, autograd.result.accuracy)


@pytest.mark.parametrize("hidden", [[16], [16, 8]])
def test_fedsr_written_gradient_is_autograds_for_the_cohort(hidden):
    """FedSR's whole objective (risk of ω(z), L2R, the CMI bound with its learned reference
    Gaussians and scale) differentiated by hand for a cohort of three at once, against
    autograd per client, on a short batch and at a point away from the initialisation."""
    data = toy_data()
    cfg = fs.make_config(algorithm="fedsr", **dict(SETTINGS, model_options={"hidden": hidden}))
    alg = build_experiment(cfg, data=data).algorithm
    assert alg.extractor() is not None and local.written_gradient(alg.loss) is not None
    server = alg.init()
    one = {**server["p"], **alg.init_client_state(server)["p"]}
    params = {k: v + 0.2 * torch.randn_like(v) for k, v in stack(one, 3).items()}
    params["fedsr.scale"] = params["fedsr.scale"].abs() + 0.5  # C > 0 as training keeps it
    x = torch.randn(3, 9, *data.input_shape)
    y = torch.randint(0, data.num_classes, (3, 9))
    w = torch.ones(3, 9)
    w[2, 5:] = 0  # a short batch
    extras = {"eps": torch.randn(3, 9, alg.dim)}
    grads, value = alg.loss_gradient(params, {}, extras, x, y, w)  # the whole cohort at once
    want = torch.func.vmap(torch.func.grad(alg.loss), in_dims=(0, None, 0, 0, 0, 0))(
        params, {}, extras, x, y, w
    )
    loss = torch.func.vmap(alg.loss, in_dims=(0, None, 0, 0, 0, 0))(params, {}, extras, x, y, w)
    torch.testing.assert_close(value, loss)
    assert sorted(grads) == sorted(params)
    for k in params:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-4, atol=1e-6, msg=k)


def test_fediir_written_gradient_is_autograds_double_backprop():
    """FedIIR's risk + γ‖∇_ω R − ḡ‖² differentiated by hand (the softmax's Jacobian in
    closed form) against autograd's double back-prop, per client under vmap and for the
    whole cohort at once (the engine's call), short batch included."""
    data = toy_data()
    cfg = fs.make_config(algorithm="fediir", **dict(SETTINGS, model_options={"hidden": [16, 8]}))
    alg = build_experiment(cfg, data=data).algorithm
    assert alg.extractor() is not None and local.written_gradient(alg.loss) is not None
    params = {k: v + 0.3 * torch.randn_like(v) for k, v in stack(alg.init()["p"], 3).items()}
    x = torch.randn(3, 9, *data.input_shape)
    y = torch.randint(0, data.num_classes, (3, 9))
    w = torch.ones(3, 9)
    w[1, 6:] = 0
    head = {k: v for k, v in alg.init()["p"].items() if k.startswith("head.")}
    extras = {"gbar": {k: 0.1 * torch.randn_like(v) for k, v in head.items()},
              "weight": torch.tensor(0.7)}  # fmt: skip
    dims = (0, None, {"gbar": None, "weight": None}, 0, 0, 0)
    grads, value = torch.func.vmap(alg.loss_gradient, in_dims=dims)(params, {}, extras, x, y, w)
    want = torch.func.vmap(torch.func.grad(alg.loss), in_dims=dims)(params, {}, extras, x, y, w)
    torch.testing.assert_close(
        value, torch.func.vmap(alg.loss, in_dims=dims)(params, {}, extras, x, y, w)
    )
    assert sorted(grads) == sorted(params)
    for k in params:
        torch.testing.assert_close(grads[k], want[k], rtol=1e-4, atol=1e-6, msg=k)
    # the whole cohort at once, ḡ and the weight given the client axis (the engine's call)
    cohort_extras = {
        "gbar": {k: v.expand(3, *v.shape) for k, v in extras["gbar"].items()},
        "weight": extras["weight"].expand(3),
    }
    batched, batched_value = alg.loss_gradient(params, {}, cohort_extras, x, y, w)
    torch.testing.assert_close(batched_value, value)
    for k in params:
        torch.testing.assert_close(batched[k], want[k], rtol=1e-4, atol=1e-6, msg=k)


def test_fedpin_written_global_gradient_is_autograds():
    """FedPIN's L_g^u (ω_g's risk scaled by 1+α, Φ_g's reversed step against ω_a, ω_a's own
    risk on detached features) differentiated by hand for the whole cohort at once, against
    autograd per client; not taken for the forms it does not cover (fitting steps, floor)."""
    data = toy_data()
    cfg = fs.make_config(algorithm="fedpin", **dict(SETTINGS, model_options={"hidden": [16, 8]}))
    alg = build_experiment(cfg, data=data).algorithm
    assert local.written_gradient(alg.global_loss) is not None
    server = alg.init()
    model = stack(server["p"], 3)
    d, k = alg.ctx.model.feature_dim, data.num_classes
    aux = {
        "aux.weight": torch.randn(3, k, d),
        "aux.bias": torch.randn(3, k),
        "aux.client_weight": 0.1 * torch.randn(3, k, d),
        "aux.client_bias": 0.1 * torch.randn(3, k),
    }
    params = {**{n: v + 0.3 * torch.randn_like(v) for n, v in model.items()}, **aux}
    x = torch.randn(3, 9, *data.input_shape)
    y = torch.randint(0, data.num_classes, (3, 9))
    w = torch.ones(3, 9)
    w[0, 7:] = 0
    extras = {"alpha": torch.tensor(2.5)}
    dims = (0, None, {"alpha": None}, 0, 0, 0)
    # the whole cohort at once (alpha given the client axis, as the engine's batched step does)
    cohort_extras = {"alpha": extras["alpha"].expand(3)}
    grads, value = alg.global_gradient(params, {}, cohort_extras, x, y, w)
    want = torch.func.vmap(torch.func.grad(alg.global_loss), in_dims=dims)(
        params, {}, extras, x, y, w
    )
    loss = torch.func.vmap(alg.global_loss, in_dims=dims)(params, {}, extras, x, y, w)
    torch.testing.assert_close(value, loss)
    assert sorted(grads) == sorted(params)
    for name in params:
        torch.testing.assert_close(grads[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
    for other in ({"floor": True}, {"aux_steps": 2}):
        cfg = fs.make_config(algorithm="fedpin", algorithm_options=other, **SETTINGS)
        assert (
            local.written_gradient(build_experiment(cfg, data=data).algorithm.global_loss) is None
        )


# FedSR's whole objective, FedIIR's penalty (large enough to move the model), FedPIN's
# L_g^u once α is on: each written gradient trains as autograd does
WRITTEN_OBJECTIVES = [
    ("fedsr", 2, {}, True),
    ("fediir", 3, {"penalty": 0.5}, False),
    ("fedpin", 3, {"alpha": 2.0, "anneal_rounds": 1}, True),
]


@pytest.mark.parametrize("algorithm,rounds,options,same_accuracy", WRITTEN_OBJECTIVES)
def test_written_objectives_train_as_autograd(
    monkeypatch, algorithm, rounds, options, same_accuracy
):
    settings = dict(SETTINGS, rounds=rounds, model_options={"hidden": [16]}, lr=0.05)

    def run():
        return fs.run(algorithm=algorithm, data=toy_data(), algorithm_options=options, **settings)

    written = run()
    monkeypatch.setattr(local, "written_gradient", lambda loss: None)
    autograd = run()
    got = flatten(written.result.server)
    for name, v in flatten(autograd.result.server).items():
        torch.testing.assert_close(got[name], v, rtol=1e-4, atol=1e-5, msg=name)
    if same_accuracy:
        torch.testing.assert_close(written.result.accuracy, autograd.result.accuracy)


def test_proximal_gradient_is_autograds():
    from fedshift.algorithms.common.losses import squared_distance
    from fedshift.algorithms.common.proximal import proximal_gradient
    from fedshift.engine.contract import mlp_risk_gradient

    data = toy_data()
    m = build_model("mlp", data.input_shape, data.num_classes, {"hidden": [8]})
    params = {k: v.detach() for k, v in m.named_parameters()}
    anchor = {k: v + 0.3 * torch.randn_like(v) for k, v in params.items()}
    anchor["env"] = torch.zeros(5, dtype=torch.int64)  # extras beside the anchor are skipped
    x, y, w = data.train.x[:5], data.train.y[:5], torch.tensor([1.0, 1, 1, 0, 1])

    def objective(p):
        risk = cross_entropy(torch.func.functional_call(m, p, (x,)), y, w)
        return risk + 0.5 * 0.7 * squared_distance(p, anchor)

    def one(t):  # a cohort of one client: the written gradient takes a client axis
        return {k: v[None] for k, v in t.items()}

    grads, value = proximal_gradient(
        mlp_risk_gradient(m), 0.7, one(params), one(anchor), x[None], y[None], w[None]
    )
    torch.testing.assert_close(value[0], objective(params))
    want = torch.func.grad(objective)(params)
    for k in params:
        torch.testing.assert_close(grads[k][0], want[k], msg=k)


def _proximal_both(sgd, per_client, trainable=None):
    """(fused, general) results of FedProx's loss (CE + (μ/2)‖θ − anchor‖²) on one cohort,
    the anchor shared or one per client."""
    data = toy_data()
    cfg = fs.make_config(
        algorithm="fedprox", algorithm_options={"mu": 0.7}, model_options={"hidden": [16, 8]},
        **SETTINGS,
    )  # fmt: skip
    exp = build_experiment(cfg, data=data)
    ctx, alg = exp.ctx, exp.algorithm
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    n = len(cohort)
    g = torch.Generator().manual_seed(5)
    anchor = {k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in ctx.initial_params.items()}
    extras = {"per_client": stack(anchor, n)} if per_client else {"shared": anchor}
    outs = []
    for fused in (True, False):
        ctx.trainer.fused = fused
        p, b = stack(ctx.initial_params, n), stack(ctx.initial_buffers, n)
        outs.append(ctx.train(alg.loss, p, b, cohort, sgd=sgd, trainable=trainable, **extras))
    return outs


@pytest.mark.parametrize(
    "sgd", [SGDConfig(0.1), SGDConfig(0.05, momentum=0.9), SGDConfig(0.05, 0.5, weight_decay=0.01)]
)
@pytest.mark.parametrize("per_client", [False, True])
def test_fused_proximal_step_equals_general_path(monkeypatch, sgd, per_client):
    """FedProx's (and Ditto's personal) objective on the fused step, the pull folded into
    the in-place update, against the general path's written gradient: the same training and
    the same logged loss (the pull's value included), with a shared or per-client anchor."""
    calls = []
    train = FusedMLPStep.train
    monkeypatch.setattr(
        FusedMLPStep, "train", lambda self, *a, **k: calls.append(1) or train(self, *a, **k)
    )
    fused, general = _proximal_both(sgd, per_client)
    assert calls == [1]  # the first call took the fused step, the second the general path
    torch.testing.assert_close(fused.loss, general.loss, rtol=1e-5, atol=1e-6)
    for k, v in general.params.items():
        torch.testing.assert_close(fused.params[k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_fused_proximal_step_with_frozen_layers_counts_their_pull():
    head_only = lambda name: name.startswith("head.")  # noqa: E731
    fused, general = _proximal_both(SGDConfig(0.1), per_client=True, trainable=head_only)
    torch.testing.assert_close(fused.loss, general.loss, rtol=1e-5, atol=1e-6)
    for k, v in general.params.items():
        torch.testing.assert_close(fused.params[k], v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("algorithm", ["fedprox", "ditto", "irm-l2"])
def test_proximal_objectives_take_the_fused_step(algorithm):
    exp = build_experiment(fs.make_config(algorithm=algorithm, **SETTINGS), data=toy_data())
    own = exp.algorithm.loss if algorithm == "fedprox" else exp.algorithm.personal_loss
    assert proximal_weight(own) is not None
    assert FusedMLPStep.applies(own, exp.ctx.model, {}, None) is not None
    cnn = build_model("fedavg-cnn", (1, 28, 28), 10, {})
    assert FusedMLPStep.applies(own, cnn, {}, None) is None


@pytest.mark.parametrize(
    "sgd", [SGDConfig(0.1), SGDConfig(0.05, momentum=0.9), SGDConfig(0.05, 0.5, weight_decay=0.01)]
)
def test_fused_corrected_step_equals_general_path(monkeypatch, sgd):
    """SCAFFOLD's corrected step (risk + ⟨θ, c − c_i⟩, the risk logged) on the fused step,
    the correction added to the in-place update, against the general path."""
    calls = []
    train = FusedMLPStep.train
    monkeypatch.setattr(
        FusedMLPStep, "train", lambda self, *a, **k: calls.append(1) or train(self, *a, **k)
    )
    data = toy_data()
    cfg = fs.make_config(algorithm="scaffold", model_options={"hidden": [16, 8]}, **SETTINGS)
    exp = build_experiment(cfg, data=data)
    ctx, alg = exp.ctx, exp.algorithm
    assert declares_corrected_cross_entropy(alg.loss)
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    n = len(cohort)
    g = torch.Generator().manual_seed(7)
    correction = {k: 0.3 * torch.randn(n, *v.shape, generator=g)
                  for k, v in ctx.initial_params.items()}  # fmt: skip
    outs = []
    for fused in (True, False):
        ctx.trainer.fused = fused
        p, b = stack(ctx.initial_params, n), stack(ctx.initial_buffers, n)
        outs.append(ctx.train(alg.loss, p, b, cohort, sgd=sgd, per_client=correction))
    assert calls == [1]
    fused, general = outs
    # float rounding only: lr·c and lr·δᵀx are applied one after the other instead of as
    # lr·(δᵀx + c); over 50 steps at lr 0.1 the weights differ by ≤ 2e-5 at magnitude 3
    torch.testing.assert_close(fused.loss, general.loss, rtol=1e-5, atol=1e-6)
    for k, v in general.params.items():
        torch.testing.assert_close(fused.params[k], v, rtol=1e-4, atol=1e-5, msg=k)
