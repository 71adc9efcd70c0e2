"""IRM† under the engine's plain SGD: does dividing the objective by λ after annealing stop
the model? Per-round parameter change, training risk and test accuracy (p = 0.1) for
rescale = always (the reference's division, the old behaviour) and never (= auto under SGD).

    OMP_NUM_THREADS=1 FEDSHIFT_DATA=... python docs/results/irm-arjovsky-cmnist/sgd_rescale.py
"""

import json
import sys
import time

import torch

from fedshift.api import make_config
from fedshift.data.registry import build_scenario
from fedshift.experiment import build_experiment

torch.set_num_threads(1)
ROUNDS, ANNEAL = int(sys.argv[1]) if len(sys.argv) > 1 else 60, 30
SCENARIO = {
    "construction": "arjovsky",
    "clients": 2,
    "p_train": [0.8, 0.9],
    "p_test": [0.1],
    "samples": 10000,
    "test_samples": 2000,
}
VARIANTS = {
    "always (old)": {"rescale": "always"},
    "never (= auto under SGD)": {"rescale": "never"},
    "never, λ = 1000": {"rescale": "never", "lambda_": 1000.0},
}


def trace(name, options, data):
    cfg = make_config(
        None,
        algorithm="irm",
        rounds=ROUNDS,
        lr=0.01,
        batch_size=64,
        local_epochs=1,
        eval_every=10,
        model_options={"hidden": [390, 390]},
        algorithm_options={"anneal_rounds": ANNEAL, **options},
    )
    cfg.scenario = "cmnist"
    rows = []
    prev = {}

    def on_round(rec):
        server = exp.runner.server
        moved = sum(((server[k] - prev[k]) ** 2).sum() for k in prev if k.startswith("p/"))
        prev.update({k: v.clone() for k, v in server.items()})
        acc = rec.metrics["average"] if rec.metrics else None
        rows.append(
            {"round": len(rows), "change": float(moved) ** 0.5, "loss": rec.loss, "test_p0.1": acc}
        )

    exp = build_experiment(cfg, data=data, on_round=on_round)
    prev.update({k: v.clone() for k, v in exp.runner.server.items()})
    t = time.time()
    exp.runner.run()
    return {"variant": name, "options": options, "time_s": time.time() - t, "rounds": rows}


data = build_scenario("cmnist", SCENARIO, seed=0)
out = [trace(n, o, data) for n, o in VARIANTS.items()]
json.dump({"scenario": SCENARIO, "anneal_rounds": ANNEAL, "runs": out}, sys.stdout, indent=1)
for r in out:
    pre = [x["change"] for x in r["rounds"][ANNEAL - 10 : ANNEAL]]
    post = [x["change"] for x in r["rounds"][ANNEAL : ANNEAL + 10]]
    accs = [(x["round"], x["test_p0.1"]) for x in r["rounds"] if x["test_p0.1"] is not None]
    print(
        f"\n{r['variant']}: mean change/round {sum(pre) / 10:.4g} before, {sum(post) / 10:.4g} "
        f"after annealing; loss last {r['rounds'][-1]['loss']:.4f}; test p=0.1 {accs}",
        file=sys.stderr,
    )
