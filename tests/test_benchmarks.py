"""The benchmark scripts still run against the current engine (a broken benchmark is a
figure nobody can re-measure): one tiny W3 pair per kind of step, fedshift against the
per-client reference."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def round_speed(shared_datasets):
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        mp.setenv("FEDSHIFT_DATA", str(shared_datasets))
        spec = importlib.util.spec_from_file_location("round_speed", BENCH / "round_speed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    sys.modules.pop("reference", None)


@pytest.mark.parametrize("algorithm", ["fedsdr", "pfedme", "scaffold"])
def test_w3_pair_runs(round_speed, algorithm):
    out = round_speed.w3_case(algorithm, clients=8, rate=1.0, samples=800, rounds=1)
    assert out["fedshift_s"] > 0 and out["reference_s"] > 0 and out["ratio"] > 0
