"""Plots drawn from the run store (never from in-memory state), so any past run can be plotted."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .store import RunStore  # noqa: E402


def _env_x(names: list[str]) -> tuple[list[float], bool]:
    """Numeric x positions for environments named like ``p=0.3`` (else their index)."""
    vals = [re.fullmatch(r"[a-z_]+=([-+0-9.eE]+)", n) for n in names]
    if all(vals):
        return [float(v.group(1)) for v in vals], True
    return list(range(len(names))), False


def plot_accuracy_per_env(
    store: RunStore, runs: list[tuple[str, str]], path: str | Path, title: str
) -> Path:
    """One line per (label, run_id): client-averaged test accuracy in each environment."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names: list[str] = []
    for label, run_id in runs:
        metrics = store.run(run_id)["metrics"]
        per_env = metrics["per_env"]
        names = list(per_env)
        x, numeric = _env_x(names)
        bad = bool(metrics.get("degenerate"))  # a one-class model: marked, drawn dotted
        ax.plot(
            x,
            [per_env[n] for n in names],
            ":" if bad else "-",
            marker="x" if bad else "o",
            label=label + (" †degenerate" if bad else ""),
        )
    x, numeric = _env_x(names)
    if numeric:
        ax.set_xlabel(names[0].split("=")[0] + " (test environment)")
    else:
        ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
