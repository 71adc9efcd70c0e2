"""Configs × seeds: the one loop behind ``fedshift run``, ``sweep``, ``reproduce`` and
``flower run``.

A command turns its arguments into :class:`Job` s (a validated config, the label of its
progress line, the data when a paper table fixes the partition) and hands them to
:func:`run_jobs`, which trains them one after another on this machine, records each run in
the store under the command's group, shows one progress line per run and yields one
:class:`Finished` per job, so a caller may stop early (a sweep drops a diverged point's
other seeds). With ``reuse`` (``reproduce --resume``) a stored run of the same
configuration stands in: a finished one as it is, a stopped one continued from its
checkpoint, so a paper-scale table spans sessions. A diverged run is a result
(``Finished.diverged``) with ``keep_diverged`` (a sweep's point, a table's seed; reused as
such, not trained again) and ends the command otherwise (``fedshift run``). ``flower
run`` builds its configs as ``run`` does (``config.command_configs``) and trains them all
in one Flower simulation or deployment (``flower/run.py``); its runs' summaries meet
``run``'s in :func:`seeds_summary` and ``cli_output.print_run_summary``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig
from .errors import Diverged, FedshiftError
from .eval.metrics import HEADLINE_METRICS as METRICS
from .eval.metrics import over_seeds
from .options import build_options

# progress(total_rounds, label) -> (bar with .stop(), on_round): the CLI's progress_bar
Progress = Callable[[int, str], tuple[Any, Callable | None]]


@dataclass
class Job:
    """One run a command asks for."""

    config: RunConfig
    label: str
    # a table's fixed partition, or a function that builds it when the job runs (a reused
    # run needs none); None: the run builds its scenario from its seed
    data: Any = None


@dataclass
class Finished:
    """What one job produced."""

    job: Job
    run_id: str
    metrics: dict  # the final metrics (a diverged run: diverged_metrics)
    summary: dict | None = None  # the run's JSON summary, for a run trained now
    diverged: str | None = None  # why it diverged
    reused: bool = False  # a finished run of the store, not trained again
    val: float | None = None  # validation accuracy (%), whether trained now or reused


def diverged_metrics(why: str) -> dict:
    """The metrics of a run that diverged: no numbers, counted as degenerate (so it enters
    no mean, rank correlation or held gap), with the reason kept for the report."""
    return {
        **dict.fromkeys(METRICS),
        "per_env": {},
        "per_client": [],
        "degenerate": True,
        "degenerate_why": why,
        "diverged": why,
    }


def run_jobs(
    jobs: Iterable[Job],
    *,
    db: str | Path | None,
    group: str | None = None,
    progress: Progress | None = None,
    keep_diverged: bool = False,
    reuse: bool = False,
    export_to: str | Path | None = None,
) -> Iterator[Finished]:
    """Train ``jobs`` in order on this machine, each recorded in ``db`` under ``group``;
    yields one :class:`Finished` per job as it ends. ``export_to``: each finished or
    diverged run is also written there as a file (``fedshift export``) as soon as it ends,
    so a long table's results outlive its store run by run."""
    for done in _run_jobs(jobs, db, group, progress, keep_diverged, reuse):
        if export_to is not None and db is not None:
            from .results.archive import export_runs

            export_runs(db, [done.run_id], export_to)
        yield done


def _run_jobs(jobs, db, group, progress, keep_diverged, reuse) -> Iterator[Finished]:
    from .api import resume as resume_api
    from .api import run as run_api

    for job in jobs:
        cfg, label = job.config, job.label
        before = earlier_run(db, cfg) if reuse and db is not None else None
        # done without final metrics (killed after its last round): resume repairs it
        if before is not None and before["status"] == "done" and before["metrics"]:
            yield Finished(job, before["run_id"], before["metrics"], reused=True, val=before["val"])
            continue
        if before is not None and before["status"] == "diverged" and keep_diverged:
            # a result, and a deterministic one: resumed from its last checkpoint it diverges
            # again (FedSR, Table 5.1 seed 1: round 497 twice), so it is not trained again
            why = before["error"] or "diverged"
            yield Finished(job, before["run_id"], diverged_metrics(why), diverged=why, reused=True)
            continue
        if before is not None:
            label += f" (resumed {before['run_id']})"
        if progress is not None:  # where no one watches, no hint
            hint_if_crowded(cfg)
        data = job.data() if callable(job.data) else job.data
        bar, on_round = progress(cfg.rounds, label) if progress else (None, None)
        quiet = None if bar is None else False  # the caller's bar, not the run's own
        try:
            if before is not None:
                out = resume_api(before["run_id"], db, data=data, on_round=on_round, progress=quiet)
            else:
                out = run_api(cfg, data=data, db=db, on_round=on_round, progress=quiet, group=group)
        except Diverged as e:
            if not keep_diverged:
                raise
            done = Finished(job, e.run_id, diverged_metrics(str(e)), diverged=str(e))
        else:
            summary = out.summary()
            done = Finished(job, out.run_id, out.metrics, summary=summary, val=summary["val"])
        finally:
            if bar is not None:
                bar.stop()
        yield done


