"""Model registry: ``build_model(name, input_shape, num_classes, options)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..options import build_options
from ..registry import Registry, origin_of
from .base import FedModel


@dataclass(frozen=True)
class ModelEntry:
    factory: Callable[[Any, tuple[int, ...], int], FedModel]
    options: type
    help: str


MODELS: Registry[ModelEntry] = Registry("model", group="fedshift.models")


def register_model(name: str, options: type, help: str):
    """Register ``factory(options, input_shape, num_classes) -> FedModel`` under ``name``."""

    def deco(factory):
        MODELS.register(name, origin_of(factory))(ModelEntry(factory, options, help))
        return factory

    return deco


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, options: dict | None = None
) -> FedModel:
    entry = MODELS.get(name)
    opts = build_options(entry.options, dict(options or {}), "model")
    return entry.factory(opts, tuple(input_shape), num_classes)
