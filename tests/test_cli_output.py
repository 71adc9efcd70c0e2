"""What the commands print when it goes to a log: tables are not wrapped at 80 columns and
cut to "…" (the run list of a long table, redirected to a file, must stay readable)."""

from __future__ import annotations

import io

from rich.table import Table

from fedshift import cli_output


def test_a_table_written_to_a_file_takes_the_width_it_needs(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    log = io.StringIO()
    monkeypatch.setattr("sys.stdout", log)
    console = cli_output._console(stderr=False)
    table = Table()
    for name in ["run_id", "status", "algorithm", "scenario", "seed", "rounds", "group"] * 2:
        table.add_column(name)
    row = ["b116ef02bd", "running", "fedsdr", "cmnist", "0", "62/600", "table-fd6fba81"]
    table.add_row(*row * 2)
    console.print(table)
    text = log.getvalue()
    assert "running" in text and "table-fd6fba81" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) > 80


def test_columns_sets_the_width_of_a_log(monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert cli_output._console(stderr=False).width == 90
    monkeypatch.delenv("COLUMNS")
    assert cli_output._console(stderr=False).width == cli_output.LOG_WIDTH


def test_fedshift_warnings_print_as_one_line(monkeypatch, capsys):
    """The CLI shows its own warnings as one 'warning:' line (no file, line number or source
    line); other warnings keep Python's form."""
    import warnings

    from fedshift.cli import show_warnings_as_lines
    from fedshift.errors import FedshiftWarning

    others = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: others.append(message))
    show_warnings_as_lines()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("pfedme: lr × λ = 4.5 > 2", FedshiftWarning, stacklevel=1)
        warnings.warn("something else", RuntimeWarning, stacklevel=1)
    assert capsys.readouterr().err.splitlines() == ["warning: pfedme: lr × λ = 4.5 > 2"]
    assert [str(m) for m in others] == ["something else"]  # Python's own display
