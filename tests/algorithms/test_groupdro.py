"""GroupDRO (src/fedshift/algorithms/groupdro.py): cohort invariance and q on the simplex."""

from __future__ import annotations

import pytest
import torch
from helpers import ood_run as run


def test_groupdro_cohort_invariance_and_q_simplex():
    outs = [run("groupdro", cohort_size=c) for c in (1, 3, 0)]
    for o in outs[1:]:
        assert o.metrics["per_client"] == pytest.approx(outs[0].metrics["per_client"], abs=1e-9)
        for k, v in outs[0].result.server.items():
            torch.testing.assert_close(o.result.server[k], v, rtol=1e-5, atol=1e-6)
    q = outs[0].result.server["q"]
    assert q.sum().item() == pytest.approx(1.0) and (q > 0).all()
