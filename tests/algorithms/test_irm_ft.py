"""IRM†-FT (src/fedshift/algorithms/irm_ft.py): without fine-tuning it predicts as IRM†."""

from __future__ import annotations

import pytest
from helpers import assert_trees_close
from helpers import baseline_experiment as experiment


def test_irm_ft_without_finetuning_predicts_as_irm():
    _, a = experiment("irm-ft", algorithm_options={"finetune_epochs": 0})
    _, b = experiment("irm")
    assert a.metrics["per_client"] == pytest.approx(b.metrics["per_client"], abs=1e-9)
    assert_trees_close(a.server, b.server)
    _, c = experiment("irm-ft", algorithm_options={"finetune_epochs": 3})
    assert c.metrics["per_client"] != pytest.approx(b.metrics["per_client"], abs=1e-9)
