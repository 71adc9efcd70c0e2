"""A reproduced table against the published one: each method's numbers over seeds, the
rank correlation of the two orderings, and whether each published gap holds beyond the
seed noise (``fedshift reproduce``'s comparison)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..eval.metrics import HEADLINE_METRICS as METRICS
from ..eval.metrics import over_seeds

if TYPE_CHECKING:
    from ..tables import Method, Table


@dataclass
class MethodResult:
    """One method of a table over its seeds: each seed's metrics (a sweep's runs combined
    into one), their mean and standard deviation, and the mean per environment."""

    method: Method
    run_ids: list[str]
    per_seed: list[dict]  # metrics of each seed (sweep: combined over the sweep's runs)
    mean: dict[str, float | None]
    std: dict[str, float | None]
    per_env_mean: dict[str, float | None]

    @classmethod
    def from_seeds(cls, method: Method, run_ids: list[str], per_seed: list[dict]) -> MethodResult:
        """Mean ± std over seeds (:func:`over_seeds`; a diverged seed enters no number);
        one seed has no spread to report."""
        mean, std = (_numbers(d) for d in over_seeds(per_seed))
        spread = len(per_seed) > 1
        return cls(
            method,
            run_ids,
            per_seed,
            {k: mean.get(k) for k in METRICS},
            {k: std.get(k) if spread else None for k in METRICS},
            mean["per_env"],
        )

    @property
    def degenerate_seeds(self) -> int:
        return sum(bool(s.get("degenerate")) for s in self.per_seed)

    @property
    def degenerate(self) -> bool:
        """Any seed's model answered one class everywhere or never left chance loss."""
        return self.degenerate_seeds > 0

    def values(self, metric: str) -> list[float | None]:
        return [s.get(metric) for s in self.per_seed]


def _numbers(d: dict) -> dict:
    """NaN (no seed had the number) as None, in the numbers and per environment."""

    def fix(v):
        return None if isinstance(v, float) and math.isnan(v) else v

    out = {k: fix(v) for k, v in d.items() if k not in ("per_env", "per_client")}
    out["per_env"] = {e: fix(v) for e, v in d["per_env"].items()}
    return out


MIN_SEEDS = 3  # a published gap is tested only with at least this many seeds per method
ALPHA = 0.05  # one-sided paired t-test level for "our difference exceeds the seed noise"


def gap_test(better: list, worse: list) -> tuple[str, float | None]:
    """Whether our numbers keep a published gap ``better > worse``, beyond seed noise.

    Every method runs on the same partitions for a given seed, so the seeds pair: a
    one-sided paired t-test (SciPy's ``ttest_rel``) of our per-seed differences. Returns a
    status — ``held`` (right sign, p < ALPHA), ``within noise`` (right sign, not
    significant), ``tie`` (equal means), ``reversed`` (wrong sign, significant the other
    way), ``reversed, within noise``, or ``untested`` (fewer than MIN_SEEDS paired seeds) —
    and the p-value of the published direction.
    """
    from scipy.stats import ttest_rel

    pairs = [(a, b) for a, b in zip(better, worse, strict=False) if a is not None and b is not None]
    diffs = [a - b for a, b in pairs]
    if not diffs:
        return "untested", None
    mean = sum(diffs) / len(diffs)
    if len(diffs) < MIN_SEEDS:
        return "untested", None
    if all(d == diffs[0] for d in diffs):  # no spread: the sign alone decides
        p = 0.0 if mean > 0 else 1.0
    else:
        p = float(
            ttest_rel([a for a, _ in pairs], [b for _, b in pairs], alternative="greater").pvalue
        )
    if mean == 0:
        return "tie", p
    if mean > 0:
        return ("held" if p < ALPHA else "within noise"), p
    return ("reversed" if 1.0 - p < ALPHA else "reversed, within noise"), p


def compare(table: Table, results: list[MethodResult]) -> dict[str, dict]:
    """Per published metric: Spearman / Kendall rank correlation between the published
    and our means over the methods whose models are not degenerate, and every published
    gap ≥ ``table.gap`` with its :func:`gap_test` status. A gap with a degenerate model on
    either side is never held (status ``degenerate``)."""
    from scipy.stats import kendalltau, spearmanr

    out = {}
    for metric in table.metrics:
        scored = [r for r in results if metric in r.method.published and r.mean[metric] is not None]
        rows = [(r.method.name, r.method.published[metric], r.mean[metric]) for r in scored]
        sound = [row for row, r in zip(rows, scored, strict=True) if not r.degenerate]
        entry: dict[str, Any] = {
            "methods": len(sound),
            "degenerate": [r.method.name for r in scored if r.degenerate],
            "spearman": None,
            "kendall": None,
        }
        if len(sound) >= 3:
            pub = [p for _, p, _ in sound]
            ours = [o for _, _, o in sound]
            rho = spearmanr(pub, ours).statistic
            tau = kendalltau(pub, ours).statistic
            entry["spearman"] = None if math.isnan(rho) else float(rho)
            entry["kendall"] = None if math.isnan(tau) else float(tau)
        gaps = []
        for ra, rb in itertools.permutations(scored, 2):
            pa, pb = ra.method.published[metric], rb.method.published[metric]
            if pa - pb < table.gap:
                continue
            if ra.degenerate or rb.degenerate:
                status, p = "degenerate", None
            else:
                status, p = gap_test(ra.values(metric), rb.values(metric))
            gaps.append(
                {
                    "better": ra.method.name,
                    "worse": rb.method.name,
                    "published_gap": round(pa - pb, 2),
                    "our_gap": round(ra.mean[metric] - rb.mean[metric], 2),
                    "status": status,
                    "p_value": None if p is None else round(p, 4),
                    "holds": status == "held",
                }
            )
        gaps.sort(key=lambda g: -g["published_gap"])
        entry["gaps"] = gaps
        entry["gaps_held"] = sum(g["holds"] for g in gaps)
        entry["gap_status"] = {
            st: sum(g["status"] == st for g in gaps)
            for st in dict.fromkeys(g["status"] for g in gaps)
        }
        entry["published_order"] = [n for n, _, _ in sorted(rows, key=lambda r: -r[1])]
        entry["our_order"] = [n for n, _, _ in sorted(rows, key=lambda r: -r[2])]
        out[metric] = entry
    return out
