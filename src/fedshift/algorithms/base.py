"""The registry of algorithms. The contract an algorithm implements (``Algorithm``,
``Payload``, ``ClientResult``, ``RoundInfo``, ``Prediction``) lives in
:mod:`fedshift.engine.contract`, with everything else a method may use from the engine; the
names are re-exported here for the code that imported them from this module."""

from __future__ import annotations

from ..engine.contract import Algorithm, ClientResult, Payload, Prediction, RoundInfo
from ..registry import Registry

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientResult",
    "Payload",
    "Prediction",
    "RoundInfo",
    "register_algorithm",
]

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", group="fedshift.algorithms")


def register_algorithm(name: str):
    """Class decorator: register an :class:`Algorithm` under ``name`` (``algorithm=name``
    in a config). Running the same definition again (a notebook cell) replaces it; another
    class taking a registered name is an error."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        return ALGORITHMS.register(name)(cls)

    return deco
