"""FedRep (src/fedshift/algorithms/fedrep.py): zero head epochs and the server's plain mean."""

from __future__ import annotations

import torch
from helpers import baseline_experiment as experiment
from helpers import client_state

from fedshift.algorithms.base import RoundInfo


def test_fedrep_zero_head_epochs_keeps_initial_heads_and_averages_uniformly():
    exp, _ = experiment("fedrep", algorithm_options={"head_epochs": 0})
    heads = client_state(exp)["p"]
    for k, v in heads.items():  # head.* of every client = the initial head
        init = exp.ctx.initial_params[k]
        torch.testing.assert_close(v, init.expand_as(v))
    trained, _ = experiment("fedrep")
    w = client_state(trained)["p"]["head.weight"]
    assert not torch.allclose(w[0], w[1])
    # one round by hand: the server's φ is the plain mean of the uploaded φ_i
    alg, ctx = trained.algorithm, trained.ctx
    ids = torch.tensor([0, 2, 5])
    cohort = ctx.cohort(ids, 7)
    out = alg.client_update(
        alg.configure(alg.init(), cohort), trained.runner.store.take(ids, "cpu"), cohort
    )
    new = alg.aggregate(alg.init(), out.upload, RoundInfo(ids, out.num_examples, 7))
    for part, tree in out.upload.items():
        for k, v in tree.items():
            torch.testing.assert_close(new[part][k], v.mean(0))
    assert not any(k.startswith("head.") for k in out.upload["p"])
