"""Plots drawn from the run store (never from in-memory state), so any past run can be plotted.

What every figure here keeps to, so that a reader can trust it:

- runs tested on different environments (another scenario, another dataset or another set of
  test environments) are never drawn on one axis: each set gets its own panel, with a note;
- seeds of one configuration are one series: their mean, with a ±1 std band (error bars on a
  categorical axis);
- every series has its own colour, line style and hollow marker, drawn larger first, so that
  two equal curves stay visible;
- lines join test environments only along an ordered numeric axis (``p=0.0 … p=1.0``); named
  environments (``e00``, ``photo``) are markers without lines;
- round axes tick at whole rounds.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from ..eval.metrics import mean_std  # noqa: E402
from .store import RunStore  # noqa: E402

DEGENERATE = " †degenerate"
# config keys that say where or how a run ran, not what it is: runs differing only in these
# (and the seed) are seeds of one configuration
NOT_IDENTITY = ("seed", "device", "data_dir", "checkpoint_every")
# above this many named (unordered) environments, one distribution per series, not markers
LABELLED_ENVS = 30


def _env_x(names: list[str]) -> tuple[list[float], bool]:
    """Numeric x positions for environments named like ``p=0.3`` (else their index)."""
    vals = [re.fullmatch(r"[a-z_]+=([-+0-9.eE]+)", n) for n in names]
    if all(vals):
        return [float(v.group(1)) for v in vals], True
    return list(range(len(names))), False


@dataclass
class Series:
    """One line of a figure: a run, or several seeds of one configuration (``runs``: run
    records, or records with at least ``metrics`` and optionally ``round_metrics``)."""

    label: str
    runs: list[dict]

    @property
    def degenerate(self) -> bool:
        return any((r.get("metrics") or {}).get("degenerate") for r in self.runs)

    @property
    def envs(self) -> list[str]:
        return list(self.runs[0]["metrics"]["per_env"])

    def per_env(self) -> tuple[list[float], list[float]]:
        """Mean and std over the series' runs in each environment (nan where none has one)."""
        means, stds = [], []
        for e in self.envs:
            m, s = mean_std([r["metrics"]["per_env"].get(e) for r in self.runs])
            means.append(m)
            stds.append(s)
        return means, stds


def _identity(run: dict) -> str:
    cfg = {k: v for k, v in (run.get("config") or {}).items() if k not in NOT_IDENTITY}
    data = (run.get("environment") or {}).get("data") or {}
    if data.get("source") == "python":  # not rebuilt from the seed: its data are its own
        cfg["data fingerprint"] = data.get("fingerprint")
    return json.dumps(cfg, sort_keys=True, default=str)


def seed_groups(runs: list[dict]) -> list[list[dict]]:
    """The runs grouped by configuration (seed, device and data folder aside), in the order
    each configuration first appears; a run whose config is unknown stays alone."""
    groups: dict[str, list[dict]] = {}
    for i, run in enumerate(runs):
        key = _identity(run) if run.get("config") else f"#{i}"
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def series_of(runs: list[dict], label) -> list[Series]:
    """One series per configuration: ``label(run)`` for a lone run, and for several seeds
    the algorithm, the run ids and 'mean ± std of K seeds'."""
    out = []
    for group in seed_groups(runs):
        if len(group) == 1:
            out.append(Series(label(group[0]), group))
            continue
        first = group[0]
        oracle = ", oracle data" if (first.get("config") or {}).get("scenario.oracle") else ""
        seeds = sorted({r.get("seed") for r in group}, key=str)
        what = f"{len(group)} seeds" if len(seeds) == len(group) else f"{len(group)} runs"
        bad = DEGENERATE if any((r.get("metrics") or {}).get("degenerate") for r in group) else ""
        ids = ", ".join(r["run_id"] for r in group)
        name = f"{first['algorithm']} ({ids}){oracle}: mean ± std of {what}{bad}"
        out.append(Series(name, group))
    return out


