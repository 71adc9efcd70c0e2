"""Runs that did not finish (interrupted, failed, diverged, still running) in reports and
comparisons: their accuracies are those of their last evaluated round, and every label
says so — ``(interrupted at round 7/20)`` — so a partial curve is never read as a result."""

from __future__ import annotations

EMPTY = {"per_env": {}, "per_client": [], "worst": None, "average": None, "worst_client": None}


def partial_note(run: dict) -> str | None:
    """``interrupted at round 7/20`` for a run without final metrics, else None."""
    if run.get("partial") is None:
        return None
    p = run["partial"]
    status = "unfinished" if p["status"] == "done" else p["status"]
    return f"{status} at round {p['rounds_done']}/{p['rounds']}"


def with_last_evaluation(run: dict) -> dict:
    """The run as reports read it: one without final metrics gets those of its last
    evaluated round (or none) and ``partial`` = status, rounds done, rounds and the
    evaluated round; a finished run is returned as it is, with ``partial`` None."""
    if run.get("metrics"):
        return {**run, "partial": None}
    evaluated = [r for r in run["round_metrics"] if r["metrics"]]
    last = evaluated[-1] if evaluated else None
    partial = {
        "status": run["status"],
        "rounds_done": run["rounds_done"],
        "rounds": run["rounds"],
        "evaluated_round": last["round"] if last else None,
    }
    return {**run, "metrics": {**EMPTY, **(last["metrics"] if last else {})}, "partial": partial}


def partial_sentence(runs: list[dict]) -> str | None:
    """One sentence for a report whose runs include unfinished ones; None if none is."""
    notes = []
    for r in runs:
        if r.get("partial") is None:
            continue
        at = r["partial"]["evaluated_round"]
        last = f"last evaluated at round {at}" if at else "never evaluated"
        notes.append(f"{r['run_id']} {partial_note(r)}, {last}")
    if not notes:
        return None
    return (
        "Unfinished runs: their accuracies are those of their last evaluation, not final "
        f"results, and their curves stop where they stopped ({'; '.join(notes)})."
    )
