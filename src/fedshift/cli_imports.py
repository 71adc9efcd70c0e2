"""``--import``: the option every command that looks a registered name up takes
(``fedshift run``, ``sweep``, ``reproduce``, ``list``, ``describe``, ``flower run`` …), here
so that ``fedshift.flower.cli`` can use it without importing ``fedshift.cli``."""

from __future__ import annotations

from typing import Annotated

import typer

ImportOption = Annotated[
    list[str] | None,
    typer.Option(
        "--import",
        help="your module that registers algorithms, scenarios or models: a module name "
        "(from the current folder or the Python path) or a .py file; repeatable",
    ),
]


def import_first(specs: list[str] | None) -> list[str] | None:
    """Import ``--import`` modules before anything looks a name up; the specs a run
    records (None when none was given, so the config keeps no ``imports`` key)."""
    if not specs:
        return None
    from .plugins import import_modules

    return import_modules(specs)
