"""A per-client description of a built scenario (`fedshift describe scenario NAME`)."""

from __future__ import annotations

import torch

from .federated import FederatedData


def describe(data: FederatedData) -> dict:
    """Sizes, classes and environments of every client, plus the scenario's totals."""
    clients = []
    for i in range(data.num_clients):
        x, y = data.train.client(i)
        env = data.train.client_env(i)
        envs = (
            sorted({data.train_env_names[e] for e in env.tolist()})
            if env is not None and data.train_env_names
            else []
        )
        clients.append(
            {
                "client": i,
                "train": int(y.numel()),
                "classes": torch.unique(y).tolist(),
                "train_envs": envs,
                "val": {k: int(v.sizes()[i]) for k, v in data.val.items()},
                "test": {k: int(v.sizes()[i]) for k, v in data.test.items()},
            }
        )
    return {
        "name": data.name,
        "clients": data.num_clients,
        "num_classes": data.num_classes,
        "input_shape": list(data.input_shape),
        "default_model": data.default_model,
        "participation": data.participation,
        "train_envs": list(data.train_env_names),
        "val_envs": list(data.val),
        "test_envs": list(data.test),
        "per_client": clients,
    }
