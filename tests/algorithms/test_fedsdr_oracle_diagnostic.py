"""The FedSDR oracle-view diagnostic (docs/results/fedsdr-oracle-view/fedsdr_oracle.py): its
view is the image's colour and its stage 1 leaves Ψ as it was — else the diagnosis it backs
would be about another experiment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import fedshift as fs
from fedshift.engine.contract import flatten
from fedshift.plugins import import_module

ROOT = Path(__file__).resolve().parents[2]
DIAGNOSTIC = ROOT / "docs" / "results" / "fedsdr-oracle-view" / "fedsdr_oracle.py"


@pytest.mark.skipif(
    not (Path(os.environ.get("FEDSHIFT_DATA", "")) / "mnist").exists(),
    reason="needs MNIST under $FEDSHIFT_DATA",
)
def test_oracle_view_is_the_colour_and_stage_one_is_skipped():
    import_module(str(DIAGNOSTIC))
    from fedshift.algorithms.base import ALGORITHMS

    cls = ALGORITHMS.get("fedsdr-oracle-colour")
    x = torch.zeros(3, 2, 4, 4)
    x[0, 0, 1, 1] = 0.7  # ink in channel 0 only
    x[1, 1] = 0.2  # channel 1 only
    x[2, :, 0, 0] = 0.5  # both (not in cmnist; shares 1/2)
    view = cls.shortcut(None, {}, x)
    assert torch.allclose(view, torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))
    common = dict(
        algorithm="fedsdr-oracle-colour",
        scenario="cmnist",
        scenario_options={"samples": 800, "test_samples": 200},
        rounds=1,
        batch_size=64,
        algorithm_options={"gamma": 0.1, "personal_epochs": 1},
    )
    a, b = fs.run(lr=0.1, **common), fs.run(lr=0.05, **common)
    psi_a, psi_b = flatten(a.result.server["sd"]), flatten(b.result.server["sd"])
    for name, v in psi_a.items():  # a trained Ψ would differ with the lr
        torch.testing.assert_close(psi_b[name], v, rtol=0, atol=0, msg=name)
    assert not torch.equal(a.result.accuracy, b.result.accuracy)  # f_u did train
