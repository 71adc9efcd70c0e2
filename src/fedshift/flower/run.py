"""Running fedshift configs on Flower: the simulation engine in this process, or a
deployment (a running SuperLink with one SuperNode per client) through ``flwr run``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from ..api import RunOutcome
from ..config import RunConfig
from ..data import build_scenario
from ..errors import FedshiftError
from ..experiment import resolve_device
from .server import DEFAULT_CONNECT_TIMEOUT, DEFAULT_ROUND_TIMEOUT, SUMMARY_PREFIX

QUIET_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
# Ray's ray.init warns (FutureWarning) that a worker asking for no GPU will soon keep the
# GPUs visible instead of having CUDA_VISIBLE_DEVICES emptied, until this variable chooses
# the new behaviour. Our ClientApp workers ask for no GPU only when the runs are not on
# CUDA, where the two behaviours train the same, so simulate() chooses the new one.
# Ray starts its workers at niceness 15 (RayConfig worker_niceness), so on a machine where
# other CPU-bound processes run, the ClientApp actors doing all the training get almost no
# CPU: measured beside two one-thread training jobs on 2 cores, an actor at nice 15 ran at
# ~5 % CPU and a 2-round simulation took minutes instead of seconds. fedshift's actors are
# the work, not background helpers, so they run at the niceness of the process that starts
# them (workers inherit it: `nice fedshift flower run` still lowers them all).
RAY_ENV = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "RAY_worker_niceness": "0"}
RUN_SIMULATION_DEPRECATED = "DEPRECATED FEATURE: The `run_simulation` function is deprecated"


def quiet_flower() -> None:
    """No telemetry and no update check unless the user asked for them."""
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)


class _RunSimulationNotice(logging.Filter):
    """Drops the one record of Flower's logger saying that ``run_simulation`` is deprecated."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(RUN_SIMULATION_DEPRECATED)


@contextlib.contextmanager
def without_run_simulation_notice():
    """Flower (1.x) logs "DEPRECATED FEATURE: The `run_simulation` function is deprecated
    … use `flwr run`" on every call. ``flwr run`` is a CLI that hands the run to a SuperLink
    process (what ``--deployment`` does); ``run_simulation`` is Flower's only simulation in
    this process, which ``--simulation`` is for (round callbacks, outcomes returned), so
    there is no call to switch to: that record alone is dropped from the ``flwr`` logger
    while it runs, and every other Flower message stays."""
    logger = logging.getLogger("flwr")
    notice = _RunSimulationNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def simulate(
    configs: list[RunConfig],
    *,
    db: str | Path | None = None,
    actors: int = 0,
    round_timeout: float = DEFAULT_ROUND_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    on_round: Callable[[int, object], None] | None = None,
) -> list[RunOutcome]:
    """Run each config on Flower's simulation engine (one virtual SuperNode per client,
    ClientApps in ``actors`` Ray workers, 0 = one per CPU core); one simulation serves
    all configs. Returns the outcomes, as ``fedshift.run`` would."""
    quiet_flower()
    for k, v in RAY_ENV.items():  # before Ray starts; a value the user set wins
        os.environ.setdefault(k, v)
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from .client import client_app
    from .server import serve

    first = configs[0]
    n = build_scenario(
        first.scenario, first.scenario_options, first.seed, first.data_dir or None
    ).num_clients
    outcomes: list[RunOutcome] = []
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context) -> None:
        outcomes.extend(
            serve(
                grid,
                configs,
                db=str(db) if db is not None else None,
                engine="flower-simulation",
                round_timeout=round_timeout,
                connect_timeout=connect_timeout,
                on_round=on_round,
            )
        )

    workers = actors or min(os.cpu_count() or 1, n)
    # Ray hides GPUs from workers that asked for none: CUDA runs share the GPU(s)
    cuda = any(resolve_device(c.device).type == "cuda" for c in configs)
    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 1.0 / workers if cuda else 0.0},
        "init_args": {"num_cpus": workers},
    }
    with without_run_simulation_notice():
        run_simulation(server_app, client_app, num_supernodes=n, backend_config=backend)
    if len(outcomes) != len(configs):
        raise FedshiftError("the Flower simulation ended before every run finished")
    return outcomes


APP_MODULE = '''"""fedshift on Flower: the apps (written by `fedshift flower run --deployment`)."""

from fedshift.flower.apps import client_app, server_app

__all__ = ["client_app", "server_app"]
'''


