"""The run store as pandas DataFrames, for notebooks and further analysis::

    import fedshift as fs
    runs = fs.load_runs("runs/fedshift.db")           # one row per run, config as columns
    curves = fs.load_rounds("runs/fedshift.db", ["36b3", "f00b"])  # one row per round
    clients = fs.load_client_metrics("runs/fedshift.db")  # one row per client × env

Run ids may be unique prefixes. Accuracies are percentages, as everywhere users see them.
Join the frames on ``run_id``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import parsed
from ..errors import FedshiftError
from .store import DEFAULT_DB, RunStore

if TYPE_CHECKING:
    import pandas as pd

RUN_COLUMNS = (
    "run_id",
    "status",
    "algorithm",
    "scenario",
    "seed",
    "rounds",
    "rounds_done",
    "created",
    "finished",
    "worst",
    "average",
    "worst_client",
    "val",
    "time_s",
    "bytes_up",
    "bytes_down",
    "error",
)
SCALAR_METRICS = ("worst", "average", "worst_client")


def _store(db: str | Path) -> RunStore:
    if not Path(db).is_file():  # RunStore would create an empty one
        raise FedshiftError(f"no run store at {str(db)!r}; give the db the runs were recorded in")
    return RunStore(db)


def _records(store: RunStore, ids: str | list[str] | None) -> list[dict]:
    if ids is None:
        ids = [r["run_id"] for r in store.runs()]
    elif isinstance(ids, str):
        ids = [ids]
    return [store.run(i) for i in ids]


def load_runs(db: str | Path = DEFAULT_DB) -> pd.DataFrame:
    """One row per run: status, final worst / average / worst-client accuracy and costs,
    then every config key as a column (``lr``, ``algorithm.mu`` …; values typed, so
    ``--set lr=0.01`` is the number 0.01; a key a run lacks is missing there)."""
    import pandas as pd

    rows = []
    for r in _store(db).runs():
        metrics = r["metrics"] or {}
        row: dict[str, Any] = {c: r.get(c) for c in RUN_COLUMNS if c not in SCALAR_METRICS}
        row.update({m: metrics.get(m) for m in SCALAR_METRICS})
        for key, value in (r["config"] or {}).items():
            row.setdefault(key, parsed(value))
        rows.append(row)
    return pd.DataFrame(rows, columns=_columns(RUN_COLUMNS, rows))


def load_rounds(db: str | Path = DEFAULT_DB, ids: str | list[str] | None = None) -> pd.DataFrame:
    """One row per stored round of the runs ``ids`` (all when None): loss, validation
    accuracy, test accuracy (average, worst, worst client and ``per_env.<env>``, empty in
    rounds without evaluation), bytes and seconds of that round."""
    import pandas as pd

    fixed = ("run_id", "round", "loss", "val", *SCALAR_METRICS, "bytes_up", "bytes_down", "time_s")
    rows = []
    for record in _records(_store(db), ids):
        for r in record["round_metrics"]:
            metrics = r["metrics"] or {}
            row = {k: r.get(k) for k in fixed if k not in SCALAR_METRICS}
            row.update({m: metrics.get(m) for m in SCALAR_METRICS})
            row.update({f"per_env.{e}": v for e, v in (metrics.get("per_env") or {}).items()})
            rows.append(row)
    return pd.DataFrame(rows, columns=_columns(fixed, rows))


def load_client_metrics(
    db: str | Path = DEFAULT_DB, ids: str | list[str] | None = None
) -> pd.DataFrame:
    """One row per run × split (``test``, ``val``) × client × environment: the final
    accuracy (%) of each client in each environment."""
    import pandas as pd

    columns = ["run_id", "split", "client", "env", "accuracy"]
    rows = [
        {"run_id": record["run_id"], **row}
        for record in _records(_store(db), ids)
        for row in record["client_accuracy"]
    ]
    return pd.DataFrame(rows, columns=columns)


def comparison_frame(records: list[dict]) -> pd.DataFrame:
    """``fedshift compare`` as a table: one row per run, worst / average / worst client,
    then ``per_env.<env>`` per test environment (accuracy %)."""
    import pandas as pd

    rows = []
    for r in records:
        m = r["metrics"] or {}
        row = {k: r[k] for k in ("run_id", "algorithm", "scenario", "seed")}
        row.update({k: m.get(k) for k in SCALAR_METRICS})
        row.update({f"per_env.{e}": v for e, v in (m.get("per_env") or {}).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _columns(first: tuple[str, ...], rows: list[dict]) -> list[str]:
    """``first``, then every other key in the order rows first have it."""
    out = dict.fromkeys(first)
    for row in rows:
        out.update(dict.fromkeys(row))
    return list(out)
