"""PerInvFL's global model ν (the server's IRMv1 model) evaluated beside the personal models θ
that the table reports, from a finished run's final checkpoint (read only: nothing is stored).

    FEDSHIFT_DATA=../shared/datasets python docs/results/perinvfl-rcmnist/nu_vs_theta.py \\
        runs/perinvfl-rcmnist.db 0c30033cc0

Output of 2026-11-29: nu_vs_theta.txt beside this file.
"""

from __future__ import annotations

import sys

import torch

from fedshift.algorithms.base import Prediction
from fedshift.algorithms.common.global_model import split_state
from fedshift.api import rebuild, reimport
from fedshift.engine.checkpoint import load_checkpoint
from fedshift.results.store import RunStore, checkpoint_path


def line(name: str, m: dict) -> str:
    envs = [round(v, 1) for v in m["per_env"].values()]
    return (
        f"{name}: worst {m['worst']:.1f} avg {m['average']:.1f} per_env {envs} "
        f"train fit {m['train_accuracy_pooled']:.1f} degenerate {m['degenerate']}"
    )


def main(db: str, ref: str) -> None:
    torch.set_num_threads(1)
    store = RunStore(db)
    record = store.run(ref)
    reimport(record)
    cfg, exp = rebuild(record, record["config"])
    exp.runner.load_state_dict(load_checkpoint(checkpoint_path(store.path, record["run_id"])))
    runner = exp.runner
    theta = runner.evaluate(cfg.rounds - 1)[1]

    def global_model(server, state, cohort) -> Prediction:  # ν for every client
        params, buffers = split_state(server)
        return Prediction(params, buffers, shared=True)

    runner.alg.predictor = global_model
    nu = runner.evaluate(cfg.rounds - 1)[1]
    print(line("theta (personal, reported)", theta))
    print(line("nu (global IRM model)", nu))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