def seed_group_note(runs: list[dict]) -> str | None:
    """One sentence naming the runs drawn as one mean ± std series; None if none are."""
    groups = [g for g in seed_groups(runs) if len(g) > 1]
    if not groups:
        return None
    said = "; ".join(", ".join(r["run_id"] for r in g) for g in groups)
    return f"runs of one configuration with different seeds are drawn as their mean ± std: {said}"


def env_set_key(run: dict) -> tuple:
    """What makes two runs' test accuracies comparable: the same scenario, dataset and test
    environments."""
    cfg = run.get("config") or {}
    return (
        run.get("scenario"),
        cfg.get("scenario.dataset"),
        tuple((run.get("metrics") or {}).get("per_env") or ()),
    )


def _env_set_title(key: tuple) -> str:
    scenario, dataset, envs = key
    name = str(scenario) + (f" ({dataset})" if dataset else "")
    shown = ", ".join(envs) if len(envs) <= 3 else f"{envs[0]} … {envs[-1]}"
    return f"{name}: {len(envs)} test env{'s' if len(envs) != 1 else ''} ({shown})"


def _evaluated(run: dict) -> bool:
    """An unfinished run may never have been evaluated: it has no environments to draw."""
    return bool((run.get("metrics") or {}).get("per_env"))


def env_sets(series: list[Series]) -> list[tuple[tuple, list[Series]]]:
    sets: dict[tuple, list[Series]] = {}
    for s in series:
        if _evaluated(s.runs[0]):
            sets.setdefault(env_set_key(s.runs[0]), []).append(s)
    return list(sets.items())


def env_sets_note(runs: list[dict]) -> str | None:
    """One sentence when the runs were tested on different environments; None otherwise."""
    keys: dict[tuple, list[str]] = {}
    for r in filter(_evaluated, runs):
        keys.setdefault(env_set_key(r), []).append(r["run_id"])
    if len(keys) < 2:
        return None
    sets = "; ".join(f"{_env_set_title(k)}: {', '.join(ids)}" for k, ids in keys.items())
    return (
        f"these runs were tested on {len(keys)} different sets of environments, whose "
        f"accuracies are not comparable, so each set is plotted in its own panel ({sets})"
    )


MARKERS = "o^sDvP*h<>pd"
LINESTYLES = ["-", "--", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)), (0, (3, 1, 1, 1))]


def styles(n: int) -> list[dict]:
    """A colour, line style and hollow marker per series: colours and markers differ up to
    twelve series, line styles repeat after six. Earlier series are drawn wider and with
    larger markers, so a later one drawn on an equal curve leaves it visible around itself.
    Thin dotted lines are kept for degenerate models."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    out = []
    for i in range(n):
        out.append(
            dict(
                color=cmap(i % cmap.N),
                marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[i % len(LINESTYLES)],
                markersize=max(4.0, 12.0 * 0.85**i),
                linewidth=max(1.0, 2.6 - 0.25 * i),
                markerfacecolor="none",
                markeredgewidth=1.4,
            )
        )
    return out


def _degenerate_style(style: dict) -> dict:
    return {**style, "linestyle": ":", "linewidth": 1.2}


def twins(
    curves: list[tuple[list[float], list[float]]], tol: float = 0.05, relative: bool = False
) -> list[int | None]:
    """For each curve (x, y), the first earlier curve it equals (to ``tol`` at every point,
    a fraction of the value if ``relative``), which it would hide when drawn on top; None
    if there is none. Accuracies (%) are equal to 0.05, half the tables' last digit."""

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= tol * (max(abs(a), abs(b)) if relative else 1.0)

    out: list[int | None] = []
    for j, (xj, yj) in enumerate(curves):
        same = (
            i
            for i in range(j)
            if curves[i][0] == xj
            and yj
            and all(close(a, b) for a, b in zip(curves[i][1], yj, strict=True))
        )
        out.append(next(same, None))
    return out


