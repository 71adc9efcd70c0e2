"""Plot W4 (``population_scale.py --json`` output): seconds per round against the cohort
size (population fixed) and against the population size (cohort fixed), and peak RSS.

    python benchmarks/population_scale.py --json > scale.json
    python benchmarks/plot_scale.py scale.json docs/img/performance_scale.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        points = json.load(f)["w4.points"]
    by_pop = sorted((p for p in points if p["cohort"] == 100), key=lambda p: p["population"])
    biggest = max(p["population"] for p in points)
    by_cohort = sorted((p for p in points if p["population"] == biggest), key=lambda p: p["cohort"])
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    cs = [p["cohort"] for p in by_cohort]
    ax[0].plot(cs, [p["round_s"] for p in by_cohort], "o-", label="wall")
    ax[0].plot(cs, [p["round_cpu_s"] for p in by_cohort], "s--", label="CPU")
    ax[0].legend(fontsize=8)
    ax[0].set(
        xscale="log",
        xlabel="cohort size C (clients per round)",
        ylabel="seconds per round",
        title=f"population N = {biggest:,}",
    )
    ns = [p["population"] for p in by_pop]
    ax[1].plot(ns, [p["round_s"] for p in by_pop], "o-", label="wall")
    ax[1].plot(ns, [p["round_cpu_s"] for p in by_pop], "s--", label="CPU")
    ax[1].legend(fontsize=8)
    ax[1].set(
        xscale="log",
        xlabel="population N",
        ylabel="seconds per round",
        title="cohort C = 100",
        ylim=(0, 1.5 * max(p["round_s"] for p in by_pop)),
    )
    pops = [p["population"] for p in by_pop]
    ax[2].plot(pops, [p["peak_rss_mb"] for p in by_pop], "o-", label="peak RSS (process)")
    ax[2].plot(pops, [p["data_mb"] for p in by_pop], "s--", label="scenario tensors")
    ax[2].plot(
        pops, [p["rounds_rss_growth_mb"] for p in by_pop], "^-", label="RSS growth during rounds"
    )
    ax[2].set(xscale="log", xlabel="population N", ylabel="MB", title="memory, C = 100")
    ax[2].legend(fontsize=8)
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
