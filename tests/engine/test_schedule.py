"""Minibatch schedules: every client sees each of its samples once per epoch, takes its own
number of steps, and its order depends only on (seed, round, client, purpose)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshift.data.federated import Split
from fedshift.engine.schedule import make_schedule


def split_of(sizes):
    parts = [(torch.zeros(n, 2), torch.zeros(n, dtype=torch.long)) for n in sizes]
    return Split.from_clients(parts)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    batch=st.integers(1, 9),
    epochs=st.integers(1, 3),
)
def test_each_sample_once_per_epoch(sizes, batch, epochs):
    split = split_of(sizes)
    ids = torch.arange(len(sizes))
    s = make_schedule(
        split, ids, seed=1, round_=2, purpose="train", batch_size=batch, epochs=epochs
    )
    for i, n in enumerate(sizes):
        steps = int(s.steps[i])
        assert steps == epochs * -(-n // batch)
        real = s.index[i, :steps][s.weight[i, :steps] > 0]
        assert real.numel() == epochs * n
        lo = int(split.offsets[i])
        counts = torch.bincount(real - lo, minlength=n) if n else torch.zeros(0)
        assert torch.all(counts == epochs)
        assert torch.all(s.weight[i, steps:] == 0)


def test_fixed_steps_and_order_independent_of_cohort():
    split = split_of([7, 30, 3])
    full = make_schedule(
        split, torch.arange(3), seed=0, round_=0, purpose="t", batch_size=4, steps=5
    )
    assert full.steps.tolist() == [5, 5, 5]
    assert torch.all(full.weight == 1)
    alone = make_schedule(
        split, torch.tensor([1]), seed=0, round_=0, purpose="t", batch_size=4, steps=5
    )
    assert torch.equal(alone.index[0], full.index[1])
    other = make_schedule(
        split, torch.tensor([1]), seed=0, round_=1, purpose="t", batch_size=4, steps=5
    )
    assert not torch.equal(other.index[0], alone.index[0])


def test_one_batch_size_per_client_is_each_clients_own_schedule():
    import pytest

    split = split_of((5, 12, 0))
    ids = torch.tensor([0, 1, 2])
    kw = dict(seed=3, round_=0, purpose="stats", epochs=1)
    both = make_schedule(split, ids, batch_size=[2, 4, 3], **kw)
    for i, b in enumerate((2, 4, 3)):
        own = make_schedule(split, ids[i : i + 1], batch_size=b, **kw)
        s, w = int(own.steps[0]), own.index.shape[2]
        assert int(both.steps[i]) == s
        assert torch.equal(both.index[i, :s, :w], own.index[0])
        assert torch.equal(both.weight[i, :s, :w], own.weight[0])
        assert both.weight[i, s:].sum() == 0 and both.weight[i, :, w:].sum() == 0
    with pytest.raises(ValueError, match="batch sizes"):
        make_schedule(split, ids, batch_size=[2, 4], **kw)
