"""Update rules (issue 23 item 3): a client step that returns the new values of what it
trains instead of a loss (pFedMe, CGPFL, PerInvFL state their algorithm boxes this way)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.engine.contract import SGDConfig, cross_entropy, stack, update_rule
from fedshift.engine.tree import flatten
from fedshift.experiment import build_experiment

SETTINGS = dict(rounds=1, local_epochs=2, batch_size=8, lr=0.1)


def context(execution: str = "batched", **sgd):
    exp = build_experiment(
        fs.make_config(algorithm="fedavg", execution=execution, **SETTINGS), data=toy_data()
    )
    ctx = exp.ctx
    if sgd:
        ctx = dataclasses.replace(ctx, sgd=SGDConfig(0.1, **sgd))
    cohort = ctx.cohort(torch.arange(ctx.data.num_clients), 0)
    return ctx, cohort


def test_a_rule_that_takes_the_sgd_step_trains_as_the_loss():
    ctx, cohort = context()
    n = len(cohort)
    params, buffers = stack(ctx.initial_params, n), stack(ctx.initial_buffers, n)

    def loss(p, b, extras, x, y, w):
        return cross_entropy(ctx.forward(p, b, x), y, w)

    @update_rule
    def rule(p, b, extras, x, y, w):
        g, value = torch.func.grad(lambda q: (loss(q, b, extras, x, y, w),) * 2, has_aux=True)(p)
        return {k: v - 0.1 * g[k] for k, v in p.items()}, value

    by_loss = ctx.train(loss, params, buffers, cohort)
    by_rule = ctx.train(rule, params, buffers, cohort)
    assert torch.equal(by_rule.steps, by_loss.steps)
    torch.testing.assert_close(by_rule.loss, by_loss.loss)
    for k, v in by_loss.params.items():
        torch.testing.assert_close(by_rule.params[k], v)
    assert not torch.equal(by_rule.params["head.weight"], params["head.weight"])


@pytest.mark.parametrize("execution", ["batched", "sequential"])
def test_a_rule_gets_each_clients_own_steps_and_no_momentum_or_weight_decay(execution):
    """Shift every entry by one per step: after training each client's tensors moved by
    exactly its own number of steps (finished clients are dropped, not stepped again),
    although the run's SGD has momentum and weight decay; the logged loss is the rule's."""
    ctx, cohort = context(execution, momentum=0.9, weight_decay=0.5)
    n = len(cohort)
    params = {"a": stack(ctx.initial_params, n), "count": torch.zeros(n)}

    @update_rule
    def shift(p, b, extras, x, y, w):
        new = {"a": {k: v + 1.0 for k, v in p["a"].items()}, "count": p["count"] + 1.0}
        return new, p["count"]

    out = ctx.train(shift, params, stack(ctx.initial_buffers, n), cohort)
    steps = out.steps.to(torch.float32)
    assert len(set(steps.tolist())) > 1  # the toy clients differ in size
    assert torch.equal(out.params["count"], steps)
    for k, v in flatten(out.params["a"]).items():
        moved = v - params["a"][k]
        torch.testing.assert_close(moved, steps.view(-1, *[1] * (v.dim() - 1)).expand_as(v))
    # mean of 0, 1, …, s − 1
    torch.testing.assert_close(out.loss, (steps - 1) / 2)
