"""Every registered algorithm gives the numbers pinned in
``tests/algorithms/pinned_numbers.json`` (written by ``python tests/algorithms/pinned.py
--write`` before the restructuring of issue 23): to a few float32 ulps on a machine like the
one that wrote them, to a looser float32 tolerance on another."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pinned import PINNED, builtin_algorithms, machine, numbers

PINS = json.loads(PINNED.read_text())
# On a machine like the one that wrote the pins, to a few float32 ulps: bit for bit on most
# such hosts, but one (Intel Xeon, 2026-11-30) rounded GroupDRO's numbers up to 6e-8 apart.
SAME_MACHINE = PINS["machine"] == machine()


def test_every_registered_algorithm_is_pinned():
    assert sorted(PINS["algorithms"]) == sorted(builtin_algorithms())


def _same(got, want, where):
    if isinstance(want, dict) and set(want) == {"dtype", "shape", "values"}:
        assert (got["dtype"], got["shape"]) == (want["dtype"], want["shape"]), where
        g, w = torch.tensor(got["values"]), torch.tensor(want["values"])
        if SAME_MACHINE:
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7, msg=where)
        else:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=where)
    elif isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        if math.isnan(want):
            assert math.isnan(got), where
        elif SAME_MACHINE:
            assert got == pytest.approx(want, rel=1e-6, abs=1e-7), where
        else:
            assert got == pytest.approx(want, rel=1e-4, abs=1e-4), where
    else:
        assert got == want, where


@pytest.mark.parametrize("algorithm", sorted(PINS["algorithms"]))
def test_numbers_unchanged(algorithm):
    got = json.loads(json.dumps(numbers(algorithm)))  # the same JSON round trip as the pins
    _same(got, PINS["algorithms"][algorithm], algorithm)
