"""FedPAC (src/fedshift/algorithms/fedpac.py): the classifier weights, one round by hand, and
feature alignment from round one only (issue 19)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import PFL_SETTINGS as SETTINGS
from helpers import baseline_experiment as experiment
from toy import toy_data

import fedshift as fs
from fedshift.algorithms.base import RoundInfo
from fedshift.algorithms.fedpac import classifier_weights


def test_fedpac_weights_are_inverse_variance_when_statistics_agree():
    v = np.array([1.0, 2.0, 4.0])
    h = np.ones((3, 6))  # equal h_j: the bias term vanishes, α_j ∝ 1 / V_j
    want = (1 / v) / (1 / v).sum()
    np.testing.assert_allclose(classifier_weights(v, h, 0), want, atol=1e-6)
    # a far-away client gets no weight; the own client always keeps some
    h2 = np.array([[0.0, 0.0], [0.1, 0.0], [50.0, 50.0]])
    a = classifier_weights(np.array([0.5, 0.5, 0.5]), h2, 0)
    assert a[2] == 0.0 and a[0] > 0 and a.sum() == pytest.approx(1.0)


def test_fedpac_round_by_hand():
    exp, _ = experiment("fedpac", rounds=1)
    alg, ctx = exp.algorithm, exp.ctx
    server = exp.runner.server
    ids = torch.tensor([1, 2, 5])
    cohort = ctx.cohort(ids, 1)
    out = alg.client_update(alg.configure(server, cohort), {}, cohort)
    counts = torch.stack([torch.bincount(ctx.data.train.client(i)[1], minlength=3) for i in ids])
    torch.testing.assert_close(out.upload["centroid_count"], counts.float())
    info = RoundInfo(ids, out.num_examples, 1)
    new = alg.aggregate(server, out.upload, info)
    want = out.upload["centroid_sum"].sum(0) / counts.sum(0).unsqueeze(1)
    torch.testing.assert_close(new["centroids"], want)
    alpha = torch.tensor(np.array(info.log["alpha"]), dtype=torch.float32)
    assert torch.allclose(alpha.sum(1), torch.ones(3))
    combined = torch.einsum("ij,jkl->ikl", alpha, out.upload["heads"]["head.weight"])
    torch.testing.assert_close(new["heads"]["head.weight"][ids], combined)
    untouched = [i for i in range(ctx.data.num_clients) if i not in ids.tolist()]
    torch.testing.assert_close(
        new["heads"]["head.weight"][untouched], server["heads"]["head.weight"][untouched]
    )
    # extractor: n_i-weighted mean of the uploads
    k = "extractor.fc1.weight"
    w = out.num_examples / out.num_examples.sum()
    torch.testing.assert_close(new["p"][k], (out.upload["p"][k] * w.view(-1, 1, 1)).sum(0))


def test_fedpac_aligns_features_from_round_one_only():
    """The authors' local_training adds the alignment term only when round > 0: round 0
    with λ = 1 equals λ = 0; a second round differs."""

    def server(rounds, lam):
        out = fs.run(
            algorithm="fedpac",
            data=toy_data(),
            algorithm_options={"lambda_": lam},
            **{**SETTINGS, "rounds": rounds},
        )
        return dict(out.result.server["p"])

    for k, v in server(1, 1.0).items():
        torch.testing.assert_close(v, server(1, 0.0)[k])
    two, plain = server(2, 1.0), server(2, 0.0)
    assert any(not torch.allclose(v, plain[k]) for k, v in two.items())
