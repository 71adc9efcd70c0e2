"""Name → object registries (algorithms, scenarios, models) with helpful unknown-name errors.

Three ways a name gets in: fedshift's own modules (imported with their package), a user's
module (``--import``, see :mod:`fedshift.plugins`), and an installed package's entry point
in the registry's group (``fedshift.algorithms`` …), loaded only when a name is not already
registered, so a broken plugin never slows or breaks a run that does not use it.

Registering a name again is allowed only for the *same* definition — same module, same
qualified name — as when a notebook cell or ``importlib.reload`` runs the definition again:
the new object replaces the old. Anything else registering a taken name is an error that
names both, so two modules can never silently shadow each other (a built-in included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import FedshiftError, did_you_mean

T = TypeVar("T")


def origin_of(obj: object) -> str:
    """``module.QualName`` of a class or function: what identifies "the same definition"."""
    module = getattr(obj, "__module__", None) or "?"
    return f"{module}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


class Registry(Generic[T]):
    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group  # entry-point group of installed plugins
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}  # name → module.QualName of its definition
        self._plugins: dict[str, str] = {}  # name → the installed package that provides it
        self._scanned = False  # every entry point of the group loaded (for names())

    def register(self, name: str, origin: str | None = None) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; ``origin`` defaults to the object's
        own ``module.QualName`` (registries of wrapped objects pass the wrapped one's)."""

        def deco(obj: T) -> T:
            where = origin or origin_of(obj)
            old = self._origins.get(name)
            if name in self._items and old != where:
                raise FedshiftError(
                    f"{self.kind} {name!r} is already registered by {old}, so {where} cannot "
                    f"register it too; choose another name"
                )
            self._items[name] = obj
            self._origins[name] = where
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            self._load_plugin(name)
        if name not in self._items:
            hint = did_you_mean(name, self._items)
            own = "" if hint else "; a module of your own: --import MODULE (docs/extending.md)"
            raise FedshiftError(
                f"unknown {self.kind} {name!r}{hint}; available: "
                f"{', '.join(sorted(self._items))}{own}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        """Every registered name, installed plugins' included (they are loaded here)."""
        self._load_all_plugins()
        return sorted(self._items)

    def origin(self, name: str) -> str | None:
        """``module.QualName`` of what registered ``name`` (None if nothing did)."""
        return self._origins.get(name)

    def plugin(self, name: str) -> str | None:
        """The installed package whose entry point provided ``name`` (None otherwise)."""
        return self._plugins.get(name)

    def __contains__(self, name: str) -> bool:
        if name not in self._items:
            self._load_plugin(name)
        return name in self._items

    # installed plugins -------------------------------------------------------------------

    def _entry_points(self) -> list:
        if self.group is None:
            return []
        from importlib.metadata import entry_points

        return list(entry_points(group=self.group))

    def _load_plugin(self, name: str) -> None:
        for ep in self._entry_points():
            if ep.name == name:
                self._load(ep)
                return

    def _load_all_plugins(self) -> None:
        if self._scanned:
            return
        for ep in self._entry_points():
            if ep.name not in self._items:  # a built-in name wins: never replaced
                self._load(ep)
        self._scanned = True

    def _load(self, ep) -> None:
        package = getattr(getattr(ep, "dist", None), "name", None) or "?"
        where = f"entry point {ep.name} = {ep.value!r} of the installed package {package}"
        try:
            ep.load()
        except FedshiftError:
            raise
        except Exception as e:
            raise FedshiftError(f"the {where} failed to load: {type(e).__name__}: {e}") from e
        if ep.name not in self._items:
            raise FedshiftError(
                f"the {where} registered no {self.kind} {ep.name!r}; its module must register "
                f"that name (e.g. @register_{self.kind}({ep.name!r}))"
            )
        self._plugins[ep.name] = package
