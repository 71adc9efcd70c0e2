"""What a report's runs were and where they ran: every config key and the environment
(versions, platform, device), one column per run, so a report read months later, or sent
to someone, says how to get its numbers again."""

from __future__ import annotations

import json
from typing import Any


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if value == "":
        return '""'
    return value if isinstance(value, str) else json.dumps(value)


def config_rows(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Every config key any run has, in the order they first appear; "—" where a run
    lacks it."""
    keys = list(dict.fromkeys(k for r in runs for k in (r["config"] or {})))
    head = ["config key"] + [r["run_id"] for r in runs]
    rows = [[k] + [_text((r["config"] or {}).get(k)) for r in runs] for k in keys]
    return head, rows


def environment_rows(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Versions, platform, device and threads as recorded at the run's start, the devices
    of its resumes, and its data fingerprint."""
    envs = [r.get("environment") or {} for r in runs]
    keys = list(dict.fromkeys(k for e in envs for k, v in e.items() if not isinstance(v, dict)))
    keys = [k for k in keys if k != "resumes"]
    head = ["environment"] + [r["run_id"] for r in runs]
    rows = [[k] + [_text(e.get(k)) for e in envs] for k in keys]
    if any(e.get("resumes") for e in envs):
        resumed = [
            ", ".join(f"round {x['round']} on {x['device']}" for x in e.get("resumes", [])) or "—"
            for e in envs
        ]
        rows.append(["resumed"] + resumed)
    if any((e.get("data") or {}).get("fingerprint") for e in envs):
        prints = [((e.get("data") or {}).get("fingerprint") or "—")[:16] for e in envs]
        rows.append(["data fingerprint"] + prints)
    return head, rows
