"""FedSDR's research views and estimators (src/fedshift/algorithms/fedsdr_views.py): the
disagreement view, the estimator choice and the signature view's server tables."""

from __future__ import annotations

import pytest
import torch
from helpers import INVARIANT_SETTINGS as SETTINGS
from helpers import INVARIANT_SIZES as SIZES
from helpers import env_toy
from helpers import invariant_run as run

from fedshift.api import make_config
from fedshift.errors import FedshiftError
from fedshift.experiment import build_experiment


def test_fedsdr_disagreement_view_is_the_centred_environment_outputs():
    out = run("fedsdr", {"personal_epochs": 1, "gamma": 0.1}, rounds=1)
    exp = build_experiment(
        make_config(
            algorithm="fedsdr",
            algorithm_options={"shortcut_view": "disagreement"},
            **{**SETTINGS, "rounds": 1},
        ),
        data=env_toy(),
    )
    alg, server = exp.runner.alg, out.result.server
    data = env_toy()
    x, k = data.train.x[:6], data.num_classes
    view = alg.shortcut(alg.psi_extras(server), x)  # [B, E·K]
    assert view.shape == (6, 2 * k)
    per_env = view.view(6, 2, k)
    torch.testing.assert_close(per_env.sum(1), torch.zeros(6, k), atol=1e-6, rtol=0)
    # the two environments' classifiers disagree, so the view is not zero
    assert per_env.abs().max() > 1e-4
    with pytest.raises(FedshiftError, match="shortcut_view"):
        run("fedsdr", {"shortcut_view": "logits"})


def test_fedsdr_estimator_choice_changes_the_personal_models():
    runs = {
        e: run("fedsdr", {"personal_epochs": 1, "gamma": 1.0, "mi_estimator": e}, rounds=1)
        for e in ("moment", "correlation", "prediction")
    }
    states = {e: r.result.server for e, r in runs.items()}
    # stage 1 does not depend on the estimator
    torch.testing.assert_close(states["moment"], states["prediction"])
    per_client = {e: r.metrics["per_client"] for e, r in runs.items()}
    assert per_client["moment"] != per_client["correlation"]
    assert per_client["correlation"] != per_client["prediction"]
    with pytest.raises(FedshiftError, match="mi_estimator"):
        run("fedsdr", {"mi_estimator": "kernel"})


def test_fedsdr_signature_view_keeps_its_tables_on_the_server():
    options = {"personal_epochs": 1, "gamma": 0.1, "shortcut_view": "signature"}
    exp = build_experiment(
        make_config(algorithm="fedsdr", algorithm_options=options, **{**SETTINGS, "rounds": 1}),
        data=env_toy(),
    )
    exp.runner.run(None)
    alg, server = exp.runner.alg, exp.runner.server
    # every client reported its (environment, class) groups: each holds one environment
    counts = server["sig"]["count"]
    held = counts.sum(2) > 0  # [N, E]
    assert held.tolist() == [[u % 2 == e for e in range(2)] for u in range(len(SIZES))]
    assert counts.sum((1, 2)).tolist() == [float(n) for n in env_toy().train.sizes()]
    payload = alg.configure(server, None)
    assert list(payload.broadcast["sig"]) == ["proj"]  # sum, count, within stay
    found = int((server["sig"]["proj"].abs().sum(0) > 0).sum())
    x = env_toy().train.x[:5]
    assert alg.shortcut(alg.psi_extras(server), x).shape == (5, found)
