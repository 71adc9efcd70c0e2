"""Model registry: ``build_model(name, input_shape, num_classes, options)``."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import FedshiftError
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
    check_size(name, lambda: entry.factory(opts, tuple(input_shape), num_classes))
    return entry.factory(opts, tuple(input_shape), num_classes)


def physical_memory() -> int | None:
    """Bytes of RAM on this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_size(name: str, build: Callable[[], FedModel]) -> None:
    """Refuse, in one sentence and before any memory is allocated, a model whose float32
    parameters alone would take more than half of this machine's memory (training holds
    several copies: gradients, optimiser state, a cohort of clients). The model is built
    on PyTorch's meta device, which allocates nothing; a factory that cannot build there
    is not checked."""
    ram = physical_memory()
    if ram is None:
        return
    try:
        with torch.device("meta"):
            probe = build()
        count = sum(t.numel() for t in (*probe.parameters(), *probe.buffers()))
    except Exception:  # noqa: BLE001 — a check only: the real build reports real errors
        return
    if count * 4 > ram / 2:
        raise FedshiftError(
            f"model {name!r} with these options has {count:,} parameters "
            f"({count * 4 / 2**30:.1f} GiB as float32), more than half of this machine's "
            f"memory ({ram / 2**30:.0f} GiB); choose a smaller model (model.hidden …)"
        )
