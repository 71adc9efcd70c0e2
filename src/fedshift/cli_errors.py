"""Bad input to any command: one sentence on stderr and an exit code, never a traceback
(``user_errors`` wraps every command of ``fedshift``)."""

from __future__ import annotations

import errno
import functools
import sqlite3

import typer
from rich.markup import escape

from .cli_output import err
from .errors import Diverged, FedshiftError, RunStopped
from .results.store import lock_error


def user_errors(fn):
    """Bad input → one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Diverged as e:
            hint = f" ({e.hint})" if e.hint else ""
            err.print(
                f"[red]diverged:[/red] {escape(f'{e}{hint}')}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(3) from None
        except FedshiftError as e:
            err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except RunStopped as e:
            hint = getattr(e, "hint", "")
            err.print(
                f"stopped after round {e.rounds_done}; a checkpoint was written; {escape(hint)}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(130) from None
        except KeyboardInterrupt:
            err.print("interrupted; the run store keeps the rounds finished so far")
            raise typer.Exit(130) from None
        except sqlite3.DatabaseError as e:  # damaged, locked or read-only store
            err.print(f"[red]error:[/red] {store_sentence(e)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except OSError as e:
            if e.filename is None:  # not about a path the user gave: a real fault
                raise
            err.print(f"[red]error:[/red] {path_sentence(e)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def store_sentence(e: sqlite3.DatabaseError) -> str:
    """What is wrong with a run store SQLite could not use, and what to do (markup-safe)."""
    text = str(e)
    if lock_error(e):
        return (
            "the run store is locked by another process (waited 30 s); try again when it has "
            "finished, or give another --db"
        )
    if "readonly" in text:
        return "the run store is read-only here; give a --db you can write to"
    return (
        f"the run store cannot be read: {escape(text)}; restore it from a copy or give another --db"
    )


def path_sentence(e: OSError) -> str:
    """An OSError about a user's path (too long, below a file, read-only, full) as one
    sentence naming the path (markup-safe)."""
    name = str(e.filename)
    shown = escape(repr(name if len(name) <= 60 else f"{name[:40]}…{name[-15:]}"))
    if e.errno == errno.ENAMETOOLONG:
        return (
            f"file name too long: {shown} ({len(name)} characters); the file system allows "
            "255 bytes per name"
        )
    return f"cannot use {shown}: {escape(e.strerror or str(e))}"
