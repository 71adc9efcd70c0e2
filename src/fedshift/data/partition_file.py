"""Client partitions as files: which images of a base dataset each client holds, so that a
split made by another framework (Flower Datasets, FL-bench, PFLlib) runs here, and ours
runs there. ``fedshift data export-partition`` writes one; the ``from-partition`` scenario
reads one. The formats are described in ``docs/partitions.md``:

JSON::

    {"format": "fedshift-partition", "version": 1, "dataset": "mnist", "pool": "separate",
     "clients": [{"train": [4, 17, …], "val": […], "test": […]}, …],
     "labels_sha256": {"train": "…", …}, "source": {"scenario": "dirichlet", …}}

NPZ (``numpy.load`` without pickle): 0-d string arrays ``format``, ``dataset``, ``pool``
(and ``emnist_split``), an int ``version``, and per split ``S`` the int64 arrays ``S``
(every client's indices, concatenated) and ``S_offsets`` (client ``i`` owns
``S[S_offsets[i]:S_offsets[i+1]]``); ``labels_sha256`` and ``source`` as JSON text.

With ``pool = "separate"`` (the default) ``train`` and ``val`` index the dataset's official
training set and ``test`` its test set; with ``"train+test"`` every list indexes the
training set followed by the test set (FL-bench's and PFLlib's pool).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FedshiftError
from .partition import Partition, _offsets

FORMAT = "fedshift-partition"
VERSION = 1
SPLITS = ("train", "val", "test")
POOLS = ("separate", "train+test")


@dataclass(frozen=True)
class ClientPartition:
    """Per split (``train`` always; ``val``, ``test`` when given), which indices of
    ``dataset`` each client owns."""

    dataset: str
    splits: dict[str, Partition]
    pool: str = "separate"
    emnist_split: str | None = None  # the EMNIST split, for dataset = emnist
    labels_sha256: dict[str, str] = field(default_factory=dict)  # per split, to catch
    # a file that indexes another ordering of the dataset
    source: dict[str, Any] | None = None  # how it was made (scenario, options, seed)

    @property
    def num_clients(self) -> int:
        return self.splits["train"].num_clients

    def client(self, i: int) -> dict[str, list[int]]:
        return {s: p.client(i).tolist() for s, p in self.splits.items()}


def labels_digest(labels) -> str:
    """sha256 of a label sequence (as int64), the file's check that it indexes our order."""
    arr = np.asarray(labels.cpu() if hasattr(labels, "cpu") else labels, dtype=np.int64)
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def write_partition(part: ClientPartition, path: str | Path) -> Path:
    """Write ``part`` as JSON or NPZ, chosen by the file's suffix."""
    path = Path(path)
    if path.suffix not in (".json", ".npz"):
        raise FedshiftError(f"{str(path)!r}: a partition file ends in .json or .npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    head: dict[str, Any] = {"format": FORMAT, "version": VERSION, "dataset": part.dataset}
    head["pool"] = part.pool
    if part.emnist_split:
        head["emnist_split"] = part.emnist_split
    if path.suffix == ".json":
        clients = [part.client(i) for i in range(part.num_clients)]
        doc = {**head, "clients": clients, "labels_sha256": part.labels_sha256}
        if part.source is not None:
            doc["source"] = part.source
        path.write_text(json.dumps(doc) + "\n")
        return path
    arrays: dict[str, Any] = {k: np.array(v) for k, v in head.items()}
    for s, p in part.splits.items():
        arrays[s] = p.indices.astype(np.int64)
        arrays[f"{s}_offsets"] = p.offsets.astype(np.int64)
    arrays["labels_sha256"] = np.array(json.dumps(part.labels_sha256))
    if part.source is not None:
        arrays["source"] = np.array(json.dumps(part.source))
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def read_partition(path: str | Path) -> ClientPartition:
    """Read and check a partition file; one sentence naming the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise FedshiftError(f"partition file {str(path)!r} does not exist")
    reader = {".json": _read_json, ".npz": _read_npz}.get(path.suffix)
    if reader is None:
        raise FedshiftError(f"partition file {str(path)!r} must end in .json or .npz")
    try:
        return reader(path)
    except FedshiftError as e:
        raise FedshiftError(f"partition file {str(path)!r}: {e}") from None


def _read_json(path: Path) -> ClientPartition:
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FedshiftError(f"not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("clients"), list):
        raise FedshiftError('expected an object with a "clients" list (docs/partitions.md)')
    clients = doc["clients"]
    if not clients:
        raise FedshiftError("has no clients")
    names = None
    for i, c in enumerate(clients):
        if not isinstance(c, dict) or "train" not in c:
            raise FedshiftError(f'client {i} must be an object with a "train" list')
        unknown = set(c) - set(SPLITS)
        if unknown:
            raise FedshiftError(
                f"client {i} has key {sorted(unknown)[0]!r}; allowed: {', '.join(SPLITS)}"
            )
        if names is not None and set(c) != names:
            raise FedshiftError(
                f"client {i} gives the lists {sorted(c)}, client 0 gives {sorted(names)}; "
                "every client must give the same ones"
            )
        names = set(c)
    splits = {}
    for s in SPLITS:
        if s in names:
            lists = [_index_list(c[s], f"client {i}'s {s!r}") for i, c in enumerate(clients)]
            sizes = np.array([len(v) for v in lists], dtype=np.int64)
            flat = np.concatenate(lists) if lists else np.zeros(0, np.int64)
            splits[s] = Partition(flat.astype(np.int64), _offsets(sizes))
    return _checked(doc, splits)


def _index_list(value, what: str) -> np.ndarray:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise FedshiftError(f"{what} must be a list of integer indices")
    return np.asarray(value, dtype=np.int64).reshape(-1)


def _read_npz(path: Path) -> ClientPartition:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise FedshiftError(f"not a readable NPZ file ({e})") from None
    head = {}
    for key in ("format", "dataset", "pool", "emnist_split", "version"):
        if key in arrays:
            head[key] = arrays[key].item() if arrays[key].ndim == 0 else None
    for key in ("labels_sha256", "source"):
        if key in arrays:
            try:
                head[key] = json.loads(str(arrays[key].item()))
            except (ValueError, TypeError):
                raise FedshiftError(f"{key!r} is not JSON text") from None
    if "train" not in arrays:
        raise FedshiftError("has no 'train' array")
    splits = {}
    for s in SPLITS:
        if s not in arrays:
            continue
        if f"{s}_offsets" not in arrays:
            raise FedshiftError(f"has {s!r} but no {s + '_offsets'!r}")
        idx, off = arrays[s], arrays[f"{s}_offsets"]
        if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in (idx, off)):
            raise FedshiftError(f"{s!r} and {s + '_offsets'!r} must be 1-d integer arrays")
        off = off.astype(np.int64)
        if len(off) < 2 or off[0] != 0 or off[-1] != len(idx) or np.any(np.diff(off) < 0):
            raise FedshiftError(
                f"{s + '_offsets'!r} must start at 0, never decrease and end at len({s!r}) = "
                f"{len(idx)}"
            )
        splits[s] = Partition(idx.astype(np.int64), off)
    return _checked(head, splits)


def _checked(head: dict, splits: dict[str, Partition]) -> ClientPartition:
    """Header values and the shape of the lists, before any dataset is loaded."""
    if head.get("format", FORMAT) != FORMAT:
        raise FedshiftError(f"format {head['format']!r} is not {FORMAT!r}")
    version = head.get("version", VERSION)
    if not isinstance(version, int) or version > VERSION:
        raise FedshiftError(
            f"version {version!r} is newer than this fedshift reads ({VERSION}); upgrade it"
        )
    pool = head.get("pool", "separate")
    if pool not in POOLS:
        raise FedshiftError(f"pool {pool!r} is not one of: {', '.join(POOLS)}")
    n = splits["train"].num_clients
    for s, p in splits.items():
        if p.num_clients != n:
            raise FedshiftError(f"{s!r} has {p.num_clients} clients, 'train' has {n}")
        if len(p.indices) and int(p.indices.min()) < 0:
            raise FedshiftError(f"{s!r} holds a negative index ({int(p.indices.min())})")
    empty = np.flatnonzero(splits["train"].sizes() == 0)
    if n == 0 or len(empty):
        which = f"client {int(empty[0])} has" if len(empty) else "there are"
        raise FedshiftError(f"{which} no training indices; every client needs at least one")
    if pool == "train+test" and "test" not in splits:
        raise FedshiftError(
            "pool 'train+test' needs 'test' lists: a test set drawn from the official test "
            "set could overlap the training lists"
        )
    dataset = head.get("dataset")
    digests = head.get("labels_sha256") or {}
    if not isinstance(digests, dict):
        raise FedshiftError("labels_sha256 must map split names to sha256 hex digests")
    return ClientPartition(
        dataset=str(dataset) if dataset else "",
        splits=splits,
        pool=pool,
        emnist_split=head.get("emnist_split") or None,
        labels_sha256={str(k): str(v) for k, v in digests.items()},
        source=head.get("source") if isinstance(head.get("source"), dict) else None,
    )


def export_partition(data, path: str | Path) -> Path:
    """Write the partition a scenario built (``data.partition``), with how it was made, to
    ``path``; one sentence for a scenario that makes or transforms its images."""
    if data.partition is None:
        raise FedshiftError(
            f"scenario {data.name!r} records no index lists (it makes or transforms its "
            "images), so it has no partition to export; iid, dirichlet, pathological (without "
            "standardize) and from-partition do"
        )
    recipe = data.recipe or {}
    source = {k: recipe[k] for k in ("scenario", "options", "seed") if k in recipe}
    source = json.loads(json.dumps(source, default=str)) if source else data.partition.source
    return write_partition(replace(data.partition, source=source), path)
