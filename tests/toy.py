"""A tiny synthetic federated problem for engine tests: Gaussian class blobs, clients of
chosen (very unequal) sizes, two test environments with shifted means."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from fedshift.data.federated import FederatedData, Split


def toy_data(sizes=(5, 37, 120, 64, 9, 200, 33), dim=6, classes=3, seed=0) -> FederatedData:
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, dim, generator=g) * 2

    def sample(n, shift):
        y = torch.randint(0, classes, (n,), generator=g)
        x = means[y] + torch.randn(n, dim, generator=g) + shift
        return x, y

    train = Split.from_clients([sample(n, 0.0) for n in sizes])
    test = {
        "near": Split.from_clients([sample(20, 0.0) for _ in sizes]),
        "far": Split.from_clients([sample(20, 1.5) for _ in sizes]),
    }
    val = {"val": Split.from_clients([sample(10, 0.5) for _ in sizes])}
    return FederatedData(
        name="toy",
        num_classes=classes,
        input_shape=(dim,),
        train=train,
        test=test,
        val=val,
        default_model="mlp",
    )


def toy_env_data(seed: int = 0) -> FederatedData:
    """:func:`toy_data` with two training environments (env id per sample, alternating
    over clients), for methods that need environment labels (FedSDR, DRFA …)."""
    data = toy_data(seed=seed)
    sizes = data.train.sizes().tolist()
    data.train.env = torch.cat(
        [torch.full((n,), i % 2, dtype=torch.int64) for i, n in enumerate(sizes)]
    )
    data.train_env_names = ["e0", "e1"]
    return data


def algorithm_test_data(algorithm: str):
    """A factory of the tiny problem generic per-algorithm tests (resume, cohort size) use:
    with environment ids for every method, since methods that need none must ignore them
    (their losses see ``extras["env"]`` all the same)."""
    return toy_env_data


@contextmanager
def power_cut_at(monkeypatch, round_: int | None = None, *, call: int | None = None):
    """Make ``Runner.train_round`` raise in round ``round_`` of every run, or at its
    ``call``-th call counted over the runs of a command (a simulated crash), then undo it."""
    from fedshift.engine.runner import Runner

    original = Runner.train_round
    calls = [0]

    def crash(self, r):
        calls[0] += 1
        if r == round_ or calls[0] == call:
            raise RuntimeError("power cut")
        return original(self, r)

    monkeypatch.setattr(Runner, "train_round", crash)
    try:
        yield
    finally:
        monkeypatch.setattr(Runner, "train_round", original)
