"""L2SGD (src/fedshift/algorithms/l2sgd.py): averaging steps and the step-size check."""

from __future__ import annotations

import pytest
import torch
from helpers import pfl_run as run


def test_l2sgd_averaging_steps_and_step_size_check():
    from fedshift.algorithms.l2sgd import pull
    from fedshift.errors import FedshiftError

    x, mean = {"w": torch.tensor([4.0, 0.0])}, {"w": torch.tensor([1.0, 1.0])}
    # two averaging steps with θ = 0.5 keep (1 − θ)² = 1/4 of the distance to the mean
    torch.testing.assert_close(pull(x, mean, torch.tensor(0.25))["w"], torch.tensor([1.75, 0.75]))
    out = run("l2sgd", algorithm_options={"lambda_": 0.5, "p": 0.2})
    theta = 0.1 * 0.5 * 0.8 / 0.2
    steps = out.result.rounds[-1].extras["averaging_steps"]
    assert out.result.server["keep"].item() == pytest.approx((1 - theta) ** steps)
    with pytest.raises(FedshiftError, match="exceeds 1"):
        run("l2sgd", algorithm_options={"lambda_": 100.0, "p": 0.1})