def write_app(
    folder: Path, configs: list[RunConfig], db: str, round_timeout: float, connect_timeout: float
) -> Path:
    """A Flower App (pyproject.toml + module) whose run config holds the fedshift jobs."""
    import tomli_w

    app = folder / "fedshift-flower"
    app.mkdir(parents=True, exist_ok=True)
    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": "fedshift-flower",
            "version": "1.0.0",
            "description": "fedshift algorithms on Flower",
            "license": "MIT",
            "dependencies": [],
        },
        "tool": {
            "hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
            "flwr": {
                "app": {
                    "publisher": "fedshift",
                    "components": {
                        "serverapp": "fedshift_flower_app:server_app",
                        "clientapp": "fedshift_flower_app:client_app",
                    },
                    "config": {
                        "fedshift-jobs": json.dumps([c.flat() for c in configs]),
                        "fedshift-db": db,
                        "fedshift-round-timeout": float(round_timeout),
                        "fedshift-connect-timeout": float(connect_timeout),
                    },
                }
            },
        },
    }
    (app / "pyproject.toml").write_text(tomli_w.dumps(project))
    (app / "fedshift_flower_app.py").write_text(APP_MODULE)
    return app


def flwr_executable() -> str:
    local = Path(sys.executable).with_name("flwr")
    return str(local) if local.exists() else "flwr"


def deploy(
    configs: list[RunConfig],
    *,
    db: str | Path | None = None,
    superlink: str | None = None,
    address: str | None = None,
    root_certificates: str | Path | None = None,
    insecure: bool = False,
    round_timeout: float = DEFAULT_ROUND_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    on_line: Callable[[str], None] | None = None,
    timeout: float | None = None,
) -> list[dict]:
    """Submit the configs as one Flower run to a running SuperLink (``flwr run --stream``)
    and return each run's JSON summary as the deployed ServerApp printed it.

    ``superlink`` names a connection of the Flower config ($FLWR_HOME/config.toml);
    ``address`` (HOST:PORT of the SuperLink) with ``root_certificates`` (TLS) or
    ``insecure`` uses a private Flower config instead. The run store path is resolved
    here and written by the ServerApp on the SuperLink's machine.
    """
    from .apps import ERROR_PREFIX

    quiet_flower()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="fedshift-flower-") as tmp:
        db_path = str(Path(db).resolve()) if db is not None else ""
        app = write_app(Path(tmp), configs, db_path, round_timeout, connect_timeout)
        connection = superlink
        if address is not None:
            if not insecure and root_certificates is None:
                raise FedshiftError(
                    "--address needs --root-certificates CA.pem (TLS) or --insecure"
                )
            home = Path(tmp) / "flwr-home"
            home.mkdir()
            conn = {"address": address}
            if insecure:
                conn["insecure"] = True
            else:
                conn["root-certificates"] = str(Path(root_certificates).resolve())
            import tomli_w

            text = tomli_w.dumps({"superlink": {"default": "fedshift", "fedshift": conn}})
            (home / "config.toml").write_text(text)
            env["FLWR_HOME"] = str(home)
            connection = "fedshift"
        cmd = [flwr_executable(), "run", str(app)] + ([connection] if connection else [])
        cmd.append("--stream")
        summaries: list[dict] = []
        errors: list[str] = []
        tail: list[str] = []
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=tmp,
        )
        watchdog = threading.Timer(timeout, proc.kill) if timeout else None
        if watchdog is not None:
            watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if SUMMARY_PREFIX in line:
                    summaries.append(json.loads(line.split(SUMMARY_PREFIX, 1)[1]))
                elif ERROR_PREFIX in line:
                    errors.append(json.loads(line.split(ERROR_PREFIX, 1)[1]))
                else:
                    tail = (tail + [line.rstrip()])[-20:]
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            rc = proc.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors:
        raise FedshiftError(f"the Flower run failed: {errors[-1]}")
    if len(summaries) != len(configs):
        last = _last_message(tail)
        raise FedshiftError(
            f"the Flower run ended after {len(summaries)} of {len(configs)} runs"
            f" (flwr run exit code {rc}): {last}"
        )
    return summaries


def _last_message(lines: list[str]) -> str:
    """The last message of flwr's output, unboxed (its errors are drawn in a rich panel)."""
    lines = [line.strip() for line in lines if line.strip()]
    if not lines:
        return "no output"
    if not lines[-1].startswith("╰"):
        return lines[-1]
    body: list[str] = []
    for line in reversed(lines[:-1]):
        if line.startswith("╭"):
            break
        body.insert(0, line.strip("│").strip())
    return " ".join(body)
