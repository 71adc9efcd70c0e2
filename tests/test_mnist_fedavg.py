"""FedAvg, MLP 784-100-10, MNIST split IID over 20 clients reaches ≥ 95 % test accuracy
(real data from ../shared/datasets)."""

from __future__ import annotations

import fedshift as fs


def test_fedavg_mlp_mnist_iid_reaches_95_percent(shared_datasets):
    data = fs.scenario("iid", dataset="mnist", clients=20, data_dir=shared_datasets)
    out = fs.run(
        algorithm="fedavg",
        data=data,
        model="mlp",
        model_options={"hidden": [100]},
        rounds=12,
        lr=0.1,
        batch_size=10,
        local_epochs=1,
        seed=0,
    )
    assert out.metrics["average"] >= 95.0, out.metrics
    assert out.metrics["worst_client"] >= 90.0
