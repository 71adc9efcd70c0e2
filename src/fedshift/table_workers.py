"""``fedshift reproduce --workers N`` (and ``sweep``): a table's runs over N processes of this
machine.

A paper table is dozens of independent runs (methods × seeds), each of which uses a core or
two well at the papers' batch sizes; a machine with more cores than one run uses finishes
the table sooner by training several at once. The parent starts N copies of the same
``reproduce`` command (one thread each unless ``threads`` is set, their output in log
files; ``--resume`` if the command has it), each taking the table's runs one at a time from
a shared list: a run is claimed by creating its file in a claims folder (``os.O_EXCL``, so
no run is trained twice and a worker that finishes early takes the next). Each run is
stored in the one run store as it ends (the store serialises the writers). When every
worker has exited the parent runs the command once more with ``--resume``: every run is
then reused (the newest of its configuration), and the report and JSON are written as by a
single process at the workers' thread count, with the same numbers (a run's numbers depend
on its config, seed and thread count, not on the process that trained it). Ctrl-C or
SIGTERM stops every worker at a checkpoint; the same command with ``--resume`` continues.
``fedshift sweep --workers N`` shares its grid points × seeds the same way; a point that
diverges may then have had its later seeds trained too (the workers cannot know), which the
summary reads as one process would: up to the first diverged seed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import FedshiftError

POLL_S = 2.0  # seconds between looks at the workers
STOP_WAIT_S = 600.0  # how long stopped workers get to write their checkpoints


def claimed(keyed: Iterable[tuple[str, Any]], claims: Path) -> Iterator:
    """The items of ``keyed`` ((key, item) pairs, the same in every worker) whose key this
    process claims first in ``claims`` (a file created with ``O_EXCL``), claimed lazily:
    one just before it is handed out, so that a busy worker leaves the rest to the others."""
    for key, item in keyed:
        try:
            os.close(os.open(claims / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        yield item


def train_claimed(keyed: list[tuple[str, Any]], claims: Path, **run: Any) -> None:
    """A worker's share of a command's jobs: those of ``keyed`` it claims, trained one at a
    time (``jobs.run_jobs`` with ``run``'s arguments; a diverged run is a result, as in a
    table or a sweep)."""
    from .jobs import run_jobs

    for _ in run_jobs(claimed(keyed, claims), keep_diverged=True, **run):
        pass


def as_worker() -> None:
    """In a worker: SIGTERM (the parent's stop) acts as Ctrl-C between runs too, so a worker
    stopped while it builds data or records a run exits cleanly; inside a run the runner's
    own handler takes it (stop at the round's end, checkpoint)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def worker_threads(workers: int, cores: int | None = None) -> int:
    """Intra-op threads per worker: the machine's cores shared out, at least one."""
    return max(1, (cores or os.cpu_count() or 1) // workers)


def workers_hint(pending: int, device: str | None = None, cores: int | None = None) -> str | None:
    """One sentence for a command about to train ``pending`` runs one after another on a
    CPU with several cores, else ``None``: ``--workers`` would train several at once (at the
    papers' batch sizes one thread a run was also the fastest thread count on the
    development machine, docs/reproduce.md)."""
    from .crowded import usable_cores
    from .experiment import resolve_device

    cores = cores or usable_cores()
    if pending < 2 or cores < 2 or resolve_device(device or "auto").type != "cpu":
        return None
    n = min(cores, pending)
    return (
        f"{pending} runs to train one after another: --workers {n} trains {n} at a time on "
        f"this machine's {cores} cores, one thread each (on 2 cores 1.7× faster than one "
        "process for Table 5.1's runs; docs/reproduce.md)"
    )


def pending_runs(configs: list, db: str | Path, resume: bool) -> int:
    """How many of ``configs`` a command would train: all of them, or with ``resume`` those
    without a finished run of the same configuration in ``db``."""
    if not resume:
        return len(configs)
    from .jobs import config_identity, runs_by_config

    stored = runs_by_config(db)
    done = [any(r["status"] == "done" for r in stored.get(config_identity(c), [])) for c in configs]
    return done.count(False)


def hint_workers(configs, db: str | Path, resume: bool, say) -> None:
    """``say`` the ``workers_hint`` for a command that would train the runs ``configs()``
    lists (``resume``: those not finished in ``db``), where someone watches (a terminal or
    a notebook); elsewhere nothing is planned or read."""
    from .progress import wanted

    if not wanted(None):
        return
    planned = configs()
    hint = planned and workers_hint(pending_runs(planned, db, resume), str(planned[0].device))
    if hint:
        say(f"note: {hint}")


def common_args(
    workers: int,
    *,
    db: str | Path,
    sets: list[str],
    threads_given: bool,
    resume: bool,
    device: str | None,
    data_dir: str | None,
    export_to: str | Path | None,
    imports: list[str] | None,
) -> list[str]:
    """The options every worker of ``reproduce`` and ``sweep`` repeats from its parent's
    command, with ``threads`` shared out unless the command or its config sets it; the
    worker count is checked here, before anything starts."""
    if workers < 1:
        raise FedshiftError(f"--workers {workers} must be 1 or more")
    args = ["--db", str(db)]
    args += ["--resume"] if resume else []
    args += ["--device", device] if device else []
    args += ["--data-dir", data_dir] if data_dir else []
    args += ["--export", str(export_to)] if export_to is not None else []
    for module in imports or []:
        args += ["--import", module]
    threads = [] if threads_given else [f"threads={worker_threads(workers)}"]
    for item in sets + threads:
        args += ["--set", item]
    return args


def run_workers(command: str, args: list[str], workers: int, log_dir: Path, say) -> None:
    """Run ``fedshift COMMAND`` + ``args`` (``reproduce`` or ``sweep``; ``args`` from
    ``common_args``, which checks ``workers``, and the command's own) in ``workers``
    processes that share its runs, until all have exited; ``say(line)`` reports progress.
    Raises ``KeyboardInterrupt`` when interrupted (every worker stopped at a checkpoint
    first) and ``FedshiftError`` naming the log of a worker that failed."""
    log_dir.mkdir(parents=True, exist_ok=True)
    claims = Path(tempfile.mkdtemp(prefix="claims-", dir=log_dir))
    argv = [sys.executable, "-m", "fedshift.cli", command, *args, "--worker-claims", str(claims)]
    procs: list[tuple[subprocess.Popen, Path]] = []
    stopping = False

    def stop(*_) -> None:
        nonlocal stopping
        stopping = True

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        for k in range(workers):
            log = log_dir / f"worker-{k}.log"
            with log.open("w") as out:
                procs.append((subprocess.Popen(argv, stdout=out, stderr=out), log))
        say(f"{workers} workers on the {command}'s runs (logs: {log_dir}/worker-*.log)")
        claimed_before = 0
        while any(p.poll() is None for p, _ in procs):
            if stopping:
                break
            n = sum(1 for _ in claims.iterdir())
            if n != claimed_before:
                say(f"runs taken so far: {n}")
                claimed_before = n
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        stopping = True
    finally:  # on a stop, and on any error of the parent's own: no worker is left running
        signal.signal(signal.SIGTERM, previous)
        _stop_all([p for p, _ in procs])
        shutil.rmtree(claims, ignore_errors=True)
    if stopping:
        say("every worker stopped at a checkpoint; the same command with --resume continues")
        raise KeyboardInterrupt
    failed = [(p.returncode, log) for p, log in procs if p.returncode != 0]
    if failed:
        code, log = failed[0]
        raise FedshiftError(
            f"{len(failed)} of {workers} workers failed (exit {code}); see {log}: the runs "
            "finished so far are in the store, and the same command with --resume continues"
        )


def _stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every worker still alive and wait for them: each stops at its round's end
    with a checkpoint (unlike a second SIGINT after a terminal's Ctrl-C, SIGTERM never cuts
    the round short)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
