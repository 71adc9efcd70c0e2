"""Seconds per round, fedshift against a sequential reference, measured side by side.

    python benchmarks/round_speed.py [--quick] [--json] [--threads 2] [--only w1,w2,w3] [--compile]
                                      [--shared-machine] [--device cuda] [--memory]

W1  FedAvg, MLP 784-100-10, MNIST, 20 clients, Dirichlet α = 0.1 (per-class), batch 10,
    1 local epoch, lr 0.005, full participation; reference: ``classic_fedavg_round``.
W2  the same with the FedAvg CNN: the whole of MNIST by default, ``--quick`` 1,000 images.
W5  FedAvg with ResNet-18 on 32×32×3 inputs (random pixels: CIFAR-sized, a speed workload
    only), 20 clients of 50 images, batch 10.
W2-cli  W2 as ``fedshift run`` goes: a round plus its evaluation of every client (the
    store, checkpoint and progress bar are measured by ``cli_overhead.py``); reference: the
    same round plus PFLlib's per-round evaluation (``pfllib_evaluate``: test accuracy and
    training loss of every client).
W3  general algorithms (``--w3-algorithms``: FedPIN, Ditto, FedSDR, pFedMe, SCAFFOLD) on
    ``cmnist``: 80 clients at rate 0.1, and 8 clients at full participation; reference: the
    same algorithm with ``SequentialTrainer`` (each client's own loss, one module per
    client, autograd, torch.optim.SGD, DataLoader batches); pFedMe's minibatch step as
    PFLlib's client takes it (``pfllib_pfedme_step``: K module forwards and backwards).

Rounds alternate (fedshift round r, then reference round r) after one warm-up round of each,
so both see the same machine load; figures are medians over the timed rounds, and the
ratio is the median of the per-pair ratios. W1 also reports the arithmetic rate of a round
(useful model FLOPs / seconds) as a fraction of a plain ``torch.mm`` (2048², float32)
measured between the rounds. ``--json`` prints one JSON object (keys ``w1.ratio`` …).
``--memory`` runs each workload's two executions alone, each in a process of its own, and
reports their peak resident memory (``--side`` is one such process).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

# --shared-machine: idle OpenMP threads sleep instead of spinning. With several busy
# processes on the cores, spinning threads starve each other (measured: 10–90× slower
# 2-thread steps); on a quiet machine OpenMP's own default (spin briefly, then sleep) is
# faster (W1: 0.385 against 0.42 s per round). Must be set before torch loads its OpenMP
# runtime; an explicit OMP_WAIT_POLICY in the environment wins.
if "--shared-machine" in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# what OpenMP reads when torch loads below (importing fedshift later sets a default that
# then has no effect)
POLICY = os.environ.get("OMP_WAIT_POLICY") or "openmp-default"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference import (  # noqa: E402
    SequentialTrainer,
    classic_fedavg_round,
    pfllib_evaluate,
    pfllib_pfedme_step,
)

import fedshift as fs  # noqa: E402
from fedshift.algorithms import ALGORITHMS  # noqa: E402
from fedshift.experiment import build_experiment  # noqa: E402

LR, BATCH, EPOCHS, SEED = 0.005, 10, 1, 0
DEVICE = torch.device("cpu")  # --device: where fedshift, the reference and torch.mm run
SIDE = "both"  # --side: time both executions alternately, or one alone for its memory


def sync() -> None:
    """Wait for queued accelerator work, so that a timing covers it."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def mm_gflops(n: int = 2048, reps: int = 3) -> tuple[float, float]:
    """Best GFLOP/s of a plain float32 ``torch.mm`` (n × n), on wall and on CPU time."""
    a, b = torch.randn(n, n, device=DEVICE), torch.randn(n, n, device=DEVICE)
    torch.mm(a, b)
    wall = cpu = math.inf
    for _ in range(reps):
        w, c = timed(lambda: torch.mm(a, b))
        wall, cpu = min(wall, w), min(cpu, c)
    return 2 * n**3 / wall / 1e9, 2 * n**3 / cpu / 1e9


def mlp_flops_per_sample(model: torch.nn.Module) -> float:
    """Training FLOPs of one sample: forward, weight gradients, and input gradients of
    every Linear but the first (2 FLOPs per multiply-add)."""
    macs = [
        m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)
    ]
    return 2.0 * (2 * sum(macs) + sum(macs[1:]))


