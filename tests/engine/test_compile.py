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


def test_compiled_width_buckets():
    from fedshift.engine.local import compiled_width

    assert [compiled_width(k, 20) for k in (1, 2, 3, 5, 8, 9, 17, 20)] == [
        1,
        2,
        4,
        8,
        8,
        16,
        20,
        20,
    ]
    assert compiled_width(3, 3) == 3


@pytest.mark.parametrize("algorithm", ["ditto", "fedsr", "fedprox"])
def test_bucketed_widths_give_the_same_training(algorithm):
    """What compile=true runs (steps padded to power-of-two widths, the extra clients'
    results dropped, no noise drawn for them) equals the exact-width step, in eager mode."""
    from fedshift.experiment import build_experiment

    outs = []
    for bucket in (False, True):
        cfg = fs.make_config(
            algorithm=algorithm,
            lr=0.1,
            batch_size=4,
            rounds=2,
            model_options={"hidden": [8]},
            seed=0,
        )
        exp = build_experiment(cfg, data=toy_data())
        exp.ctx.trainer.fused = False
        exp.ctx.trainer.bucket_widths = bucket
        outs.append(exp.runner.run())
    for k, v in outs[0].server.items():
        torch.testing.assert_close(outs[1].server[k], v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[1].accuracy, outs[0].accuracy)  # personal models too
    losses = [[r.loss for r in o.rounds] for o in outs]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
