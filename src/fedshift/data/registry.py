"""Scenario registry: ``build_scenario(name, options, seed, data_dir)`` → FederatedData."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..options import build_options
from ..registry import Registry, origin_of
from .federated import FederatedData


@dataclass(frozen=True)
class ScenarioEntry:
    build: Callable[[Any, int, Path | None], FederatedData]
    options: type
    help: str


SCENARIOS: Registry[ScenarioEntry] = Registry("scenario", group="fedshift.scenarios")


def register_scenario(name: str, options: type, help: str):
    """Register ``build(options, seed, data_dir) -> FederatedData`` under ``name``."""

    def deco(build):
        SCENARIOS.register(name, origin_of(build))(ScenarioEntry(build, options, help))
        return build

    return deco


def build_scenario(
    name: str, options: dict | None = None, seed: int = 0, data_dir: str | Path | None = None
) -> FederatedData:
    entry = SCENARIOS.get(name)
    opts = build_options(entry.options, dict(options or {}), "scenario")
    data = entry.build(opts, seed, Path(data_dir) if data_dir is not None else None)
    data.recipe = {  # what a run records, so that a resume rebuilds exactly this
        "scenario": name,
        "options": {k: getattr(opts, k) for k in (options or {})},  # converted values
        "seed": seed,
        "data_dir": None if data_dir is None else str(data_dir),
    }
    return data
