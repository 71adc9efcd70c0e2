"""The report of a reproduced table: ``report.md`` with the published numbers beside ours
and the ordering compared, its plots, and the JSON line of ``fedshift reproduce --json``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .comparison import ALPHA, METRICS, MIN_SEEDS, MethodResult

if TYPE_CHECKING:
    from ..tables import Table


def _f(v, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _pm(mean, std) -> str:
    if mean is None:
        return "—"
    return f"{mean:.1f} ± {std:.1f}" if std is not None else f"{mean:.1f}"


def write_reproduction_report(
    table: Table,
    results: list[MethodResult],
    skipped: list[str],
    comparison: dict,
    out_dir: str | Path,
    db: str | Path,
    settings: dict[str, Any],
) -> Path:
    """``report.md`` (published beside ours, ordering comparison), a per-environment plot,
    a published-vs-ours plot, and the per-run report of results/report.py under runs/."""
    from .plots import per_env_figure, save
    from .report import FIGURES, _md_table, write_report
    from .store import RunStore

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    head = ["method", "algorithm"]
    for m in table.metrics:
        head += [f"{m} (published)", f"{m} (ours)"]
    head += ["runs"]
    rows = []
    for r in results:
        row = [r.method.name + degenerate_mark(r), f"`{r.method.algorithm}`"]
        for m in table.metrics:
            row += [_f(r.method.published.get(m)), _pm(r.mean[m], r.std[m])]
        row.append(str(len(r.run_ids)))
        rows.append(row)
    for name in skipped:
        method = next(m for m in table.methods if m.name == name)
        row = [name, f"`{method.algorithm}` (not registered, skipped)"]
        for m in table.metrics:
            row += [_f(method.published.get(m)), "—"]
        rows.append(row + ["0"])
    k = len(results[0].per_seed)
    first = int(settings.get("first_seed", 0))
    seed_list = f"{k} seed(s)" if first == 0 else f"{k} seed(s), {first}–{first + k - 1}"
    parts = [
        f"# Reproduction of {table.source or table.id}: {table.title}",
        f"Table `{table.id}`; scenario `{settings['scenario']}` with options "
        f"`{settings['scenario_options']}`; {settings['rounds']} rounds; {seed_list} "
        f"({'quick run' if settings['quick'] else 'full run'}); run store `{db}`. "
        "Accuracies in %; ours are mean ± std over seeds; every method ran on the same "
        "partitions for a given seed.",
    ]
    if settings.get("overrides"):
        changed = ", ".join(f"`{k} = {v}`" for k, v in settings["overrides"].items())
        parts.append(f"Settings changed from the table's (`--set`): {changed}.")
    if settings.get("not_run"):
        parts.append(
            "Methods of the table not run (`--methods` chose the others): "
            + ", ".join(settings["not_run"])
            + "."
        )
    if table.notes:
        parts.append(f"Notes: {table.notes}")
    parts += settings_records(table, [r.method for r in results])
    parts.append(_md_table(head, rows))
    bad = [r for r in results if r.degenerate]
    if bad:
        parts.append(
            "**Degenerate models** (marked †: a model that answers one class everywhere, "
            "whose training loss stayed at ln K, or that scores under the majority class on "
            "its own training data, or a run that diverged; they count in no gap and no rank "
            "correlation): "
            + "; ".join(
                f"{r.method.name} ({r.degenerate_seeds} of {len(r.per_seed)} seeds: "
                f"{next(s.get('degenerate_why') for s in r.per_seed if s.get('degenerate'))})"
                for r in bad
            )
            + "."
        )
    checks = model_checks(results)
    if checks:
        parts.append(
            "### What the models are\n\n"
            "Per seed, in seed order: accuracy on the model's own training rows (beside the "
            "majority class's share of them: a model near that share has learnt little of "
            "anything, degenerate or not), how many clients answer one class on their test "
            "rows, and the share of training rows whose top logit exceeds the next by more "
            "than 1000 (blown-up logits). A worst case bought with weak models shows here.\n\n"
            + _md_table(
                [
                    "method",
                    "training fit % (majority share)",
                    "clients one class",
                    "logits blown up %",
                ],
                checks,
            )
        )
    parts.append("## Ordering compared")
    parts.append(
        f"A published gap of at least {table.gap:g} points is **held** only when our "
        f"difference has the published sign and exceeds the seed noise: a one-sided paired "
        f"t-test over seeds (every method ran on the same partitions for a seed) with "
        f"p < {ALPHA:g}, and at least {MIN_SEEDS} seeds. Otherwise its status says why: "
        "*within noise*, *tie*, *reversed* (significant the other way), *reversed, within "
        "noise*, *untested* (fewer seeds) or *degenerate*. Rank correlations leave out "
        "degenerate models."
    )
    for metric, c in comparison.items():
        lines = [
            f"**{metric}** over {c['methods']} non-degenerate methods: Spearman ρ = "
            f"{_f(c['spearman'], 2)}, Kendall τ = {_f(c['kendall'], 2)}.",
            f"Published order: {' > '.join(c['published_order']) or '—'}.",
            f"Our order: {' > '.join(c['our_order']) or '—'}.",
        ]
        if c["gaps"]:
            counts = ", ".join(f"{v} {k}" for k, v in c["gap_status"].items())
            lines.append(
                f"Published gaps of at least {table.gap:g} points held beyond seed noise: "
                f"{c['gaps_held']} of {len(c['gaps'])} ({counts})."
            )
            lines.append(
                _md_table(
                    ["better", "worse", "published gap", "our gap", "p", "status"],
                    [
                        [
                            g["better"],
                            g["worse"],
                            _f(g["published_gap"]),
                            _f(g["our_gap"]),
                            _f(g["p_value"], 3),
                            g["status"] if g["holds"] else f"**{g['status']}**",
                        ]
                        for g in c["gaps"]
                    ],
                )
            )
        else:
            lines.append(f"No published gap reaches {table.gap:g} points.")
        parts.append("\n\n".join(lines))
    if skipped:
        parts.append(f"Skipped (algorithm not registered): {', '.join(skipped)}.")

    # plots: our per-environment accuracy (mean ± std over seeds), and published vs ours
    save(per_env_figure(seed_series(results, settings["scenario"])), out / "accuracy_per_env.png")
    parts.append("## Accuracy per test environment\n\n![per environment](accuracy_per_env.png)")
    published = published_figure(table, results)
    if published is not None:
        save(published, out / "published_vs_ours.png")
        parts.append("## Published against ours\n\n![published vs ours](published_vs_ours.png)")
    first_seed = [  # each method's first seed that did not diverge
        next((i for i, m in zip(r.run_ids, r.per_seed, strict=True) if not m.get("diverged")), None)
        for r in results
    ]
    runs_report = write_report(RunStore(db), [i for i in first_seed if i], out / "runs", "md")
    parts.append(
        f"Per-run details (first seed of each method, {len(FIGURES)} plots): "
        f"[{runs_report.relative_to(out)}]({runs_report.relative_to(out)})."
    )
    path = out / "report.md"
    path.write_text("\n\n".join(parts) + "\n")
    return path


SETTINGS_SECTIONS = (
    ("tuned", "Settings the paper does not give (chosen on validation data)", "how it was chosen"),
    ("untuned", "Settings the paper does not give, set by hand (no validation chose them)", "why"),
    ("given", "Settings from the paper", "where the paper gives it"),
)


def settings_records(table: Table, methods) -> list[str]:
    """The report's account of how each setting was chosen, and of those with no record."""
    from ..tables import unrecorded_settings
    from .report import _md_table

    parts = []
    for record, title, how in SETTINGS_SECTIONS:
        rows = [["all methods", k, v] for k, v in getattr(table, record).items()]
        rows += [[m.name, k, v] for m in methods for k, v in getattr(m, record).items()]
        if rows:
            parts.append(f"### {title}\n\n" + _md_table(["method", "setting", how], rows))
    names = {m.name for m in methods}
    missing = [(who, k) for who, k in unrecorded_settings(table) if who in names | {"all methods"}]
    if missing:
        parts.append(
            "**Settings with no record** (neither the paper's, nor chosen on validation data, "
            "nor declared as set by hand): "
            + ", ".join(f"`{k}` ({who})" for who, k in missing)
            + "."
        )
    return parts


