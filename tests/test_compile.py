"""``compile=true`` hands the cohort step to torch.compile and gives the same numbers."""

from __future__ import annotations

import pytest
import torch
from toy import toy_data

import fedshift as fs


@pytest.mark.slow
def test_compiled_step_matches_eager():
    settings = dict(lr=0.1, batch_size=8, rounds=2, model_options={"hidden": [16]})
    eager = fs.run(algorithm="fedprox", data=toy_data(), **settings)
    compiled = fs.run(algorithm="fedprox", data=toy_data(), compile=True, **settings)
    for k, v in eager.result.server.items():
        torch.testing.assert_close(compiled.result.server[k], v, rtol=1e-4, atol=1e-5)