def training_flops_per_sample(model: torch.nn.Module, input_shape: tuple[int, ...]) -> float:
    """FLOPs of one sample's forward and backward pass as autograd runs them (PyTorch's
    ``FlopCounterMode`` over a batch of 10): the arithmetic floor of any execution."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    m = copy.deepcopy(model)
    dev = next(m.parameters()).device
    x = torch.randn(10, *input_shape, device=dev)
    y = torch.zeros(10, dtype=torch.long, device=dev)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(m(x), y).backward()
    return counter.get_total_flops() / 10


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn()``, queued device work included."""
    sync()
    t, c = time.perf_counter(), time.process_time()
    fn()
    sync()
    return time.perf_counter() - t, time.process_time() - c


def memory_mb() -> dict[str, float]:
    """This process's resident memory now and its high-water mark (Linux /proc), in MB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(val.split()[0]) / 1024
    return out


def reset_peak() -> bool:
    """Restart the high-water mark at the current resident size (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def one_side(round_fn, rounds: int) -> dict:
    """--side: one execution alone in this process, for its memory. Both sides are built
    whatever ``--side`` says, so the setup is the same for either: the figures that differ
    are the rounds' own. A warm-up round first (``auto`` times both executions there), then
    the high-water mark restarts and the timed rounds run."""
    setup = memory_mb()
    round_fn(0)
    sync()
    before = memory_mb()
    restarted = reset_peak()
    times = [timed(lambda r=r: round_fn(r))[0] for r in range(1, rounds + 1)]
    after = memory_mb()
    return {
        "side": SIDE,
        "s": statistics.median(times),
        "setup_rss_mb": setup["VmRSS"],  # torch, the data, both sides' models and state
        "warmup_peak_rss_mb": before["VmHWM"],
        "round_peak_rss_mb": after["VmHWM"] if restarted else None,
        "training_mb": (after["VmHWM"] if restarted else before["VmHWM"]) - setup["VmRSS"],
        "device_peak_mb": torch.cuda.max_memory_allocated(DEVICE) / 2**20
        if DEVICE.type == "cuda"
        else None,
    }


def pairs(fs_round, ref_round, rounds: int, between=None) -> dict:
    """Warm up both, then alternate; medians of seconds and of per-pair ratios."""
    if SIDE != "both":
        return one_side(fs_round if SIDE == "fedshift" else ref_round, rounds)
    warm = timed(lambda: fs_round(0))[0]  # includes torch.compile's work when compiling
    ref_round(0)
    a, b, extra = [], [], []
    for r in range(1, rounds + 1):
        if between:
            extra.append(between())
        a.append(timed(lambda r=r: fs_round(r)))
        b.append(timed(lambda r=r: ref_round(r)))
    wa, ca = zip(*a, strict=True)
    wb, cb = zip(*b, strict=True)
    out = {
        "fedshift_s": statistics.median(wa),
        "reference_s": statistics.median(wb),
        "ratio": statistics.median(y / x for x, y in zip(wa, wb, strict=True)),
        "fedshift_cpu_s": statistics.median(ca),
        "reference_cpu_s": statistics.median(cb),
        "cpu_ratio": statistics.median(y / x for x, y in zip(ca, cb, strict=True)),
        "fedshift_warmup_s": warm,
        "fedshift_all_s": [round(v, 4) for v in wa],
        "reference_all_s": [round(v, 4) for v in wb],
    }
    if extra:
        out["between"] = extra
    return out


def dirichlet_mnist(samples: int):
    return fs.scenario(
        "dirichlet",
        dataset="mnist",
        clients=20,
        alpha=0.1,
        proportions="per-class",
        samples=samples,
        seed=SEED,
    )


def chosen(runner) -> dict:
    """What ``execution = auto`` timed and chose (objective -> mode and ms per client-step)."""
    made = runner.ctx.trainer.choices.made
    return {
        k: [c.mode, round(c.batched_s * 1e3, 3), round(c.sequential_s * 1e3, 3)]
        for k, c in made.items()
    }


def random_images(clients: int = 20, per_client: int = 50, shape=(3, 32, 32)):
    """CIFAR-sized stand-in data (random pixels, 10 classes): a speed workload only."""
    from fedshift.data.federated import FederatedData, Split

    g = torch.Generator().manual_seed(SEED)

    def part(n):
        return torch.rand(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)

    return FederatedData(
        name="random-32x32",
        num_classes=10,
        input_shape=shape,
        train=Split.from_clients([part(per_client) for _ in range(clients)]),
        test={"test": Split.from_clients([part(10) for _ in range(clients)])},
        default_model="resnet18",
    )


def fedavg_workload(
    model: str,
    options: dict,
    samples: int,
    rounds: int,
    compile_: bool = False,
    execution: str = "auto",
    evaluate: bool = False,
) -> dict:
    data = random_images() if model == "resnet18" else dirichlet_mnist(samples)
    cfg = fs.make_config(
        algorithm="fedavg",
        model=model,
        model_options=options,
        lr=LR,
        batch_size=BATCH,
        local_epochs=EPOCHS,
        rounds=rounds + 1,
        participation=1.0,
        seed=SEED,
        compile=compile_,
        execution=execution,
        device=str(DEVICE),
    )
    runner = build_experiment(cfg, data=data).runner
    ref_model = build_experiment(cfg, data=data).ctx.model  # same seeded initial weights
    data = data.to(DEVICE)  # the reference's batches on the device too
    ids = list(range(data.num_clients))

    def ref_round(r: int) -> None:
        classic_fedavg_round(
            ref_model, data, ids, lr=LR, batch_size=BATCH, epochs=EPOCHS, seed=SEED, round_=r
        )
        if evaluate:
            pfllib_evaluate(ref_model, data, ids, BATCH)

    def fs_round(r: int) -> None:
        runner.train_round(r)
        if evaluate:
            runner.evaluate(r)

    out = pairs(fs_round, ref_round, rounds, between=mm_gflops)
    out["execution"] = chosen(runner)
    if SIDE != "both":
        return out
    out["clients"] = data.num_clients
    out["samples"] = int(data.train.sizes().sum())
    out["client_steps"] = int(sum(-(-int(n) // BATCH) for n in data.train.sizes()))
    per_sample = (
        mlp_flops_per_sample(runner.ctx.model)
        if model == "mlp"
        else training_flops_per_sample(runner.ctx.model, data.input_shape)
    )
    flops = per_sample * out["samples"] * EPOCHS
    mms = out.pop("between")
    mm = statistics.median(m[0] for m in mms)
    out["gflop_per_round"] = flops / 1e9
    out["gflops"] = flops / out["fedshift_s"] / 1e9
    out["mm_gflops"] = mm
    out["fraction_of_mm"] = out["gflops"] / mm
    # the same on CPU time (robust to other processes when the run has 1 thread)
    out["cpu_gflops"] = flops / out["fedshift_cpu_s"] / 1e9
    out["mm_cpu_gflops"] = statistics.median(m[1] for m in mms)
    out["cpu_fraction_of_mm"] = out["cpu_gflops"] / out["mm_cpu_gflops"]
    # the reference's rate too, and the round time at the measured matmul rate
    out["reference_fraction_of_mm"] = flops / out["reference_s"] / 1e9 / mm
    out["floor_s"] = flops / mm / 1e9
    return out


def reference_runner(cfg, data):
    """The run of ``cfg`` as a per-client library takes it: ``SequentialTrainer`` in place
    of fedshift's trainer, and pFedMe's minibatch step as PFLlib's client takes it."""
    ref = build_experiment(cfg, data=data)
    # the context is frozen for methods; the benchmark swaps the reference's trainer in
    object.__setattr__(ref.ctx, "trainer", SequentialTrainer(ref.ctx.model))
    if cfg.algorithm == "pfedme":  # PFLlib's per-client step, not fedshift's cohort rule
        ref.algorithm.cohort_step = pfllib_pfedme_step(ref.algorithm, copy.deepcopy(ref.ctx.model))
    return ref.runner


def w3_case(
    algorithm: str,
    clients: int,
    rate: float,
    samples: int,
    rounds: int,
    compile_: bool = False,
    execution: str = "auto",
) -> dict:
    data = fs.scenario("cmnist", clients=clients, samples=samples, seed=SEED)
    cfg = fs.make_config(
        algorithm=algorithm,
        lr=LR,
        batch_size=BATCH,
        local_epochs=EPOCHS,
        rounds=rounds + 1,
        participation=rate,
        seed=SEED,
        compile=compile_,
        execution=execution,
        device=str(DEVICE),
    )
    runner = build_experiment(cfg, data=data).runner
    ref = reference_runner(cfg, data)
    out = pairs(runner.train_round, ref.train_round, rounds)
    out["clients"], out["per_round"], out["model"] = clients, runner.k, type(ref.ctx.model).__name__
    out["execution"] = chosen(runner)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small round counts (<= 5 min)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--shared-machine",
        action="store_true",
        help="OMP_WAIT_POLICY=PASSIVE: use when other processes compete for the cores",
    )
    ap.add_argument("--only", default="w1,w2,w2-cli,w3,w5")
    ap.add_argument(
        "--w3-algorithms", default="fedpin,ditto,fedsdr,pfedme,scaffold", help="W3's algorithms"
    )
    ap.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda or cuda:N: fedshift, the reference and torch.mm all run there",
    )
    ap.add_argument(
        "--execution", default="auto", help="fedshift's execution: auto, batched or sequential"
    )
    ap.add_argument("--rounds", type=int, default=0, help="timed rounds (0: 2 quick, 5 full)")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="run fedshift with compile=true (its warm-up round, fedshift_warmup_s, compiles)",
    )
    ap.add_argument(
        "--side",
        default="both",
        choices=("both", "fedshift", "reference"),
        help="one execution alone, with its peak memory (--memory runs each in a process)",
    )
    ap.add_argument(
        "--memory",
        action="store_true",
        help="peak memory of each workload's two executions, each in a process of its own",
    )
    args = ap.parse_args()
    if args.memory:
        memory_table(args)
        return
    global DEVICE, SIDE
    DEVICE = torch.device(args.device)
    SIDE = args.side
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (2 if args.quick else 5)
    only = set(args.only.split(","))
    res: dict = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": POLICY,
        "quick": args.quick,
        "compile": args.compile,
        "execution": args.execution,
        "device": str(DEVICE),
        "rounds": rounds,
    }
    ex = args.execution
    if "w1" in only:
        res["w1"] = fedavg_workload("mlp", {"hidden": [100]}, 0, rounds, args.compile, ex)
    w2_samples = 1000 if args.quick else 0
    if "w2" in only:
        res["w2"] = fedavg_workload("fedavg-cnn", {}, w2_samples, rounds, args.compile, ex)
    if "w2-cli" in only:
        res["w2-cli"] = fedavg_workload(
            "fedavg-cnn", {}, w2_samples, rounds, args.compile, ex, evaluate=True
        )
    if "w5" in only:
        res["w5"] = fedavg_workload("resnet18", {}, 0, rounds, args.compile, ex)
    if "w3" in only:
        algs = [a for a in args.w3_algorithms.split(",") if a in ALGORITHMS]
        samples = 4000 if args.quick else 0
        res["w3"] = {
            f"{a}.{n}x{rate:g}": w3_case(a, n, rate, samples, rounds, args.compile, ex)
            for a in algs
            for n, rate in ((80, 0.1), (8, 1.0))
        }
        if SIDE == "both":
            res["w3"]["ratio"] = min(v["ratio"] for v in res["w3"].values())
    flat = {}
    for key, val in res.items():
        if isinstance(val, dict):
            for k2, v2 in val.items():
                if isinstance(v2, dict):
                    for k3, v3 in v2.items():
                        flat[f"{key}.{k2}.{k3}"] = v3
                else:
                    flat[f"{key}.{k2}"] = v2
        else:
            flat[key] = val
    if args.json:
        print(json.dumps(flat))
        return
    for k, v in flat.items():
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")