def model_checks(results: list[MethodResult]) -> list[list[str]]:
    """One row per method with the degeneracy checks' inputs seed by seed (training fit and
    majority share, clients answering one class, rows with blown-up logits); none for a
    table whose runs recorded none of them."""

    def seeds(r: MethodResult, key: str, digits: int = 1) -> str:
        return ", ".join(_f(s.get(key), digits) for s in r.per_seed)

    recorded = ("train_accuracy_pooled", "constant_clients", "train_saturated_share")
    rows = []
    for r in results:
        if not any(s.get(k) is not None for s in r.per_seed for k in recorded):
            continue
        shares = {_f(s.get("train_majority_share")) for s in r.per_seed}
        share = shares.pop() if len(shares) == 1 else seeds(r, "train_majority_share")
        fit = f"{seeds(r, 'train_accuracy_pooled')} ({share})"  # one share if seeds agree
        rows.append(
            [
                r.method.name + degenerate_mark(r),
                fit,
                seeds(r, "constant_clients", 0),
                seeds(r, "train_saturated_share"),
            ]
        )
    return rows


def degenerate_mark(r: MethodResult) -> str:
    if any(s.get("diverged") for s in r.per_seed):
        return " †diverged"
    return " †degenerate" if r.degenerate else ""


def seed_series(results: list[MethodResult], scenario: str) -> list:
    """One plotted series per method: its seeds, drawn as their mean ± std."""
    from .plots import Series

    out = []
    for r in results:
        seeds = [m for m in r.per_seed if not m.get("diverged")]  # no numbers to draw
        if seeds:
            mark = f" (mean ± std of {len(seeds)} seeds)" if len(seeds) > 1 else ""
            out.append(
                Series(
                    r.method.name + mark + degenerate_mark(r),
                    [{"scenario": scenario, "metrics": m} for m in seeds],
                )
            )
    return out


