"""The batched engine is exactly the sequential one, handles unequal clients with their own
step counts, accounts bytes exactly and is deterministic per seed."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.engine.schedule import make_schedule
from fedshift.engine.sgd import SGDConfig
from fedshift.engine.tree import flatten, nbytes, stack
from fedshift.experiment import build_experiment

SETTINGS = dict(lr=0.1, batch_size=8, local_epochs=2, rounds=3, model_options={"hidden": [16]})


def run(algorithm="fedavg", data=None, **kw):
    return fs.run(algorithm=algorithm, data=data or toy_data(), **{**SETTINGS, **kw})


def test_step_masks_match_a_plain_per_client_loop():
    """Clients of sizes 5…200 each take their own epochs·⌈n/B⌉ steps, exactly."""
    data = toy_data()
    cfg = fs.make_config(algorithm="fedavg", **{**SETTINGS, "rounds": 1})
    exp = build_experiment(cfg, data=data)
    ctx = exp.ctx
    ids = torch.arange(data.num_clients)
    cohort = ctx.cohort(ids, 0)
    n = len(ids)
    params, buffers = stack(ctx.initial_params, n), stack(ctx.initial_buffers, n)
    out = ctx.train(exp.algorithm.loss, params, buffers, cohort, shared=ctx.initial_params)
    sched = make_schedule(
        data.train, ids, seed=cfg.seed, round_=0, purpose="train", batch_size=8, epochs=2
    )
    sizes = data.train.sizes()
    assert out.steps.tolist() == [2 * -(-int(s) // 8) for s in sizes]
    model = ctx.model
    for i in range(n):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(ctx.initial_params[name])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for s in range(int(sched.steps[i])):
            real = sched.weight[i, s] > 0
            rows = sched.index[i, s][real]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data.train.x[rows]), data.train.y[rows])
            loss.backward()
            opt.step()
        for name, p in model.named_parameters():
            torch.testing.assert_close(out.params[name][i], p.detach(), rtol=1e-4, atol=1e-5)


def test_functional_sgd_matches_torch_sgd():
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    cfg = SGDConfig(lr=0.1, momentum=0.9, weight_decay=0.01)
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01)
    from fedshift.engine.sgd import sgd_step

    p, buf = {"w": w.detach().clone()}, {"w": torch.zeros(5, 3)}
    for _ in range(4):
        g = torch.randn(5, 3)
        w.grad = g.clone()
        opt.step()
        p, buf = sgd_step(p, {"w": g}, buf, cfg)
    torch.testing.assert_close(p["w"], w.detach())


def test_bytes_are_the_sizes_of_exchanged_tensors():
    out = run("fedavg", participation=0.5)
    exp = build_experiment(fs.make_config(algorithm="fedavg", **SETTINGS), data=toy_data())
    model_bytes = nbytes(exp.ctx.initial_params) + nbytes(exp.ctx.initial_buffers)
    k = round(0.5 * 7)
    for rec in out.result.rounds:
        assert rec.bytes_up == k * model_bytes
        assert rec.bytes_down == k * model_bytes
    assert out.result.bytes_up == 3 * k * model_bytes
    local = run("local")
    assert local.result.bytes_up == 0 and local.result.bytes_down == 0


def test_same_seed_same_metrics_different_seed_differs():
    a, b, c = run(seed=3), run(seed=3), run(seed=4)
    assert a.metrics == b.metrics
    torch.testing.assert_close(a.result.server, b.result.server, rtol=0, atol=0)
    fa, fc = flatten(a.result.server), flatten(c.result.server)
    assert any(not torch.equal(fa[k], fc[k]) for k in fa)


def test_fedprox_with_mu_zero_is_fedavg():
    a = run("fedavg")
    b = run("fedprox", algorithm_options={"mu": 0.0})
    for k, v in a.result.server.items():
        torch.testing.assert_close(b.result.server[k], v)
    c = flatten(run("fedprox", algorithm_options={"mu": 1.0}).result.server)
    assert any(not torch.allclose(c[k], v) for k, v in flatten(a.result.server).items())


def test_ftfa_without_finetuning_is_fedavg_and_with_it_is_personal():
    a = run("fedavg")
    b = run("ftfa", algorithm_options={"finetune_epochs": 0})
    assert a.metrics == b.metrics
    c = run("ftfa", algorithm_options={"finetune_epochs": 3})
    assert c.metrics["per_client"] != a.metrics["per_client"]


def test_participation_samples_the_right_number_of_clients():
    out = run("fedavg", participation=0.3, rounds=4)
    exp = build_experiment(fs.make_config(algorithm="fedavg", **SETTINGS), data=toy_data())
    model_bytes = nbytes(exp.ctx.initial_params) + nbytes(exp.ctx.initial_buffers)
    assert all(r.bytes_up == 2 * model_bytes for r in out.result.rounds)


def test_accuracies_are_percentages_and_metrics_consistent():
    m = run().metrics
    per_env = list(m["per_env"].values())
    assert all(0 <= v <= 100 for v in per_env)
    assert m["worst"] == min(per_env)
    assert m["average"] == pytest.approx(sum(per_env) / len(per_env))
    assert m["worst_client"] == min(m["per_client"])


def test_noise_extras_keep_cohort_invariance():
    """A stochastic objective (noise added to the logits) gives the same result batched."""
    data = toy_data()
    results = []
    for size in (1, 0):
        exp = build_experiment(
            fs.make_config(algorithm="fedavg", cohort_size=size, **SETTINGS), data=data
        )
        ctx = exp.ctx

        def noisy_loss(params, buffers, extras, x, y, w, ctx=ctx):
            logits = ctx.forward(params, buffers, x) + extras["eps"]
            return fs.algorithms.common.losses.cross_entropy(logits, y, w)

        outs = []
        for chunk in exp.runner.chunks(torch.arange(data.num_clients)):
            cohort = ctx.cohort(chunk, 0)
            p, b = stack(ctx.initial_params, len(chunk)), stack(ctx.initial_buffers, len(chunk))
            outs.append(ctx.train(noisy_loss, p, b, cohort, noise={"eps": (8, 3)}).params)
        results.append({k: torch.cat([o[k] for o in outs]) for k in outs[0]})
    for k, v in results[0].items():
        torch.testing.assert_close(results[1][k], v, rtol=1e-5, atol=1e-6)


def test_loss_sees_the_environment_id_of_each_minibatch_sample():
    """Training data with environment ids hand each client's loss ``extras["env"]``."""
    data = toy_data()
    data.train.env = (data.train.y * 7 + 3) % 5  # any deterministic per-sample id
    cfg = fs.make_config(algorithm="fedavg", **{**SETTINGS, "rounds": 1})
    exp = build_experiment(cfg, data=data)
    ctx = exp.ctx
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    n = len(cohort)

    def loss(params, buffers, extras, x, y, w):
        mismatch = ((extras["env"] - (y * 7 + 3) % 5).abs() * w).sum()
        logits = ctx.forward(params, buffers, x)
        return torch.nn.functional.cross_entropy(logits, y) * 0 + mismatch

    params, buffers = stack(ctx.initial_params, n), stack(ctx.initial_buffers, n)
    out = ctx.train(loss, params, buffers, cohort, shared={})
    assert out.loss.abs().max().item() == 0.0