def seeds_summary(summaries: list[dict]) -> dict[str, Any]:
    """One summary for the same config run with several seeds: ``metrics`` holds the mean
    over seeds of each number, ``metrics_std`` the standard deviation; costs are totals."""
    mean, std = over_seeds([s["metrics"] for s in summaries])
    first = summaries[0]
    return {
        "run_id": first["run_id"],
        "run_ids": [s["run_id"] for s in summaries],
        "algorithm": first["algorithm"],
        "scenario": first["scenario"],
        "rounds": first["rounds"],
        "seed": first["seed"],
        "seeds": [s["seed"] for s in summaries],
        "metrics": mean,
        "metrics_std": std,
        "time_s": round(sum(s["time_s"] for s in summaries), 3),
        "bytes_up": sum(s["bytes_up"] for s in summaries),
        "bytes_down": sum(s["bytes_down"] for s in summaries),
    }


# where and how a run ran and was logged, not what it is
MACHINE_KEYS = ("device", "data_dir", "tracking", "threads", "execution")


def _identity(config: dict) -> str:
    kept = {
        k: v
        for k, v in canonical_options(config).items()
        if k not in MACHINE_KEYS and not k.startswith("tracking.")
    }
    return json.dumps(kept, sort_keys=True, default=str)


def _option_classes() -> dict[str, Callable[[str], type]]:
    from .algorithms import ALGORITHMS
    from .data import SCENARIOS
    from .models.registry import MODELS

    return {
        "algorithm": lambda name: ALGORITHMS.get(name).Hyper,
        "scenario": lambda name: SCENARIOS.get(name).options,
        "model": lambda name: MODELS.get(name).options,
    }


def canonical_options(config: dict) -> dict:
    """``config`` (flat) with each section's options as their declared types and those at
    their defaults left out, so that one run has one identity however its options were
    written: ``--grid algorithm.penalty=0.001`` gives the string "0.001", a preset the
    number, and the default may be written out or not. Applied to stored runs' configs and
    to new ones alike (so no match that held before is lost). A section whose options
    cannot be read (a method no longer registered, a stale option) is left as it is."""
    out = dict(config)
    for section, options_of in _option_classes().items():
        keys = [k for k in config if k.startswith(f"{section}.")]
        name = config.get(section)
        if not keys or not isinstance(name, str) or not name:
            continue
        given = {key[len(section) + 1 :]: config[key] for key in keys}
        try:  # the options as a run would build them, and the defaults the same way
            cls = options_of(name)
            built, default = build_options(cls, given, section), build_options(cls, {}, section)
        except Exception:  # noqa: BLE001 — unreadable: the raw form, as before
            continue
        for key in keys:
            del out[key]
        out.update(
            {
                f"{section}.{field}": getattr(built, field)
                for field in given
                if getattr(built, field) != getattr(default, field)
            }
        )
    return out


def config_identity(cfg: RunConfig) -> str:
    """What makes two runs the same run: the config without the machine's keys (the key
    ``runs_by_config`` files a stored run of this config under)."""
    return _identity(json.loads(json.dumps(cfg.flat(), default=str)))


def runs_by_config(db: str | Path) -> dict[str, list[dict]]:
    """The store's runs, oldest first, filed by ``config_identity`` (none without a store)."""
    from .results.store import RunStore

    stored: dict[str, list[dict]] = {}
    for r in RunStore(db).runs() if Path(db).exists() else []:
        if r["config"]:
            stored.setdefault(_identity(r["config"]), []).append(r)
    return stored


def earlier_run(db: str | Path, cfg: RunConfig) -> dict | None:
    """The store's run of exactly this configuration (device and data folder aside): the
    newest finished one, else the newest stopped one (interrupted, failed or diverged),
    else None. One still running in another process is refused: two processes must not
    train it."""
    same = runs_by_config(db).get(config_identity(cfg), [])
    for status in ("done", "interrupted", "failed", "diverged"):
        found = [r for r in same if r["status"] == status]
        if found:
            return found[-1]
    if same:
        raise FedshiftError(
            f"run {same[-1]['run_id']} of this configuration is still running in another "
            "process; wait for it or stop it before --resume"
        )
    return None


_crowded_said = False  # once per process: a table's methods are run_jobs calls of their own


def hint_if_crowded(cfg) -> None:
    """Say once, on stderr where someone watches (a terminal or a notebook, as the progress
    bar), when the machine's other processes already fill every core."""
    global _crowded_said
    from rich.console import Console

    from .crowded import crowded_hint
    from .progress import wanted

    if _crowded_said or not wanted(None):
        return
    hint = crowded_hint(cfg.threads, str(cfg.device))
    if hint:
        _crowded_said = True
        Console(stderr=True, highlight=False).print(f"note: {hint}", markup=False)
