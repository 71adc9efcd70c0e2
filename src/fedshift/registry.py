"""Name → object registries (algorithms, scenarios, models) with helpful unknown-name errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import FedshiftError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise RuntimeError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            hint = did_you_mean(name, self._items)
            raise FedshiftError(
                f"unknown {self.kind} {name!r}{hint}; available: {', '.join(sorted(self._items))}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
