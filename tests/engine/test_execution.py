"""``execution``: batched and client-after-client local steps train every algorithm to the
same numbers (float32 rounding), on MLPs and convolutions (with batch-norm buffers), and
``auto`` records what it timed and chose."""

from __future__ import annotations

import pytest
import torch
from toy import algorithm_test_data

import fedshift as fs
from fedshift.algorithms import ALGORITHMS
from fedshift.data.federated import FederatedData, Split
from fedshift.engine import execution
from fedshift.engine.tree import flatten
from fedshift.errors import FedshiftError

# batched (bmm, grouped convolutions) and per-client (mm, convolutions) kernels round
# differently; inner loops (pFedMe-style) amplify it to ~1e-5 relative after two rounds
SETTINGS = dict(lr=0.05, batch_size=32, rounds=2, model_options={"hidden": [8]})


@pytest.fixture
def two_workers(monkeypatch):
    """Client groups on two threads whatever the machine's thread count (the threaded path
    is the one that could mix clients' states)."""
    monkeypatch.setattr("fedshift.engine.local.default_workers", lambda device: 2)


def assert_same_run(a, b) -> None:
    assert a.metrics["per_client"] == pytest.approx(b.metrics["per_client"], abs=1e-6)
    for k, v in a.result.server.items():
        torch.testing.assert_close(b.result.server[k], v, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b.result.accuracy, a.result.accuracy, rtol=0, atol=1e-4)
    losses = [r.loss for r in a.result.rounds]
    assert [r.loss for r in b.result.rounds] == pytest.approx(losses, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_sequential_equals_batched(algorithm, two_workers):
    data = algorithm_test_data(algorithm)
    batched = fs.run(algorithm=algorithm, data=data(), execution="batched", **SETTINGS)
    sequential = fs.run(algorithm=algorithm, data=data(), execution="sequential", **SETTINGS)
    assert_same_run(batched, sequential)


def tiny_images(seed: int = 0) -> FederatedData:
    """Four clients of 1×12×12 images whose class is the bright quadrant."""
    g = torch.Generator().manual_seed(seed)

    def sample(n):
        y = torch.randint(0, 4, (n,), generator=g)
        x = torch.rand(n, 1, 12, 12, generator=g) * 0.3
        for i, c in enumerate(y.tolist()):
            r, q = divmod(c, 2)
            x[i, 0, r * 6 : r * 6 + 6, q * 6 : q * 6 + 6] += 1.0
        return x, y

    sizes = (30, 11, 52, 7)
    return FederatedData(
        name="quadrants",
        num_classes=4,
        input_shape=(1, 12, 12),
        train=Split.from_clients([sample(n) for n in sizes]),
        test={"test": Split.from_clients([sample(10) for _ in sizes])},
        default_model="fedavg-cnn",
    )


@pytest.mark.parametrize(
    ("algorithm", "model"),
    [("fedavg", "fedavg-cnn"), ("fedprox", "lenet5"), ("fedbn", "dfl-cnn"), ("ditto", "lenet5")],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_sequential_equals_batched_on_convolutions(algorithm, model, workers, monkeypatch):
    monkeypatch.setattr("fedshift.engine.local.default_workers", lambda device: workers)
    common = dict(algorithm=algorithm, model=model, lr=0.05, batch_size=8, rounds=2)
    batched = fs.run(data=tiny_images(), execution="batched", **common)
    sequential = fs.run(data=tiny_images(), execution="sequential", **common)
    assert_same_run(batched, sequential)


def test_auto_times_both_and_keeps_its_choice(monkeypatch):
    execution.clear_measurements()
    seen = []
    original = execution.choose

    def spy(batched_s, sequential_s):
        seen.append((batched_s, sequential_s))
        return original(batched_s, sequential_s)

    monkeypatch.setattr("fedshift.engine.local.choose", spy)
    # FedSR's objective: cross-entropy of a CNN (FedAvg's, FedProx's, SCAFFOLD's) takes the
    # fused CNN step, which is never timed
    common = dict(algorithm="fedsr", model="lenet5", lr=0.05, batch_size=8, rounds=3)
    auto = fs.run(data=tiny_images(), execution="auto", **common)
    assert len(seen) == 1, "auto measures once per objective and width, not every round"
    assert all(t > 0 for t in seen[0])
    mode = original(*seen[0])
    forced = fs.run(data=tiny_images(), execution=mode, **common)
    got = flatten(auto.result.server)
    for k, v in flatten(forced.result.server).items():
        assert torch.equal(got[k], v), "auto must run exactly the chosen path"


def test_choose_needs_a_clear_win():
    assert execution.choose(1.0, 0.5) == "sequential"
    assert execution.choose(1.0, 0.95) == "batched"  # within the margin: stay batched
    assert execution.choose(0.5, 1.0) == "batched"


def test_unknown_execution_is_one_sentence():
    with pytest.raises(FedshiftError, match="execution 'fast' is not one of auto, batched"):
        fs.make_config(execution="fast")


def test_a_resumed_run_takes_the_path_auto_chose(monkeypatch):
    """The checkpoint keeps auto's choices: a resumed run does not time again (and so
    cannot switch path and change the numbers' rounding half-way)."""
    from fedshift.experiment import build_experiment

    execution.clear_measurements()
    # FedPAC on a CNN: its two objectives of its own (no fused CNN step) are timed
    cfg = fs.make_config(algorithm="fedpac", model="lenet5", lr=0.05, batch_size=8, rounds=2)
    first = build_experiment(cfg, data=tiny_images())
    result = first.runner.new_result()
    result.rounds.append(first.runner.train_round(0))
    state = first.runner.state_dict(result, 1)
    assert set(state["execution"].values()) <= {"batched", "sequential"}
    assert len(state["execution"]) == 2

    execution.clear_measurements()  # a fresh process would have none

    def no_timing(*args, **kwargs):
        raise AssertionError("a resumed run must not time the paths again")

    monkeypatch.setattr("fedshift.engine.local.LocalTrainer._measure", no_timing)
    resumed = build_experiment(cfg, data=tiny_images())
    resumed.runner.load_state_dict(state)
    resumed.runner.train_round(1)
    assert resumed.ctx.trainer.choices.export() == state["execution"]


def test_threads_is_validated_and_applied():
    with pytest.raises(FedshiftError, match="threads must lie in 0..4096"):
        fs.make_config(threads=-1)
    before = torch.get_num_threads()
    try:
        fs.run(data=tiny_images(), algorithm="fedavg", model="lenet5", rounds=1, threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_execution_and_threads_do_not_change_what_a_run_is():
    """Left at their defaults they are not stored (runs keep the keys stored runs always
    had), and a paper table's --resume finds a run whatever they were."""
    from fedshift.jobs import _identity

    plain = fs.make_config(algorithm="fedprox").flat()
    assert "execution" not in plain and "threads" not in plain
    pinned = fs.make_config(algorithm="fedprox", execution="batched", threads=1).flat()
    assert pinned["execution"] == "batched" and pinned["threads"] == 1
    assert _identity(plain) == _identity(pinned)