def name_twins(labels: list[str], *panels: list[int | None], what: str = "curve") -> list[str]:
    """The labels, each followed by 'same curve as …' where it equals an earlier series in
    every panel given."""
    out = []
    for j, label in enumerate(labels):
        found = {p[j] for p in panels}
        twin = found.pop() if len(found) == 1 else None
        out.append(label + (f" (same {what} as {labels[twin]})" if twin is not None else ""))
    return out


def integer_rounds(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _analytic_oracles(series: list[Series]) -> list[float]:
    """The Bayes accuracies the runs' data report (e.g. scm's, on the causal latents)."""
    found = {
        float(r["environment"]["oracle_accuracy"])
        for s in series
        for r in s.runs
        if (r.get("environment") or {}).get("oracle_accuracy") is not None
    }
    return sorted(found)


def draw_per_env(ax, series: list[Series], style: list[dict]) -> None:
    """Accuracy per test environment of series that share their environments: lines along
    an ordered numeric axis, markers side by side for a few named environments, and one
    distribution per series for many named environments."""
    names = series[0].envs
    x, numeric = _env_x(names)
    stats = [s.per_env() for s in series]
    if not numeric and len(names) > LABELLED_ENVS:
        draw_distributions(ax, series, style, [m for m, _ in stats], "environments")
        for i, value in enumerate(_analytic_oracles(series)):
            ax.axvline(value, ls="--", color="k", lw=1, label="analytic oracle" if not i else None)
        ax.set_xlabel(f"test accuracy (%) in each of the {len(names)} test environments")
        return
    dodge = 0.0 if numeric else min(0.5 / len(series), 0.12)
    same = twins([(x, m) for m, _ in stats])
    labels = name_twins([s.label for s in series], same, what="curve" if numeric else "values")
    for i, (s, st, (mean, std)) in enumerate(zip(series, style, stats, strict=True)):
        st = _degenerate_style(st) if s.degenerate else st
        if not numeric:  # categorical: markers only, side by side so equal values show
            st = {**st, "linestyle": "None", "markersize": 7}
        xs = [v + (i - (len(series) - 1) / 2) * dodge for v in x]
        ax.plot(xs, mean, label=labels[i], clip_on=False, **st)  # markers at 100 % whole
        if len(s.runs) > 1:
            if numeric:
                lo = [m - d for m, d in zip(mean, std, strict=True)]
                hi = [m + d for m, d in zip(mean, std, strict=True)]
                ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.25, lw=0)
            else:
                ax.errorbar(xs, mean, yerr=std, fmt="none", ecolor=st["color"], capsize=3)
    for i, value in enumerate(_analytic_oracles(series)):
        ax.axhline(value, ls="--", color="k", lw=1, label="analytic oracle" if not i else None)
    if numeric:
        ax.set_xlabel(names[0].split("=")[0] + " (test environment)")
    else:
        turn = len(names) > 4
        ax.set_xticks(x, names, rotation=30 if turn else 0, ha="right" if turn else "center")
        ax.set_xlim(-0.5, len(names) - 0.5)
        ax.set_xlabel("test environment (no order: markers, not lines)")
    ax.set(ylabel="test accuracy (%)", ylim=(0, 100))
    ax.grid(alpha=0.3)


def panels(n: int, width: float = 6.5, height: float = 4.2, cols: int = 1):
    """A figure with ``n`` rows of ``cols`` panels (rows wrap in threes when ``cols`` is
    1), returned as the list of its axes in reading order."""
    ncols = cols if cols > 1 else min(n, 3)
    nrows = math.ceil(n * cols / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width * ncols, height * nrows + 0.6),
        squeeze=False,
        layout="constrained",  # room for the legend below ("outside lower center")
    )
    flat = list(axes.flat)
    for ax in flat[n * cols :]:
        ax.set_visible(False)
    return fig, flat[: n * cols]


