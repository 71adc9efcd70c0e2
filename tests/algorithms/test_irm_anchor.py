"""The IRM external anchor (issue 18): Arjovsky et al.'s Coloured MNIST, FedOpt's server
optimisers, and IRM†'s rescaling (only under a scale-free server step)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.common.adaptive import (
    ServerOptHyper,
    adam_step,
    server_opt_state,
    server_update,
)
from fedshift.data.registry import build_scenario
from fedshift.engine.contract import flatten
from fedshift.errors import FedshiftError
from fedshift.models.registry import build_model

ADAM = dict(server_opt="adam", server_beta2=0.999, server_tau=1e-8, server_bias_correction=True)


# --- the dataset ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arjovsky(shared_datasets):
    opts = {"construction": "arjovsky", "clients": 2, "p_train": [0.8, 0.9], "p_test": [0.1]}
    return build_scenario("cmnist", opts, seed=3, data_dir=shared_datasets)


def channel(x):
    """The channel holding the digit (1 if channel 1 has any ink)."""
    return (x[:, 1].flatten(1).sum(1) > 0).long()


def test_arjovsky_sizes_and_environments(arjovsky):
    d = arjovsky
    assert d.train.sizes().tolist() == [25_000, 25_000]
    assert d.test["p=0.1"].sizes().tolist() == [5_000, 5_000]
    assert d.val == {} and d.participation == 1.0 and d.input_shape == (2, 14, 14)
    assert d.train.env.tolist()[:1] == [0] and set(d.train.env[25_000:].tolist()) == {1}
    # one channel holds the digit, the other is zero
    x = d.train.x
    assert ((x[:, 0].flatten(1).sum(1) > 0) ^ (x[:, 1].flatten(1).sum(1) > 0)).all()
    assert x.max() == 1.0 and x.min() == 0.0


def test_arjovsky_colour_and_label_rates(arjovsky, shared_datasets):
    d = arjovsky
    ch, y = channel(d.train.x), d.train.y
    for env, p in ((0, 0.8), (1, 0.9)):  # P(colour = label) = p, ±4 binomial std
        agree = (ch[d.train.env == env] == y[d.train.env == env]).float().mean().item()
        assert abs(agree - p) < 0.012
        assert abs(y[d.train.env == env].float().mean().item() - 0.5) < 0.02
    t = d.test["p=0.1"]
    assert abs((channel(t.x) == t.y).float().mean().item() - 0.1) < 0.015
    # label = [digit < 5] flipped w.p. 0.25: recover each image's digit from the raw data
    from fedshift.data.idx import load_idx_dataset

    raw, digits = load_idx_dataset("mnist", "train", shared_datasets, False)
    grey = raw[:, ::2, ::2].float().div(255).flatten(1)
    test_grey = t.x.sum(1).flatten(1)
    key = {tuple(g[::7].tolist()): i for i, g in enumerate(grey[50_000:])}
    found = [key.get(tuple(g[::7].tolist())) for g in test_grey[:500]]
    assert all(f is not None for f in found)  # test images are training images 50000:
    low = (digits[50_000:][torch.tensor(found)] < 5).long()
    assert abs((low == t.y[:500]).float().mean().item() - 0.75) < 0.07
    # training images are images 0 … 49,999 (each once): compare sorted ink totals
    ink = torch.sort(d.train.x.sum((1, 2, 3)))[0]
    torch.testing.assert_close(ink, torch.sort(grey[:50_000].sum(1))[0])


def test_arjovsky_grayscale_sums_channels(arjovsky, shared_datasets):
    opts = {"construction": "arjovsky", "clients": 2, "p_train": [0.8, 0.9], "p_test": [0.1]}
    g = build_scenario("cmnist", {**opts, "grayscale": True}, seed=3, data_dir=shared_datasets)
    assert g.input_shape == (1, 14, 14)
    torch.testing.assert_close(g.train.x[:, 0], arjovsky.train.x.sum(1))


def test_arjovsky_needs_a_client_multiple_of_environments():
    with pytest.raises(FedshiftError):
        build_scenario("cmnist", {"construction": "arjovsky", "clients": 3})


# --- FedOpt's server step ------------------------------------------------------------------


def test_fedadam_step_matches_hand_computation():
    hp = ServerOptHyper(server_opt="adam", server_lr=0.1, server_beta1=0.5, server_beta2=0.75)
    server = {"p": {"w": torch.tensor([1.0, -2.0])}, "b": {"n": torch.tensor([3.0])}}
    server = {**server, **server_opt_state(hp, server)}
    average = {"p": {"w": torch.tensor([0.5, -2.5])}, "b": {"n": torch.tensor([5.0])}}
    out = server_update(hp, server, average)
    # g = x − avg = [0.5, 0.5]; m = 0.5·g = 0.25; v = 0.25·g² = 0.0625; √v = 0.25
    # x − 0.1·0.25/(0.25 + 1e-3) (Reddi et al. Alg. 2: no bias correction)
    step = 0.1 * 0.25 / (0.25 + 1e-3)
    torch.testing.assert_close(out["p"]["w"], torch.tensor([1.0 - step, -2.0 - step]))
    torch.testing.assert_close(out["b"]["n"], torch.tensor([5.0]))  # buffers are averaged
    torch.testing.assert_close(out["opt"]["m"]["p"]["w"], torch.tensor([0.25, 0.25]))
    torch.testing.assert_close(out["opt"]["v"]["p"]["w"], torch.tensor([0.0625, 0.0625]))
    assert list(flatten(out)) == ["p/w", "b/n", "opt/m/p/w", "opt/v/p/w", "opt/k"]
    # with bias correction the first step is lr·sign(g)·|g|/(|g| + τ) — torch's Adam
    hp = ServerOptHyper(server_lr=0.1, **ADAM)
    out = server_update(hp, {**server, **server_opt_state(hp, server)}, average)
    torch.testing.assert_close(out["p"]["w"], torch.tensor([0.9, -2.1]))


def test_fedyogi_and_fedadagrad_second_moments():
    server = {"p": {"w": torch.tensor([0.0])}}
    average = {"p": {"w": torch.tensor([-2.0])}}  # g = 2, g² = 4
    for rule, v in (("yogi", 4.0 * 0.01), ("adagrad", 4.0)):
        hp = ServerOptHyper(server_opt=rule, server_lr=1.0, server_beta2=0.99, server_tau=0.5)
        state = {**server, **server_opt_state(hp, server)}
        state["opt"]["v"]["p"]["w"] = torch.tensor([0.0])
        out = server_update(hp, state, average)
        # yogi: v = 0 − 0.01·4·sign(0 − 4) = 0.04; adagrad: v = 0 + 4; m = 0.1·2 = 0.2
        torch.testing.assert_close(out["opt"]["v"]["p"]["w"], torch.tensor([v]))
        torch.testing.assert_close(out["p"]["w"], torch.tensor([-0.2 / (v**0.5 + 0.5)]))


def test_server_sgd_default_is_the_plain_average():
    hp = ServerOptHyper()
    avg = {"p": {"w": torch.tensor([0.3])}}
    assert server_update(hp, {"p": {"w": torch.tensor([1.0])}}, avg) is avg
    hp = ServerOptHyper(server_lr=0.5)
    out = server_update(hp, {"p": {"w": torch.tensor([1.0])}}, avg)
    torch.testing.assert_close(out["p"]["w"], torch.tensor([0.65]))


def test_adam_step_is_torch_adam():
    p = torch.randn(5, dtype=torch.float64)
    ref = p.clone().requires_grad_()
    opt = torch.optim.Adam([ref], lr=0.01)
    zeros = torch.zeros(5, dtype=torch.float64)
    params, m, v, k = {"p": p}, {"p": zeros}, {"p": zeros}, torch.zeros(())
    for i in range(4):
        g = torch.sin(params["p"] * (i + 1))
        params, m, v, k = adam_step(params, {"p": g}, m, v, k, 0.01)
        opt.zero_grad()
        ref.grad = torch.sin(ref.detach() * (i + 1))
        opt.step()
    # k is a float32 step count (as in the server state), so the corrections are float32
    torch.testing.assert_close(params["p"], ref.detach(), rtol=1e-5, atol=1e-6)


def two_equal_clients():
    return toy_data(sizes=(40, 40), dim=6, classes=2, seed=1)


def centralised_adam(server0, hidden, lr, rounds, l2, data):
    """Full-batch torch.optim.Adam on the pooled mean loss, from the run's initial model."""
    model = build_model("mlp", (6,), 2, {"hidden": hidden})
    model.load_state_dict(server0["p"])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(rounds):
        loss = F.cross_entropy(model(data.train.x), data.train.y)
        loss = loss + l2 * sum((p**2).sum() for p in model.parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_one_full_batch_step_plus_fedadam_is_centralised_adam(l2):
    data = two_equal_clients()
    kw = dict(data=data, lr=1.0, batch_size=0, local_steps=1, model_options={"hidden": [8]})
    opts = {**ADAM, "server_lr": 0.01}
    start = fs.run(algorithm="fedavg", rounds=0, algorithm_options=opts, **kw).result.server
    out = fs.run(
        algorithm="fedavg", rounds=5, algorithm_options=opts, weight_decay=2 * l2, **kw
    ).result.server
    ref = centralised_adam(start, [8], 0.01, 5, l2, data)
    for k, v in ref.items():
        torch.testing.assert_close(out["p"][k], v, rtol=1e-4, atol=1e-6)
    assert (out["p"]["head.weight"] - start["p"]["head.weight"]).abs().max() > 0.02  # it moved
    # IRM† with λ = 0 and its own L2 term is the same training
    irm = fs.run(
        algorithm="irm",
        rounds=5,
        algorithm_options={**opts, "lambda_": 0.0, "anneal_rounds": 0, "l2_regularizer": l2},
        **kw,
    ).result.server
    for k, v in ref.items():
        torch.testing.assert_close(irm["p"][k], v, rtol=1e-4, atol=1e-6)


# --- IRM†'s rescaling ----------------------------------------------------------------------


def irm_run(rounds, **options):
    base = {"lambda_": 1000.0, "anneal_rounds": 2}
    return fs.run(
        algorithm="irm",
        data=two_equal_clients(),
        rounds=rounds,
        lr=0.05,
        batch_size=0,
        local_steps=1,
        model_options={"hidden": [8]},
        algorithm_options={**base, **options},
    )


def change(a, b):
    a, b = a["p"], b["p"]
    return sum(((a[k] - b[k]) ** 2).sum() for k in a).sqrt().item()


def test_irm_under_sgd_keeps_moving_after_annealing():
    before = irm_run(2).result.server  # two rounds at penalty weight 1
    auto, always = irm_run(4), irm_run(4, rescale="always")
    moved = change(auto.result.server, before)
    shrunk = change(always.result.server, before)
    # the reference's division shrinks the post-annealing step ~λ-fold under SGD
    assert shrunk < moved / 100
    assert moved > 1e-3
    # the logged loss is the risk R_i, not the objective divided by λ
    assert min(r.loss for r in auto.result.rounds) > 0.3
    assert min(r.loss for r in always.result.rounds) > 0.3


def test_irm_rescales_under_server_adam():
    """With a scale-free server step the objective is divided by λ_t (the reference's line):
    the same run as rescale = always, and a different one from rescale = never."""
    opts = {**ADAM, "server_lr": 0.01}
    auto, always = irm_run(4, **opts), irm_run(4, rescale="always", **opts)
    never = irm_run(4, rescale="never", **opts)
    for k, v in always.result.server.items():
        torch.testing.assert_close(auto.result.server[k], v)
    assert change(auto.result.server, never.result.server) > 1e-4


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
