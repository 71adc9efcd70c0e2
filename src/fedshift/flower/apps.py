"""The Flower apps: ``client_app`` (see client.py) and a ``server_app`` for deployment,
which reads its jobs from the Flower run config that ``fedshift flower run --deployment``
writes into the Flower App it submits:

* ``fedshift-jobs``: JSON list of resolved fedshift configs (dotted keys), run in turn;
* ``fedshift-db``: run store path on the SuperLink's machine ("" = none);
* ``fedshift-round-timeout`` / ``fedshift-connect-timeout``: seconds.

It prints one ``fedshift-round`` line per round and one ``fedshift-summary`` line (the
JSON summary of ``fedshift run --json``) per finished run into the Flower log, which
``flwr run --stream`` shows; a failure prints one ``fedshift-error`` line.
"""

from __future__ import annotations

import json

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


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    configs = [config_from_json(json.dumps(c)) for c in json.loads(str(cfg["fedshift-jobs"]))]
    try:
        serve(
            grid,
            configs,
            db=str(cfg.get("fedshift-db", "")) or None,
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