def memory_table(args) -> None:
    """Each workload of ``--only`` once per side, in a fresh process (a process's peak
    resident size is its own: measured side by side, the second would inherit the first's
    high-water mark and allocator caches). Prints one JSON object, workload -> side -> MB."""
    import subprocess

    passed = [f"--threads={args.threads}", f"--device={args.device}", "--json"]
    passed += [f"--execution={args.execution}", f"--rounds={args.rounds or 1}"]
    passed += ["--quick"] if args.quick else []
    out: dict = {"omp_wait_policy": POLICY, "threads": args.threads, "quick": args.quick}
    # W3: a process per algorithm too (its two cases share it, in the order 80 then 8 clients)
    jobs = [
        (work, [f"--w3-algorithms={a}"] if work == "w3" else [])
        for work in args.only.split(",")
        for a in (args.w3_algorithms.split(",") if work == "w3" else [None])
    ]
    for work, more in jobs:
        for side in ("fedshift", "reference"):
            cmd = [sys.executable, __file__, f"--only={work}", f"--side={side}", *passed, *more]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode:
                out[f"{work}.{side}"] = {"error": done.stderr.strip().splitlines()[-1:]}
                continue
            flat = json.loads(done.stdout.strip().splitlines()[-1])
            keep = ("s", "setup_rss_mb", "warmup_peak_rss_mb", "round_peak_rss_mb", "training_mb")
            for key, val in flat.items():
                if key.rsplit(".", 1)[-1] in keep:
                    out[f"{key.rsplit('.', 1)[0]}.{side}.{key.rsplit('.', 1)[-1]}"] = val
            print(f"{work} {' '.join(more)} {side} done", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
