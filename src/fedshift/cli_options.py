"""Options several commands declare alike (``run``, ``sweep``, ``reproduce``, ``runs``,
``report``, ``flower run`` …), declared once here so that ``fedshift.flower.cli`` can use
them without importing ``fedshift.cli``: the run's source and ``--method``, ``--set``,
``--rounds``, ``--seed(s)``, the run store, ``--export``, ``--json``, ``--device``,
``--data-dir``, and ``--import``, which every command that looks a registered name up takes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DbOption = Annotated[Path, typer.Option(help="run store (SQLite)")]
JsonOption = Annotated[bool, typer.Option("--json", help="last stdout line: a JSON summary")]
DeviceOption = Annotated[
    str | None, typer.Option(help="auto (cuda, else mps, else cpu), cpu, cuda, cuda:N or mps")
]
DataDirOption = Annotated[str | None, typer.Option(help="data root (else $FEDSHIFT_DATA)")]
ExportOption = Annotated[
    Path | None,
    typer.Option(
        "--export",
        help="also write each run, as it ends, to this folder as a file (fedshift export)",
    ),
]
RoundsOption = Annotated[int | None, typer.Option(help="communication rounds")]
ResumeOption = Annotated[  # sweep and reproduce: many runs, across sessions
    bool,
    typer.Option(
        help="reuse the store's finished runs of the same configuration and continue "
        "its stopped ones from their checkpoints (a long sweep or table across sessions)"
    ),
]
SeedOption = Annotated[int | None, typer.Option(help="run seed")]
SeedsOption = Annotated[
    str | None, typer.Option(help="several seeds, e.g. 0,1,2: one run each, mean ± std")
]
SetOption = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="override a config key: key=value")
]

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
