"""fedshift trees ↔ Flower records, one to one.

A tree (name → tensor or sub-tree) becomes an ``ArrayRecord`` under its flattened names
(``p/fc1.weight``) with the same dtypes and shapes (bit-exact both ways); per-round scalars
(a client's training loss and aggregation weight) become a ``MetricRecord``; the run's
resolved config travels as JSON in a ``ConfigRecord``.
"""

from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord

from ..config import RunConfig, apply
from ..engine.tree import Tree, flatten, tree_map, unflatten


def to_record(tree: Tree) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in flatten(tree).items()})


def from_record(record: ArrayRecord | None, device: torch.device | str = "cpu") -> Tree:
    if record is None or len(record) == 0:
        return {}
    return unflatten({k: v.to(device) for k, v in record.to_torch_state_dict().items()})


def row(tree: Tree, j: int) -> Tree:
    """Client ``j`` of a stacked tree, keeping a client axis of length 1."""
    return tree_map(lambda v: v[j : j + 1], tree)


def job_record(key: str, config: RunConfig, round_: int, client: int) -> ConfigRecord:
    """What a node needs besides tensors: which job (run), its config, round and client."""
    return ConfigRecord(
        {
            "job": key,
            "config": json.dumps(config.flat(), sort_keys=True),
            "round": round_,
            "client": client,
        }
    )


def config_from_json(text: str) -> RunConfig:
    return apply(RunConfig(), json.loads(text)).validate()
