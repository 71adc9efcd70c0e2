"""Nested state trees: the engine's tree helpers, training, checkpoints and Flower records
handle ``{"pm": {...}, "nu": {...}}`` as they handled flat mappings (issue 23, item 2)."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs
from fedshift.engine.tree import (
    Rows,
    clone,
    concat,
    flatten,
    is_nested,
    leaves,
    nbytes,
    put,
    stack,
    take,
    tree_map,
    unflatten,
    weighted_mean,
)
from fedshift.experiment import build_experiment

SETTINGS = dict(rounds=2, local_epochs=1, batch_size=8, lr=0.1)


def nested(n: int = 3) -> dict:
    return {
        "pm": {"fc.weight": torch.randn(n, 4, 2), "fc.bias": torch.randn(n, 4)},
        "opt": {"m": {"p": {"fc.weight": torch.randn(n, 4, 2)}}},
        "count": torch.arange(n),
    }


def test_flatten_names_paths_and_unflatten_inverts_it():
    tree = nested()
    flat = flatten(tree)
    assert list(flat) == ["pm/fc.weight", "pm/fc.bias", "opt/m/p/fc.weight", "count"]
    back = unflatten(flat)
    assert (
        back.keys() == tree.keys()
        and back["opt"]["m"]["p"]["fc.weight"] is flat["opt/m/p/fc.weight"]
    )
    assert flatten(back) == flat
    assert is_nested(tree) and not is_nested(flat)
    assert flatten({"a": {}}) == {}  # an empty sub-tree has no leaves


def test_tree_helpers_recurse_into_sub_trees():
    tree = nested(3)
    assert nbytes(tree) == sum(v.numel() * v.element_size() for v in flatten(tree).values())
    assert len(list(leaves(tree))) == 4
    one = take(tree, 1)
    assert torch.equal(one["opt"]["m"]["p"]["fc.weight"], tree["opt"]["m"]["p"]["fc.weight"][1])
    assert take(tree, torch.tensor([2, 0]))["pm"]["fc.bias"].shape == (2, 4)
    copy = clone(tree)
    put(copy, torch.tensor([0]), tree_map(lambda v: torch.zeros_like(v[:1]), tree))
    assert float(copy["pm"]["fc.weight"][0].abs().sum()) == 0.0
    assert torch.equal(copy["pm"]["fc.weight"][1:], tree["pm"]["fc.weight"][1:])
    stacked = stack(take(tree, 0), 5)
    assert stacked["opt"]["m"]["p"]["fc.weight"].shape == (5, 4, 2)
    mean = weighted_mean(tree, torch.tensor([1.0, 1.0, 2.0]))
    expect = (tree["pm"]["fc.bias"] * torch.tensor([0.25, 0.25, 0.5])[:, None]).sum(0)
    torch.testing.assert_close(mean["pm"]["fc.bias"], expect)
    assert torch.equal(mean["count"], tree["count"][0])  # integers are not averaged


def test_weighted_mean_in_blocks_is_the_float64_mean(monkeypatch):
    """Averaged a block of columns at a time (the float64 copy stays within MEAN_ELEMENTS
    whatever the cohort), the mean is the float64 weighted sum rounded once, whatever the
    block."""
    import fedshift.engine.tree as tree_module

    v = torch.randn(5, 7, 3, generator=torch.Generator().manual_seed(0))
    w = torch.tensor([3.0, 1.0, 0.0, 2.0, 4.0])
    whole = weighted_mean({"v": v}, w)["v"]
    expect = (v.double() * (w.double() / w.sum())[:, None, None]).sum(0).float()
    assert torch.equal(whole, expect)
    monkeypatch.setattr(tree_module, "MEAN_ELEMENTS", 20)  # 5 clients: blocks of 4 columns
    seen = []
    double = torch.Tensor.double
    monkeypatch.setattr(torch.Tensor, "double", lambda t: seen.append(t.numel()) or double(t))
    assert torch.equal(weighted_mean({"v": v}, w)["v"], whole)
    assert seen == [20] * 5 + [5]  # 21 columns: the float64 copies stay within the bound


def test_rows_and_concat_keep_the_nesting():
    chunks = [nested(n) for n in (2, 3)]
    rows = Rows(5)
    for c in chunks:
        rows.add(c, len(c["count"]))
    out, ref = rows.result(), concat(chunks)
    assert flatten(out).keys() == flatten(ref).keys()
    for k, v in flatten(ref).items():
        assert torch.equal(flatten(out)[k], v)


def test_training_nested_params_equals_training_their_flat_form():
    """ctx.train on {"a": model, "b": model} gives what the same loss written over the
    flattened names gives, to the bit, and ``trainable`` sees the flattened names."""
    data = toy_data()
    exp = build_experiment(fs.make_config(algorithm="fedavg", **SETTINGS), data=data)
    ctx = exp.ctx
    cohort = ctx.cohort(torch.arange(data.num_clients), 0)
    n = len(cohort)
    model = stack(ctx.initial_params, n)
    buffers = stack(ctx.initial_buffers, n)

    def nested_loss(params, buffers, extras, x, y, w):
        a = ctx.forward(params["a"], buffers, x)
        b = ctx.forward(params["b"], buffers, x)
        pull = sum(((params["a"][k] - extras["anchor"][k]) ** 2).sum() for k in params["a"])
        return fs.algorithms.common.losses.cross_entropy(a + 0.5 * b, y, w) + 0.1 * pull

    def flat_loss(params, buffers, extras, x, y, w):
        a = {k[2:]: v for k, v in params.items() if k.startswith("a/")}
        b = {k[2:]: v for k, v in params.items() if k.startswith("b/")}
        anchor = {k[7:]: v for k, v in extras.items() if k.startswith("anchor/")}
        pull = sum(((a[k] - anchor[k]) ** 2).sum() for k in a)
        return (
            fs.algorithms.common.losses.cross_entropy(
                ctx.forward(a, buffers, x) + 0.5 * ctx.forward(b, buffers, x), y, w
            )
            + 0.1 * pull
        )

    anchor = tree_map(lambda v: v + 0.01, model)
    seen = []

    def trainable(name):
        seen.append(name)
        return name.startswith("a/")

    got = ctx.train(
        nested_loss,
        {"a": model, "b": model},
        buffers,
        cohort,
        per_client={"anchor": anchor},
        trainable=trainable,
    )
    want = ctx.train(
        flat_loss,
        flatten({"a": model, "b": model}),
        buffers,
        cohort,
        per_client=flatten({"anchor": anchor}),
        trainable=lambda k: k.startswith("a/"),
    )
    assert set(seen) == set(flatten({"a": model, "b": model}))
    assert flatten(got.params).keys() == want.params.keys()
    for k, v in want.params.items():
        assert torch.equal(flatten(got.params)[k], v), k
    assert torch.equal(got.loss, want.loss)
    assert torch.equal(got.params["b"]["head.weight"], model["head.weight"])  # frozen
    assert not torch.equal(got.params["a"]["head.weight"], model["head.weight"])


@pytest.mark.parametrize("algorithm", ["ditto", "scaffold"])
def test_checkpoints_store_flat_names_and_restore_the_nesting(algorithm):
    """A checkpoint holds "/"-joined names (what the prefixed state of earlier versions
    held), and a run continued from it equals the run that went straight through."""
    data = toy_data()
    cfg = fs.make_config(algorithm=algorithm, **{**SETTINGS, "rounds": 2})
    straight = build_experiment(cfg, data=data)
    result = straight.runner.new_result()
    for r in range(2):
        result.rounds.append(straight.runner.train_round(r))

    first = build_experiment(cfg, data=data)
    part = first.runner.new_result()
    part.rounds.append(first.runner.train_round(0))
    state = first.runner.state_dict(part, 1)
    assert all(isinstance(v, torch.Tensor) for v in state["server"].values())
    assert any("/" in k for k in state["server"])
    resumed = build_experiment(cfg, data=data)
    resumed.runner.load_state_dict(state)
    resumed.runner.train_round(1)
    for k, v in flatten(straight.runner.server).items():
        assert torch.equal(flatten(resumed.runner.server)[k], v), k
    assert flatten(resumed.runner.store.state).keys() == flatten(straight.runner.store.state).keys()


def test_empty_parts_come_back_from_the_template_and_put_skips_them():
    """A model without buffers (``"b": {}``) or DFL's bank on a parameter-free extractor
    (``{"p": {}, "b": {}}``) has nothing to save: restoring puts the parts back, and
    writing rows that carry an empty part into a state without it is no error."""
    from fedshift.engine.tree import empty_parts_like

    like = {"w": torch.zeros(2, 3), "b": {}, "bank": {"p": {}, "b": {}}, "m": {"x": torch.ones(2)}}
    back = empty_parts_like(unflatten(flatten(like)), like)
    assert back.keys() == like.keys() and back["bank"] == {"p": {}, "b": {}}
    state = unflatten(flatten(like))
    put(state, torch.tensor([1]), {"w": torch.ones(1, 3), "b": {}, "m": {"x": torch.zeros(1)}})
    assert torch.equal(state["w"][1], torch.ones(3)) and float(state["m"]["x"][1]) == 0.0
