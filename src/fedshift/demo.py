"""The offline demo (`fedshift demo`): a few methods on `digits-shortcut`, scikit-learn's
digits with a coloured border that agrees with the label with probability p. Training
environments have high p, test environments sweep p from 0 to 1, so a model that learned
the colour shortcut collapses at low p; the oracle line (colour made uninformative in
training) shows what a shortcut-free model achieves."""

from __future__ import annotations

from pathlib import Path

from .api import run
from .results.plots import plot_accuracy_per_env
from .results.store import RunStore

# (label, algorithm, extra settings): later issues add their methods here.
DEMO_METHODS: list[tuple[str, str, dict]] = [
    ("fedavg", "fedavg", {}),
    ("fedprox", "fedprox", {}),
    ("ftfa", "ftfa", {}),
    ("local", "local", {}),
    # invariant personalized methods (docs/methods/invariant.md); FedSDR's γ chosen on this
    # scenario's validation environment (the thesis's CMNIST value 1e4 collapses our MLP)
    ("fedpin", "fedpin", {}),
    ("fedsdr", "fedsdr", {"algorithm.gamma": 0.01, "algorithm.personal_epochs": 2}),
    ("fedavg, oracle data", "fedavg", {"scenario.oracle": True}),
]

DEMO_SETTINGS = {"lr": 0.05, "batch_size": 10, "local_epochs": 1}


def run_demo(out_dir: Path, db: Path, rounds: int, seed: int, progress=None):
    rows, recorded = [], []
    for label, algorithm, extra in DEMO_METHODS:
        settings = {**DEMO_SETTINGS, **extra, "rounds": rounds, "seed": seed}
        if progress is not None:
            bar, on_round = progress(rounds, label)
            try:
                outcome = run(
                    algorithm=algorithm,
                    scenario="digits-shortcut",
                    db=db,
                    on_round=on_round,
                    **settings,
                )
            finally:
                bar.stop()
        else:
            outcome = run(algorithm=algorithm, scenario="digits-shortcut", db=db, **settings)
        rows.append((label, outcome.metrics))
        recorded.append((label, outcome.run_id))
    plot = plot_accuracy_per_env(
        RunStore(db),
        recorded,
        Path(out_dir) / "accuracy_per_env.png",
        "digits-shortcut: accuracy per test environment",
    )
    return rows, plot