def test_rows_stack_chunks_like_concat_and_keep_a_single_chunk_uncopied():
    from fedshift.engine.tree import Rows, concat

    chunks = [{"w": torch.randn(n, 3, 2), "b": torch.randn(n)} for n in (4, 4, 2)]
    rows = Rows(10)
    for c in chunks:
        rows.add(c, len(c["b"]))
    out, ref = rows.result(), concat(chunks)
    assert all(torch.equal(out[k], ref[k]) for k in ref)
    assert out["w"].data_ptr() not in {c["w"].data_ptr() for c in chunks}  # its own rows
    whole = Rows(4)
    whole.add(chunks[0], 4)
    assert whole.result()["w"] is chunks[0]["w"]  # one chunk: not copied
    short = Rows(10)
    short.add(chunks[0], 4)
    with pytest.raises(ValueError, match="4 of 10"):
        short.result()
    nothing = Rows(5)  # a method that uploads nothing
    nothing.add({}, 3)
    nothing.add({}, 2)
    assert nothing.result() == {}


@pytest.mark.parametrize("execution", ["batched", "sequential"])
def test_training_from_read_only_views_matches_copies_and_returns_own_tensors(execution):
    """``stack(copy=False)`` hands ``Context.train`` one model seen n times: the round is the
    same as from n copies, the model is left as it was, the results own their memory (so
    the stacked copy a round no longer makes is not traded for aliasing), and writing into
    a view raises instead of changing every client at once."""
    data = toy_data()
    cfg = fs.make_config(algorithm="fedavg", execution=execution, **{**SETTINGS, "rounds": 1})
    exp = build_experiment(cfg, data=data)
    ctx = exp.ctx
    ids = torch.arange(data.num_clients)
    cohort = ctx.cohort(ids, 0)
    n = len(ids)
    model = {k: v.clone() for k, v in ctx.initial_params.items()}
    views = stack(model, n, copy=False)
    assert all(v.stride(0) == 0 for v in views.values())  # no memory per client
    with pytest.raises(RuntimeError):
        next(iter(views.values())).add_(1.0)
    buffers = stack(ctx.initial_buffers, n, copy=False)
    trainable = lambda k: not k.endswith("bias")  # noqa: E731 (frozen entries come back too)
    got = ctx.train(exp.algorithm.loss, views, buffers, cohort, trainable=trainable)
    want = ctx.train(
        exp.algorithm.loss,
        stack(model, n),
        stack(ctx.initial_buffers, n),
        cohort,
        trainable=trainable,
    )
    for k in model:
        torch.testing.assert_close(got.params[k], want.params[k], rtol=0, atol=0)
        assert got.params[k].stride(0) != 0 and got.params[k].is_contiguous()
        torch.testing.assert_close(model[k], ctx.initial_params[k], rtol=0, atol=0)
    assert not torch.equal(got.params[next(iter(model))][0], model[next(iter(model))])
