"""The model probe behind the FedSDR stage-1 diagnosis (docs/results/fedsdr-cmnist8-stage1/
probe_models.py): a colour-only model must read as one (every prediction flips with the
colour channels, 0 % at p_te = 0, 100 % at p_te = 1), and the clamp share must see a
disagreement of zero as below any α_th — else the diagnosis it backs could be an artefact."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

import fedshift as fs

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "docs" / "results" / "fedsdr-cmnist8-stage1" / "probe_models.py"

pytestmark = pytest.mark.skipif(
    not (Path(os.environ.get("FEDSHIFT_DATA", "")) / "mnist").exists(),
    reason="needs MNIST under $FEDSHIFT_DATA",
)


def load_probe():
    spec = importlib.util.spec_from_file_location("probe_models", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def colour_only_mlp(width: int = 2) -> dict:
    """Hidden units: red ink, green ink; the label read from the colour (y = 1 red)."""
    w = torch.zeros(width, 2 * 14 * 14)
    w[0, :196], w[1, 196:] = 1.0, 1.0  # channel 0 = red, channel 1 = green
    head = torch.tensor([[-1.0, 1.0], [1.0, -1.0]])  # class 0 ← green, class 1 ← red
    return {
        "extractor.fc1.weight": w,
        "extractor.fc1.bias": torch.zeros(width),
        "head.weight": head,
        "head.bias": torch.zeros(2),
    }


def test_a_colour_only_model_reads_as_one_and_the_clamp_share_is_exact():
    probe = load_probe()
    data = fs.scenario("cmnist", samples=800, test_samples=200, seed=0)
    row = probe.model_rows("x", "colour only", lambda u: colour_only_mlp(), data)
    assert row["flip"] == pytest.approx(100.0)
    assert row["acc_p0.0"] == pytest.approx(0.0)
    assert row["acc_p1.0"] == pytest.approx(100.0)
    assert row["probe_colour"] > 95.0
    assert row["zero_features"] == 0.0 and row["live_units"] == 100.0  # every image has ink
    # a third unit that never fires is dead; with no hidden unit alive every input is zero
    dead = colour_only_mlp(width=3)
    dead["head.weight"] = torch.cat([dead["head.weight"], torch.zeros(2, 1)], 1)
    dead["extractor.fc1.weight"][2] = -1.0
    row = probe.model_rows("x", "one dead unit", lambda u: dead, data)
    assert row["live_units"] == pytest.approx(100 * 2 / 3) and row["zero_features"] == 0.0
    off = {**dead, "extractor.fc1.bias": torch.full((3,), -1e6)}
    assert probe.model_rows("x", "all dead", lambda u: off, data)["zero_features"] == 100.0
    # two identical environment classifiers never disagree: every minibatch is below α_th
    model = colour_only_mlp()
    env_weight = torch.randn(1, 2, 2).expand(2, 2, 2).clone()
    server = {**{f"sd/p/{k}": v for k, v in model.items()}, "env.weight": env_weight}
    server["env.bias"] = torch.zeros(2, 2)
    same = probe.clamp_share(server, {"batch_size": 64}, data)
    assert same["lambda_dis_median"] == 0.0 and same["share_below_alpha_th"] == 100.0
    # classifiers that disagree by more than α_th / λ on every sample: none below it
    server["env.weight"] = torch.stack([env_weight[0], -env_weight[0]])
    server["env.bias"] = torch.tensor([[5.0, -5.0], [-5.0, 5.0]])
    apart = probe.clamp_share(server, {"batch_size": 64, "algorithm.alpha_th": 1.0}, data)
    assert apart["lambda_dis_median"] > 1.0 and apart["share_below_alpha_th"] == 0.0
