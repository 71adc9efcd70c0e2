"""``from-partition``: clients given as index lists in a file over a base dataset (MNIST,
Fashion-MNIST, digits, CIFAR-10, EMNIST) — a split made by Flower Datasets, FL-bench or
PFLlib, or one exported from a fedshift scenario with ``fedshift data export-partition``
(formats: :mod:`fedshift.data.partition_file`, ``docs/partitions.md``).

Lists the file lacks are made as ``iid`` and ``dirichlet`` make them, so a partition of
the training set alone (what Flower Datasets produces) is enough: ``test`` is drawn from
the official test set with each client's training label mix, then ``val`` is a random
``val_fraction`` of each client's training indices. An exported partition holds all three
lists, so importing it rebuilds the exported scenario's tensors exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import FedshiftError
from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData
from ..partition_file import ClientPartition, labels_digest, read_partition
from ..registry import register_scenario
from .basic import DATASETS, gather, load_images, num_classes, require_split_options


@dataclass
class FromPartitionOptions:
    file: str = opt("", "JSON or NPZ file of per-client index lists (docs/partitions.md)")
    dataset: str = opt("", f"base dataset when the file names none: {', '.join(DATASETS)}")
    val_fraction: float = opt(
        0.1, "share of each client's training indices held out as 'val' if the file has none"
    )
    participation: float = opt(1.0, "default fraction of clients sampled per round")
    download: bool = opt(False, "download missing dataset files (off: offline)")

    def __post_init__(self) -> None:
        require(bool(self.file), "scenario.file is required: the partition file to read")
        require(
            self.dataset in ("", *DATASETS),
            f"scenario.dataset={self.dataset!r} is not one of: {', '.join(DATASETS)}",
        )
        require_split_options(self.val_fraction, self.participation)


def _dataset(part: ClientPartition, o: FromPartitionOptions, where: str) -> str:
    if part.dataset and o.dataset and part.dataset != o.dataset:
        raise FedshiftError(
            f"{where} indexes {part.dataset!r}, but scenario.dataset={o.dataset!r}; "
            "leave scenario.dataset unset"
        )
    dataset = part.dataset or o.dataset
    if not dataset:
        raise FedshiftError(f"{where} names no dataset; give scenario.dataset")
    if dataset not in DATASETS:
        raise FedshiftError(
            f"{where} indexes dataset {dataset!r}; from-partition reads {', '.join(DATASETS)}"
        )
    return dataset


def _check_range(where: str, split: str, part: P.Partition, size: int, what: str) -> None:
    if len(part.indices) and int(part.indices.max()) >= size:
        hint = (
            " (if its indices run over the training set followed by the test set, as "
            'FL-bench\'s and PFLlib\'s do, set "pool": "train+test")'
            if what.endswith("training set")
            else ""
        )
        raise FedshiftError(
            f"{where}: {split!r} index {int(part.indices.max())} is out of range: {what} "
            f"has {size} images{hint}"
        )


@register_scenario(
    "from-partition",
    FromPartitionOptions,
    "clients as index lists from a JSON/NPZ file (Flower Datasets, FL-bench, PFLlib, export)",
)
def build_from_partition(o: FromPartitionOptions, seed: int, data_dir: Path | None):
    where = f"partition file {o.file!r}"
    part = read_partition(o.file)
    dataset = _dataset(part, o, where)
    emnist = (part.emnist_split or "balanced") if dataset == "emnist" else None
    x, y = load_images(dataset, True, data_dir, o.download, emnist or "balanced")
    tx, ty = load_images(dataset, False, data_dir, o.download, emnist or "balanced")
    splits = dict(part.splits)
    if part.pool == "train+test":
        both = (torch.cat([x, tx]), torch.cat([y, ty]))
        pools = dict.fromkeys(("train", "val", "test"), both)
        names = dict.fromkeys(pools, f"{dataset}'s training set followed by its test set")
    else:
        pools = {"train": (x, y), "val": (x, y), "test": (tx, ty)}
        names = {"train": f"{dataset}'s training set", "val": f"{dataset}'s training set"}
        names["test"] = f"{dataset}'s test set"
    for s, p in splits.items():
        _check_range(where, s, p, len(pools[s][1]), names[s])
    if "test" not in splits:  # as iid/dirichlet: the official test set, the train label mix
        totals = P.apportion(len(ty), splits["train"].sizes())
        rng = P.make_rng(seed, "from-partition/test")
        splits["test"] = P.match_label_mix(splits["train"], y.numpy(), ty.numpy(), totals, rng)
    if "val" not in splits:
        rng = P.make_rng(seed, "from-partition/val")
        splits["train"], splits["val"] = P.split_fraction(splits["train"], o.val_fraction, rng)
    built = {s: gather(*pools[s], splits[s]) for s in ("train", "val", "test")}
    digests = {s: labels_digest(b.y) for s, b in built.items()}
    for s, want in part.labels_sha256.items():
        if s in part.splits and digests.get(s) != want:
            raise FedshiftError(
                f"{where}: the labels at its {s!r} indices differ from those it was written "
                f"with, so it indexes another ordering of {dataset} (or another dataset)"
            )
    return FederatedData(
        name="from-partition",
        num_classes=num_classes(dataset, emnist or "balanced"),
        input_shape=(1, *x.shape[1:]) if x.dim() == 3 else tuple(x.shape[1:]),
        train=built["train"],
        test={"test": built["test"]},
        val={"val": built["val"]},
        default_model="fedavg-cnn" if dataset == "cifar10" else "mlp",
        participation=o.participation,
        info={"dataset": dataset, "partition_file": str(o.file), "source": part.source},
        partition=ClientPartition(dataset, splits, part.pool, emnist, digests, part.source),
    )
