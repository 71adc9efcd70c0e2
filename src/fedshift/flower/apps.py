"""The Flower apps: ``client_app`` (see client.py) and a ``server_app`` for deployment,
which reads its jobs from the Flower run config that ``fedshift flower run --deployment``
writes into the Flower App it submits:

* ``fedshift-jobs``: JSON list of resolved fedshift configs (dotted keys), run in turn;
* ``fedshift-db``: run store path on the SuperLink's machine ("" = none), confined to the
  folder the SuperLink's operator allows (``FEDSHIFT_DB_ROOT`` in the ServerApp's
  environment, else its working directory): whoever submits a run must not choose where
  the SuperLink machine writes;
* ``fedshift-round-timeout`` / ``fedshift-connect-timeout``: seconds.

It prints one ``fedshift-round`` line per round and one ``fedshift-summary`` line (the
JSON summary of ``fedshift run --json``) per finished run into the Flower log, which
``flwr run --stream`` shows; a failure prints one ``fedshift-error`` line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from .client import client_app
from .records import config_from_json
from .server import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_ROUND_TIMEOUT,
    serve,
    summary_line,
)

ROUND_PREFIX = "fedshift-round "
DB_ROOT_ENV = "FEDSHIFT_DB_ROOT"
ERROR_PREFIX = "fedshift-error "

server_app = ServerApp()


def round_line(index: int, rec) -> str:
    acc = rec.metrics["average"] if rec.metrics else None
    return ROUND_PREFIX + json.dumps(
        {
            "index": index,
            "round": rec.round,
            "loss": rec.loss,
            "acc": acc,
            "time_s": rec.time_s,
            "flower": rec.extras.get("flower", {}),
        }
    )


def confined_db(path: str) -> str | None:
    """The submitted store path, resolved (links and ``..`` included) inside the operator's
    root; anything outside it is refused in one sentence."""
    if not path:
        return None
    root = Path(os.environ.get(DB_ROOT_ENV) or os.getcwd()).resolve()
    target = (root / path).resolve()  # an absolute path stays itself, then is checked
    if not target.is_relative_to(root):
        raise ValueError(
            f"fedshift-db {path!r} is outside the folder this SuperLink allows for run "
            f"stores ({root}); its operator sets {DB_ROOT_ENV} on the SuperLink machine"
        )
    return str(target)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    configs = [config_from_json(json.dumps(c)) for c in json.loads(str(cfg["fedshift-jobs"]))]
    try:
        serve(
            grid,
            configs,
            db=confined_db(str(cfg.get("fedshift-db", ""))),
            engine="flower-deployment",
            round_timeout=float(cfg.get("fedshift-round-timeout", DEFAULT_ROUND_TIMEOUT)),
            connect_timeout=float(cfg.get("fedshift-connect-timeout", DEFAULT_CONNECT_TIMEOUT)),
            on_round=lambda i, rec: print(round_line(i, rec), flush=True),
            on_outcome=lambda o: print(summary_line(o), flush=True),
        )
    except Exception as e:
        print(ERROR_PREFIX + json.dumps(str(e)), flush=True)
        raise


__all__ = ["client_app", "server_app"]
