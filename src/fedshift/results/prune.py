"""`fedshift runs --prune`: free the disk space of finished runs' checkpoints. Only a run
that is ``done`` with its final metrics loses its checkpoint; an interrupted, failed or
running one (or one done without metrics, which ``--resume`` repairs) keeps it."""

from __future__ import annotations

from pathlib import Path

from .store import RUN_ID, checkpoint_path


def prunable(db: str | Path, runs: list[dict]) -> list[tuple[str, Path, int]]:
    """(run id, checkpoint file, bytes) of each finished run among ``runs`` that has one."""
    out = []
    for r in runs:
        if r["status"] != "done" or not r["metrics"] or not RUN_ID.fullmatch(str(r["run_id"])):
            continue
        path = checkpoint_path(db, r["run_id"])
        if path.is_file():
            out.append((r["run_id"], path, path.stat().st_size))
    return out


def prune(db: str | Path, runs: list[dict], dry_run: bool = False) -> list[tuple[str, Path, int]]:
    """Delete (unless ``dry_run``) the checkpoints :func:`prunable` names; returns them."""
    found = prunable(db, runs)
    if not dry_run:
        for _, path, _ in found:
            path.unlink(missing_ok=True)
    return found