def published_figure(table: Table, results: list[MethodResult]):
    """Published against our accuracy, ours with ±1 std over seeds; None if no method has
    a published number."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    drawn = False
    low = 100.0  # the lowest point or error bar: the axes start below it, not at 0
    for metric, marker in zip(table.metrics, "os^", strict=False):
        pts = [
            (
                r.method.published[metric],
                r.mean[metric],
                r.method.name + degenerate_mark(r),
                r.std[metric] or 0.0,
            )
            for r in results
            if metric in r.method.published and r.mean[metric] is not None
        ]
        if not pts:
            continue
        drawn = True
        low = min(low, *(min(p[0], p[1] - p[3]) for p in pts))
        # ours: mean over seeds, error bar ±1 std
        label = f"{metric} (ours: mean ± std over seeds)"
        ax.errorbar(
            [p[0] for p in pts],
            [p[1] for p in pts],
            yerr=[p[3] for p in pts],
            fmt=marker,
            capsize=3,
            label=label,
        )
        # neighbours (sorted by position) alternate above / below so close labels stay legible
        for i, (p, o, name, _) in enumerate(sorted(pts)):
            dy = 3 if i % 2 == 0 else -9
            ax.annotate(name, (p, o), fontsize=7, xytext=(3, dy), textcoords="offset points")
    if not drawn:
        plt.close(fig)
        return None
    # axes from a multiple of 10 below the lowest point, so close methods spread out
    lo = max(0.0, 10.0 * math.floor((low - 5.0) / 10.0))
    ax.plot([lo, 100], [lo, 100], ":", color="grey")
    ax.set(xlabel="published accuracy (%)", ylabel="our accuracy (%)")
    ax.set(xlim=(lo, 100), ylim=(lo, 100))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def summary(table: Table, results: list[MethodResult], skipped, comparison, report) -> dict:
    """The JSON line of ``fedshift reproduce --json``."""
    from ..tables import RECORDS, unrecorded_settings

    return {
        "table": table.id,
        "report": str(report),
        "methods": [
            {
                "name": r.method.name,
                "algorithm": r.method.algorithm,
                "published": r.method.published,
                "ours": {m: r.mean[m] for m in METRICS},
                "ours_std": {m: r.std[m] for m in METRICS},
                "degenerate": r.degenerate,
                "degenerate_seeds": r.degenerate_seeds,
                "run_ids": r.run_ids,
                "settings": {rec: getattr(r.method, rec) for rec in RECORDS},
            }
            for r in results
        ],
        "settings": {
            **{rec: getattr(table, rec) for rec in RECORDS},
            "unrecorded": [list(x) for x in unrecorded_settings(table)],
        },
        "skipped": skipped,
        "comparison": comparison,
    }
