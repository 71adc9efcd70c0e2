"""Options ``fedshift run`` and ``fedshift flower run`` declare alike, here so that
``fedshift.flower.cli`` can use them without importing ``fedshift.cli``: the run's source
and ``--method``, and ``--import``, which every command that looks a registered name up
takes (``run``, ``sweep``, ``reproduce``, ``list``, ``describe``, ``flower run`` …)."""

from __future__ import annotations

from typing import Annotated

import typer

SourceArgument = Annotated[
    str | None,
    typer.Argument(help="run preset, paper table (with --method) or TOML file"),
]

MethodOption = Annotated[
    str | None,
    typer.Option(
        help="a paper table's method (row) to run with the table's settings: its name "
        "or algorithm (fedshift list presets marks the tables)"
    ),
]

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
