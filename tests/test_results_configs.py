"""Every config and table file committed beside a result (docs/results/**/*.toml) still
loads and validates with today's code: the commands in the results pages stay runnable,
and a renamed option or algorithm breaks this test, not a reader's re-run months later."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshift.config import resolve
from fedshift.experiment import check_options
from fedshift.reproduce import method_runs, plan_table
from fedshift.tables import is_table_source, load_table

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
FILES = sorted(RESULTS.rglob("*.toml"))


def test_there_are_result_files():
    assert len(FILES) >= 10  # the sweeps and tables the results pages point to


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_result_file_validates(path: Path):
    if is_table_source(str(path)):  # every run reproduce would make (one seed)
        table = load_table(str(path))
        plan = plan_table(table, seeds=1)
        for method in plan.methods:
            for run in method_runs(table, method, plan, table.first_seed):
                check_options(run.config)
    else:
        check_options(resolve(str(path)))