def legend_below(fig, axes) -> None:
    """One legend for the whole figure, below it (each label once), in as many columns
    (up to three) as its longest label leaves room for."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    if seen:
        column = 0.055 * max(map(len, seen)) + 0.7  # inches, at font size 7
        fig.legend(
            list(seen.values()),
            list(seen),
            fontsize=7,
            loc="outside lower center",
            ncol=max(1, min(3, int(fig.get_figwidth() / column))),
            frameon=False,
        )


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def per_env_figure(series: list[Series], title: str | None = None) -> Figure:
    """Accuracy against the test environments, one panel per set of environments."""
    sets = env_sets(series)
    fig, axes = panels(len(sets))
    style = dict(zip(map(id, series), styles(len(series)), strict=True))
    for ax, (key, members) in zip(axes, sets, strict=True):
        draw_per_env(ax, members, [style[id(s)] for s in members])
        if len(sets) > 1:
            ax.set_title(_env_set_title(key), fontsize=9)
    if len(sets) > 1:
        note = "Runs tested on different environments: one panel per set, not comparable."
        fig.suptitle((f"{title}\n" if title else "") + note, fontsize=9)
    elif title:
        fig.suptitle(title)
    legend_below(fig, axes)
    return fig


def plot_accuracy_per_env(
    store: RunStore, runs: list[tuple[str, str]], path: str | Path, title: str
) -> Path:
    """One line per (label, run_id): client-averaged test accuracy in each environment."""
    series = []
    for label, run_id in runs:
        run = store.run(run_id)
        bad = bool(run["metrics"].get("degenerate"))
        series.append(Series(label + (DEGENERATE if bad else ""), [run]))
    return save(per_env_figure(series, title), path)


# ---------------------------------------------------------------- training curves


def _points(run: dict, by: str, what: str) -> dict[int, tuple[float, float]]:
    """round -> (x, y) of one run: ``what`` is ``average`` / ``worst`` test accuracy (rounds
    that were evaluated) or the training ``loss`` (every finite one); x is the round or the
    communicated MB so far."""
    out, total = {}, 0
    for r in run.get("round_metrics") or []:
        total += r["bytes_up"] + r["bytes_down"]
        x = r["round"] if by == "round" else total / 1e6
        if what == "loss":
            y = r.get("loss")
        else:
            y = (r.get("metrics") or {}).get(what)
        if y is not None and math.isfinite(y):
            out[r["round"]] = (x, float(y))
    return out


def curve(series: Series, by: str, what: str) -> tuple[list[float], list[float], list[float]]:
    """x, mean and std over the series' runs at the rounds every run has."""
    per_run = [_points(r, by, what) for r in series.runs]
    rounds = sorted(set.intersection(*(set(p) for p in per_run)))
    xs, means, stds = [], [], []
    for k in rounds:
        xs.append(sum(p[k][0] for p in per_run) / len(per_run))
        m, s = mean_std([p[k][1] for p in per_run])
        means.append(m)
        stds.append(s)
    return xs, means, stds


def curve_twins(series: list[Series], by: str, what: str) -> list[int | None]:
    if what == "loss":  # equal to 0.1 % of the loss
        return twins([curve(s, by, what)[:2] for s in series], 1e-3, relative=True)
    return twins([curve(s, by, what)[:2] for s in series])


def draw_curves(
    ax, series: list[Series], style: list[dict], by: str, what: str, labels: list[str]
) -> list[float]:
    """One line per series (mean ± std band for seeds); returns every y drawn."""
    drawn: list[float] = []
    curves = [curve(s, by, what) for s in series]
    for i, (s, st, (xs, mean, std)) in enumerate(zip(series, style, curves, strict=True)):
        if not xs:
            continue
        st = _degenerate_style(st) if s.degenerate else st
        step = max(1, len(xs) // 10)  # about ten markers a line, shifted per series
        clip = what == "loss"  # accuracy markers at 100 % whole; a cut loss axis clips
        ax.plot(xs, mean, label=labels[i], markevery=(i % step, step), clip_on=clip, **st)
        if len(s.runs) > 1:
            lo = [m - d for m, d in zip(mean, std, strict=True)]
            hi = [m + d for m, d in zip(mean, std, strict=True)]
            ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.25, lw=0)
            drawn += lo + hi
        drawn += mean
    if by == "round":
        integer_rounds(ax)
        ax.set_xlabel("round")
    else:
        ax.set_xlabel("communicated MB (up + down)")
    ax.grid(alpha=0.3)
    return drawn


