"""`FederatedData`: every client's data stored flat, with offsets, so that a cohort of clients
is gathered with one index operation and memory does not grow with per-client Python objects."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .partition_file import ClientPartition


@dataclass
class Split:
    """One split (training data, or one named validation/test environment) of all clients.

    Client ``i`` owns rows ``offsets[i]:offsets[i+1]`` of ``x``/``y`` (and ``env``, the
    environment id of each training sample when the scenario has environments).
    A client may own zero rows of a split.
    """

    x: Tensor  # [M, *input_shape] float32
    y: Tensor  # [M] int64
    offsets: Tensor  # [N + 1] int64, non-decreasing, offsets[0] == 0, offsets[-1] == M
    env: Tensor | None = None  # [M] int64

    def __post_init__(self) -> None:
        self.offsets = torch.as_tensor(self.offsets, dtype=torch.int64)
        if self.x.shape[0] != self.y.shape[0] or int(self.offsets[-1]) != self.x.shape[0]:
            raise ValueError(
                f"split has {self.x.shape[0]} inputs, {self.y.shape[0]} labels and offsets "
                f"ending at {int(self.offsets[-1])}; all three must agree"
            )
        if self.env is not None and self.env.shape[0] != self.y.shape[0]:
            raise ValueError("split.env must have one environment id per sample")

    @property
    def num_clients(self) -> int:
        return self.offsets.numel() - 1

    def sizes(self) -> Tensor:
        """Samples per client, [N] int64."""
        return self.offsets[1:] - self.offsets[:-1]

    def client(self, i: int) -> tuple[Tensor, Tensor]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.x[lo:hi], self.y[lo:hi]

    def client_env(self, i: int) -> Tensor | None:
        if self.env is None:
            return None
        return self.env[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def to(self, device: torch.device | str) -> Split:
        env = None if self.env is None else self.env.to(device)
        return Split(self.x.to(device), self.y.to(device), self.offsets, env)

    @staticmethod
    def from_clients(parts: list[tuple[Tensor, Tensor]], envs: list[Tensor] | None = None) -> Split:
        """Build a split from per-client ``(x, y)`` pairs (and optional per-client env ids)."""
        sizes = [int(p[1].shape[0]) for p in parts]
        offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
        x = torch.cat([p[0] for p in parts]) if parts else torch.empty(0)
        y = torch.cat([p[1].long() for p in parts]) if parts else torch.empty(0, dtype=torch.long)
        env = torch.cat([e.long() for e in envs]) if envs is not None else None
        return Split(x.float(), y, offsets, env)


@dataclass
class FederatedData:
    """A federated scenario, ready to train on.

    ``train`` holds every client's training data (with environment ids where the scenario
    has several training environments); ``val`` and ``test`` map environment names to
    splits over the same clients. ``participation`` is the scenario's default fraction of
    clients sampled per round.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    train: Split
    test: dict[str, Split]
    val: dict[str, Split] = field(default_factory=dict)
    train_env_names: list[str] = field(default_factory=list)
    default_model: str = "mlp"
    participation: float = 1.0
    info: dict = field(default_factory=dict)
    # how build_scenario made it: {"scenario", "options", "seed", "data_dir"}; None for
    # data assembled in Python
    recipe: dict | None = None
    # which rows of a base dataset each client holds, for scenarios that only select rows
    # (iid, dirichlet, pathological, from-partition): what `data export-partition` writes
    partition: ClientPartition | None = None

    def __post_init__(self) -> None:
        n = self.train.num_clients
        for kind, splits in (("test", self.test), ("val", self.val)):
            for name, s in splits.items():
                if s.num_clients != n:
                    raise ValueError(
                        f"{kind} environment {name!r} has {s.num_clients} clients, "
                        f"training data has {n}"
                    )
        if not self.test:
            raise ValueError("a scenario needs at least one test environment")

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def test_env_names(self) -> list[str]:
        return list(self.test)

    def to(self, device: torch.device | str) -> FederatedData:
        return FederatedData(
            self.name,
            self.num_classes,
            self.input_shape,
            self.train.to(device),
            {k: v.to(device) for k, v in self.test.items()},
            {k: v.to(device) for k, v in self.val.items()},
            list(self.train_env_names),
            self.default_model,
            self.participation,
            dict(self.info),
            self.recipe,
            self.partition,
        )

    def fingerprint(self) -> str:
        """sha256 of what a run trains and is scored on: class count, input shape, every
        split's client sizes, labels and environment ids, and an even sample of up to 2^16
        input values per split, so a resume on other data (another partition, seed or
        scenario option) is caught without hashing every pixel."""
        h = hashlib.sha256(f"{self.num_classes}|{tuple(self.input_shape)}".encode())
        splits = [("train", self.train), *self.val.items(), *self.test.items()]
        for name, split in splits:
            h.update(f"|{name}|".encode())
            for t in (split.offsets, split.y, split.env):
                if t is not None:
                    h.update(t.detach().cpu().contiguous().to(torch.int64).numpy().tobytes())
            flat = split.x.reshape(-1)
            n = flat.numel()
            if n:
                # m evenly spaced positions, in integers: a float32 linspace rounds the
                # last one past n - 1 for n beyond 2^24
                m = min(n, 2**16)
                index = torch.arange(m, dtype=torch.int64) * (n - 1) // max(m - 1, 1)
                sample = flat[index.to(flat.device)].detach().cpu()
                h.update(sample.to(torch.float32).numpy().tobytes())
        return h.hexdigest()
