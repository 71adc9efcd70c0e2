"""Every config and table file committed beside a result (docs/results/**/*.toml) still
loads and validates with today's code: the commands in the results pages stay runnable,
and a renamed option or algorithm breaks this test, not a reader's re-run months later."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshift.config import resolve
from fedshift.experiment import check_options
from fedshift.tables import load_table, method_config

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
FILES = sorted(RESULTS.rglob("*.toml"))


def test_there_are_result_files():
    assert len(FILES) >= 10  # the sweeps and tables the results pages point to


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_result_file_validates(path: Path):
    if "[table]" in path.read_text():
        table = load_table(str(path))
        assert table.methods
        for method in table.methods:
            values = [{table.sweep_key: v} for v in table.sweep_values] or [{}]
            for fold in values:
                check_options(method_config(table, method, fold))
    else:
        check_options(resolve(str(path)))
