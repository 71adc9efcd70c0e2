"""How the general local step runs: batched over the cohort or client after client.

``vmap`` of the step is fastest where a step is many small operations (MLPs, small
objectives: the cohort shares each dispatch), but on CPU it turns every convolution into a
grouped convolution whose backward pass is slower than the clients' own convolutions run
one after another. Which wins depends on the model, the objective, the cohort width, the
threads and the device, so ``auto`` times one step of each on the first call and keeps the
faster (per process: a sweep or a table re-uses the measurement). Models without
convolutions are not timed: the batched step won every measurement there.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

EXECUTIONS = ("auto", "batched", "sequential")

# sequential must win by this factor to be chosen: near a tie the measurement is noise, and
# staying on the batched path keeps runs of the same config on the same code path
MARGIN = 1.15

# measurements shared by every trainer of the process (signature -> choice)
_MEASURED: dict[str, Choice] = {}


@dataclass(frozen=True)
class Choice:
    mode: str  # "batched" or "sequential"
    batched_s: float  # seconds per client-step, batched (nan when not measured)
    sequential_s: float  # seconds per client-step, client after client


@dataclass
class ExecutionChoice:
    """What ``auto`` chose on this trainer, keyed by the repr of the measured signature
    (stable across processes): kept in checkpoints so a resumed run takes the same path."""

    made: dict[str, Choice] = field(default_factory=dict)
    fresh: list[str] = field(default_factory=list)  # made since the runner last reported

    def get(self, signature: Hashable) -> Choice | None:
        key = repr(signature)
        if key not in self.made and key in _MEASURED:
            self.record(signature, _MEASURED[key])
        return self.made.get(key)

    def record(self, signature: Hashable, choice: Choice) -> None:
        key = repr(signature)
        self.made[key] = _MEASURED[key] = choice
        self.fresh.append(key)

    def export(self) -> dict[str, str]:
        """Signature -> mode, for a checkpoint."""
        return {k: c.mode for k, c in self.made.items()}

    def preload(self, modes: dict[str, str]) -> None:
        """The modes a checkpointed run chose (no timings: they are not re-measured)."""
        nan = float("nan")
        for key, mode in modes.items():
            if mode in ("batched", "sequential"):
                self.made[key] = Choice(mode, nan, nan)

    def report(self) -> dict[str, dict]:
        """The choices made since the last report, for the round's record."""
        out = {}
        for key in self.fresh:
            c = self.made[key]
            out[key] = {
                "mode": c.mode,
                "batched_ms": round(c.batched_s * 1e3, 3),
                "sequential_ms": round(c.sequential_s * 1e3, 3),
            }
        self.fresh.clear()
        return out


def choose(batched_s: float, sequential_s: float) -> str:
    return "sequential" if sequential_s * MARGIN < batched_s else "batched"


def time_pair(
    a: Callable[[], object], b: Callable[[], object], repeats: int = 5
) -> tuple[float, float]:
    """Seconds of ``a()`` and of ``b()``: each called once untimed (first-call costs:
    allocation, kernel selection, compilation), then alternately, so that both see the
    same machine; the minimum of each, the cost least disturbed by other processes."""
    a()
    b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return min(ta), min(tb)


def balanced_groups(steps: list[int], groups: int) -> list[list[int]]:
    """Client positions split into at most ``groups`` groups of near-equal total steps
    (longest first, each to the least-loaded group); empty groups are dropped."""
    load = [0] * groups
    out: list[list[int]] = [[] for _ in range(groups)]
    for j in sorted(range(len(steps)), key=lambda j: -steps[j]):
        g = load.index(min(load))
        out[g].append(j)
        load[g] += steps[j]
    return [g for g in out if g]


def single_threaded(loss):
    """Mark a loss that uses forward-mode AD (``torch.func.jvp``, Hessian-vector products):
    its dual levels are process-global, so its clients never run on parallel threads."""
    loss.single_threaded = True
    return loss


def client_by_client(loss):
    """Mark a loss (an update rule) written for ONE client's tensors and never under
    ``vmap`` (pFedMe's fused CNN inner descent): the trainer runs it client after client,
    whatever ``execution`` says, and does not time the batched path."""
    loss.client_by_client = True
    return loss


def default_workers(device: torch.device) -> int:
    """Client-after-client threads: one per intra-op thread on CPU; one on an accelerator,
    whose kernels queue on one stream anyway."""
    return torch.get_num_threads() if device.type == "cpu" else 1


_WORKER = threading.local()  # .replicas {id(model): (model, copy)}, .active: in a group


def replica(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself, or on a client-group thread that thread's copy of it (made on
    first use, kept for the thread's life): ``functional_call`` swaps a module's tensors
    while it runs, so two threads must never run one module object."""
    if not getattr(_WORKER, "active", False):
        return model
    pair = _WORKER.replicas.get(id(model))
    if pair is None:  # a deep copy keeps every submodule's train/eval flag
        pair = _WORKER.replicas[id(model)] = (model, copy.deepcopy(model))
    return pair[1]


def worker_thread(fn):
    """``fn`` run as a client-group thread: ``replica`` gives it its own module copies,
    whose train/eval flags are first set to their originals' (they may have changed)."""

    def run(*args):
        if not hasattr(_WORKER, "replicas"):
            _WORKER.replicas = {}
        for model, mine in _WORKER.replicas.values():
            for a, b in zip(model.modules(), mine.modules(), strict=True):
                b.training = a.training
        _WORKER.active = True
        try:
            return fn(*args)
        finally:
            _WORKER.active = False

    return run


def clear_measurements() -> None:
    """Forget the process's measurements (tests)."""
    _MEASURED.clear()