def accuracy_curves_figure(series: list[Series], by: str) -> Figure:
    """Average and worst test accuracy (two panels) against rounds or communicated MB; one
    row per set of test environments."""
    sets = env_sets(series)
    cols = 2 if any(len(key[2]) > 1 for key, _ in sets) else 1
    fig, axes = panels(len(sets), cols=cols, width=5.2)
    style = dict(zip(map(id, series), styles(len(series)), strict=True))
    for row, (key, members) in enumerate(sets):
        st = [style[id(s)] for s in members]
        kinds = ("average", "worst")[:cols]
        labels = name_twins(
            [s.label for s in members], *(curve_twins(members, by, w) for w in kinds)
        )
        for col, what in enumerate(kinds):
            ax = axes[row * cols + col]
            if col and len(key[2]) == 1:  # one environment: its worst is its average
                ax.set_visible(False)
                continue
            draw_curves(ax, members, st, by, what, labels)
            title = {
                "average": "average over test environments",
                "worst": "worst test environment",
            }[what]
            if len(key[2]) == 1:
                title = "one test environment (average = worst)"
            if len(sets) > 1:
                title = f"{_env_set_title(key)}\n{title}"
            ax.set_title(title, fontsize=9)
            ax.set(ylabel="test accuracy (%)", ylim=(0, 100))
    if len(sets) > 1:
        fig.suptitle(
            "Runs tested on different environments: one row per set, not comparable.",
            fontsize=9,
        )
    legend_below(fig, axes)
    return fig


def loss_figure(series: list[Series]) -> Figure:
    """Training loss (the cohort's example-weighted mean) against rounds; a log axis when
    the losses are positive and span a decade. One panel per set of test environments."""
    sets = env_sets(series)
    fig, axes = panels(len(sets))
    style = dict(zip(map(id, series), styles(len(series)), strict=True))
    for ax, (key, members) in zip(axes, sets, strict=True):
        labels = name_twins([s.label for s in members], curve_twins(members, "round", "loss"))
        st = [style[id(s)] for s in members]
        drawn = draw_curves(ax, members, st, "round", "loss", labels)
        if drawn and min(drawn) > 0 and max(drawn) >= 10 * min(drawn):  # a decade or more
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(_minor_log_label))
        ax.set_ylabel("training loss (cohort mean)")
        title = [_env_set_title(key)] if len(sets) > 1 else []
        cut = _cut_outliers(ax, members, drawn)
        if cut:
            title.append(cut)
        if title:
            ax.set_title("\n".join(title), fontsize=9)
    legend_below(fig, axes)
    return fig


def _minor_log_label(v: float, _) -> str:
    """Minor ticks of a log axis labelled at 2, 3 and 5 times a power of ten only."""
    if v <= 0:
        return ""
    lead = v / 10 ** math.floor(math.log10(v))
    return f"{v:g}" if any(abs(lead - d) < 1e-6 for d in (2, 3, 5)) else ""


def _cut_outliers(ax, series: list[Series], drawn: list[float]) -> str | None:
    """Cut the y axis above the bulk of the values when a few lie more than ten times
    higher (one diverging round must not flatten every curve); returns the sentence that
    says so, naming the series cut."""
    if len(drawn) < 5:
        return None
    values = sorted(drawn)
    bulk = values[int(0.9 * (len(values) - 1))]
    if bulk <= 0 or values[-1] <= 10 * bulk:
        return None
    top = 2 * bulk
    ax.set_ylim(top=top)
    over = [s.label.split(" (")[0] for s in series if max(curve(s, "round", "loss")[1]) > top]
    verb = "reaches" if len(over) == 1 else "reach"
    return f"axis cut at {top:.3g}: {', '.join(over)} {verb} {values[-1]:.3g}"


# ---------------------------------------------------------------- per client

