"""Report figures for what algorithms log per round (``RoundInfo.log`` → the run store's
``rounds.extras``): UCFL's simulated time and silhouette curve, FedIPG's contributions C_i^t,
and client faults. Each returns ``None`` when no run of the report logged that figure."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _label(run: dict) -> str:
    return f"{run['algorithm']} ({run['run_id']})"


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_over_sim_time(runs: list[dict], path: Path) -> Path | None:
    """Average accuracy against the simulated wall-clock of UCFL's communication model."""
    series = []
    for run in runs:
        xs, ys = [], []
        for r in run["round_metrics"]:
            t = (r.get("extras") or {}).get("sim_time_total")
            if t is not None and r["metrics"]:
                xs.append(t)
                ys.append(r["metrics"]["average"])
        if xs:
            series.append((run, xs, ys))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, xs, ys in series:
        ax.plot(xs, ys, marker=".", label=_label(run))
    ax.set(xlabel="simulated time (communication-time model)", ylabel="test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_silhouette(runs: list[dict], path: Path) -> Path | None:
    """The last logged silhouette curve (score against the number of streams) of each run."""
    curves = []
    for run in runs:
        logged = [(r.get("extras") or {}) for r in run["round_metrics"]]
        last = next((e for e in reversed(logged) if e.get("silhouette")), None)
        if last:
            ks = list(range(2, 2 + len(last["silhouette"])))
            pts = [(k, s) for k, s in zip(ks, last["silhouette"], strict=True) if s is not None]
            curves.append((run, pts, last.get("streams")))
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, pts, chosen in curves:
        (line,) = ax.plot(*zip(*pts, strict=True), marker="o", label=f"{_label(run)}")
        if chosen is not None:
            ax.axvline(chosen, ls="--", color=line.get_color(), alpha=0.6)
    ax.set(xlabel="number of streams k (dashed: chosen)", ylabel="silhouette score")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_contributions(runs: list[dict], path: Path) -> Path | None:
    """FedIPG's per-client contribution C_i^t against rounds (first run that logged it), on
    a symmetric-log axis (one late outlier must not flatten the rest), with a cross where a
    client exits aggregation."""
    for run in runs:
        per_client: dict[int, list[tuple[int, float]]] = {}
        exit_round: dict[int, int] = {}
        for r in run["round_metrics"]:
            e = r.get("extras") or {}
            if "contribution" in e and "clients" in e:
                for c, v in zip(e["clients"], e["contribution"], strict=True):
                    per_client.setdefault(c, []).append((r["round"], v))
            for c in e.get("exited", []):
                exit_round.setdefault(c, r["round"])
        if per_client:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for c, pts in sorted(per_client.items()):
                (line,) = ax.plot(*zip(*pts, strict=True), lw=1, label=f"client {c}")
                at = dict(pts).get(exit_round.get(c))
                if at is not None:
                    ax.plot([exit_round[c]], [at], "x", ms=9, mew=2, color=line.get_color())
            values = sorted(abs(v) for pts in per_client.values() for _, v in pts if v)
            if values:  # linear within the typical magnitude, logarithmic beyond it
                thresh = values[len(values) // 2]
                ax.set_yscale("symlog", linthresh=thresh, linscale=2)
                top = math.ceil(math.log10(values[-1]))
                decades = [10.0**k for k in range(math.ceil(math.log10(thresh)), top + 1)]
                ax.set_yticks(sorted([0.0] + decades + [-d for d in decades]))
            ax.axhline(0, color="black", lw=0.6)
            title = _label(run) + ("  (x: exits aggregation)" if exit_round else "")
            ax.set(xlabel="round", ylabel="contribution C_i^t (symlog)", title=title)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            if len(per_client) <= 12:
                ax.legend(fontsize=7, ncol=2)
            return _save(fig, path)
    return None


def event_rows(runs: list[dict]) -> list[list[str]]:
    """One row per run and fault kind: how many client uploads were affected."""
    rows = []
    for run in runs:
        counts: dict[str, int] = {}
        for r in run["round_metrics"]:
            for ev in (r.get("extras") or {}).get("events", []):
                counts[ev["event"]] = counts.get(ev["event"], 0) + 1
        rows += [[_label(run), kind, str(n)] for kind, n in sorted(counts.items())]
    return rows


OPTIONAL_FIGURES = [
    ("accuracy_per_sim_time.png", "Accuracy against simulated time", plot_over_sim_time),
    ("silhouette.png", "Silhouette score against the number of streams", plot_silhouette),
    ("contributions.png", "Per-client contributions C_i^t", plot_contributions),
]
