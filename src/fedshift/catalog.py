"""What `fedshift list` shows: registered names with a help line and their options."""

from __future__ import annotations

import inspect
import re
import sys

from .errors import FedshiftError
from .options import describe_options


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph on one line (an algorithm's names its paper, whose
    title runs over the docstring's line breaks; a command's summary in ``--help``)."""
    first = inspect.cleandoc(doc or "").split("\n\n")[0]
    return " ".join(first.split()).replace("``", "`")


def _comment_summary(text: str) -> str:
    """A preset file's leading comment, up to its first full stop: the comment's first
    sentence may run over several lines."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    joined = " ".join(lines)
    return re.split(r"(?<=\.)\s+(?=[A-Z])", joined, maxsplit=1)[0]


def _entries(registry) -> list[dict]:
    """Name, help line and options of every entry of a scenario or model registry."""
    return [
        {
            "name": n,
            "help": registry.get(n).help,
            "options": describe_options(registry.get(n).options),
        }
        for n in registry.names()
    ]


def catalog(what: str) -> list[dict]:
    if what == "algorithms":
        from .algorithms import ALGORITHMS

        return [
            {
                "name": n,
                "help": first_paragraph(sys.modules[ALGORITHMS.get(n).__module__].__doc__)
                or first_paragraph(ALGORITHMS.get(n).__doc__),  # a class of a notebook or script
                "personalized": ALGORITHMS.get(n).personalized,
                "options": describe_options(ALGORITHMS.get(n).Hyper),
            }
            for n in ALGORITHMS.names()
        ]
    if what == "scenarios":
        from .data import SCENARIOS

        return _entries(SCENARIOS)
    if what == "models":
        from .models import MODELS

        return _entries(MODELS)
    if what == "presets":
        from .config import preset_names, preset_text

        return [
            {
                "name": n,
                "help": _comment_summary(preset_text(n)),
                "options": [],
                "kind": "preset",
            }
            for n in preset_names()
        ] + _tables()
    raise FedshiftError(
        f"cannot list {what!r}; choose one of: algorithms, scenarios, presets, models"
    )


def _tables() -> list[dict]:
    """Paper tables (``configs/``), listed with the run presets: one method of one with
    ``fedshift run TABLE --method NAME``, all of them with ``fedshift reproduce TABLE``."""
    from .tables import load_table, table_names

    out = []
    for n in table_names():
        t = load_table(n)
        title = f"{t.source}: {t.title}"
        help = f"{title}; one method: fedshift run {n} --method NAME, all: fedshift reproduce {n}"
        methods = [m.name for m in t.methods]
        out.append(
            {
                "name": n,
                "help": help,
                "options": [],
                "kind": "table",
                "title": title,
                "methods": methods,
            }
        )
    return out