CLIENT_BARS_MAX = 20  # above this many clients a bar chart is unreadable: distributions


def clients_figure(runs: list[dict], labels: list[str]) -> Figure:
    """Each client's accuracy (mean over test environments) for every run: grouped bars up
    to CLIENT_BARS_MAX clients, above that one box per run (quartiles, whiskers at 1.5 IQR)
    over the clients drawn as dots. Clients without test data are left out and named."""
    series = [Series(label, [run]) for run, label in zip(runs, labels, strict=True)]
    sets = env_sets(series)
    style = dict(zip(map(id, series), styles(len(series)), strict=True))
    most = max(len(r["metrics"]["per_client"]) for r in runs)
    bars = most <= CLIENT_BARS_MAX
    height = 4.2 if bars else max(3.0, 0.45 * max(len(m) for _, m in sets) + 1.4)
    fig, axes = panels(len(sets), height=height, width=7.0 if bars else 7.5)
    for ax, (key, members) in zip(axes, sets, strict=True):
        st = [style[id(s)] for s in members]
        values = [s.runs[0]["metrics"]["per_client"] for s in members]
        if bars:
            _client_bars(ax, members, st, values)
        else:
            draw_distributions(ax, members, st, values, "clients")
            ax.set_xlabel("client accuracy, mean over test envs (%)")
        title = _env_set_title(key) if len(sets) > 1 else ""
        missing = sorted({c for vals in values for c, v in enumerate(vals) if v is None})
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
            gone = f"left out, no test data: client{'s' if len(missing) > 1 else ''} {shown}"
            title += ("\n" if title else "") + gone
        if title:
            ax.set_title(title, fontsize=9)
    if len(sets) > 1:
        fig.suptitle(
            "Runs tested on different environments: one panel per set, not comparable.",
            fontsize=9,
        )
    if bars:
        legend_below(fig, axes)
    return fig


def _client_bars(ax, series: list[Series], style: list[dict], values: list[list]) -> None:
    width = 0.8 / len(series)
    for i, (s, st, vals) in enumerate(zip(series, style, values, strict=True)):
        xs = [c + (i - (len(series) - 1) / 2) * width for c, v in enumerate(vals) if v is not None]
        ax.bar(xs, [v for v in vals if v is not None], width, color=st["color"], label=s.label)
    n = max(len(v) for v in values)
    ax.set_xticks(range(n), [str(c) for c in range(n)])
    ax.set(xlabel="client", ylabel="accuracy, mean over test envs (%)", ylim=(0, 100))
    ax.grid(axis="y", alpha=0.3)


def draw_distributions(
    ax, series: list[Series], style: list[dict], values: list[list], what: str
) -> None:
    """One horizontal box per series (quartiles, whiskers at 1.5 IQR) over its values,
    which are drawn as dots too; the first series on top. For many clients or many
    unordered environments, where bars or one marker each would be unreadable."""
    import numpy as np

    rng = np.random.default_rng(0)  # the dots' vertical jitter only
    data = [[v for v in vals if v is not None and not math.isnan(v)] for vals in values]
    pos = list(range(len(series), 0, -1))
    box = ax.boxplot(
        data,
        positions=pos,
        orientation="horizontal",
        widths=0.6,
        showfliers=False,
        patch_artist=True,
        medianprops={"color": "black"},
    )
    for patch, st in zip(box["boxes"], style, strict=True):
        patch.set(facecolor=(*st["color"][:3], 0.25), edgecolor=st["color"])
    for p, vals, st in zip(pos, data, style, strict=True):
        alpha = 0.6 if len(vals) <= 200 else 0.15
        ax.scatter(
            vals, p + rng.uniform(-0.22, 0.22, len(vals)), s=7, color=st["color"], alpha=alpha
        )
    names = [f"{s.label}\n{len(v)} {what}" for s, v in zip(series, data, strict=True)]
    ax.set_yticks(pos, names)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlim(-2, 102)
    ax.grid(axis="x", alpha=0.3)
