"""Options that take one value may be given once: click silently keeps the last of
``--rounds 3 --rounds 5``, which hides a mistake in a long command line. And a command's
line in ``fedshift --help`` is its docstring's first paragraph on one line."""

from __future__ import annotations

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperOption

from .catalog import first_paragraph
from .config import canonical


class OnceCommand(TyperCommand):
    """A command that refuses a single-value option given twice with different values
    (one line on stderr, exit code 2, like every other bad input)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not self.short_help and self.help:  # Typer's list keeps the docstring's breaks
            self.short_help = first_paragraph(self.help)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        single = {}
        for p in self.params:
            if isinstance(p, TyperOption) and not (p.multiple or p.is_flag or p.count):
                single.update({name: p.opts[0] for name in p.opts + p.secondary_opts})
        given: dict[str, list[str]] = {}
        i = 0
        while i < len(args) and args[i] != "--":
            name, eq, value = args[i].partition("=")
            if name in single and (eq or i + 1 < len(args)):
                if not eq:
                    value, i = args[i + 1], i + 1
                given.setdefault(single[name], []).append(value)
            i += 1
        for option, values in given.items():
            if len({repr(canonical(v)) for v in values}) > 1:
                Console(stderr=True).print(
                    f"[red]error:[/red] {option} is given {len(values)} times with different "
                    f"values ({', '.join(values)}); give it once",
                    highlight=False,
                    soft_wrap=True,
                )
                raise typer.Exit(2)
        return super().parse_args(ctx, args)
