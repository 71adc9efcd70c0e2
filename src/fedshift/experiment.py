"""From a resolved :class:`RunConfig` to a ready :class:`Runner`: build the scenario, the
seeded model, the training context and the algorithm, validating every option on the way."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from ._version import __version__
from .algorithms import ALGORITHMS, Algorithm
from .config import RunConfig
from .data import SCENARIOS, FederatedData, build_scenario
from .engine.context import Context
from .engine.faults import FaultOptions
from .engine.local import LocalTrainer
from .engine.runner import RoundRecord, Runner
from .engine.sgd import SGDConfig
from .errors import FedshiftError
from .models import build_model
from .models.registry import physical_memory
from .options import build_options
from .plugins import import_modules


@dataclass
class Experiment:
    config: RunConfig
    data: FederatedData
    ctx: Context
    algorithm: Algorithm
    runner: Runner


def resolve_device(name: str) -> torch.device:
    """The device a run trains on. ``auto`` (the default) takes the best one here: cuda,
    else mps, else cpu; it is resolved on every start and resume, so a run started on a
    GPU machine resumes on a laptop (the store's ``environment.device`` says where it ran)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise FedshiftError(
            f"device {name!r} was asked for but CUDA is not available here; use device auto or "
            "cpu (--device, or --set device=… with --resume)"
        )
    if name == "mps" and not torch.backends.mps.is_available():
        raise FedshiftError(
            "device 'mps' was asked for but MPS is not available here; use device auto or cpu "
            "(--device, or --set device=… with --resume)"
        )
    return torch.device(name)


def eval_interval(cfg: RunConfig) -> int:
    return cfg.eval_every if cfg.eval_every > 0 else max(1, cfg.rounds // 10)


def check_options(cfg: RunConfig) -> None:
    """The algorithm's and scenario's options of ``cfg``, checked before anything runs: a
    typo in a sweep's last grid point, or in what Flower's nodes will read, surfaces at
    once, not after hours."""
    build_options(ALGORITHMS.get(cfg.algorithm).Hyper, cfg.algorithm_options, "algorithm")
    build_options(SCENARIOS.get(cfg.scenario).options, cfg.scenario_options, "scenario")


def build_experiment(
    cfg: RunConfig, data: FederatedData | None = None, on_round=None
) -> Experiment:
    cfg.validate()
    import_modules(cfg.imports)  # a no-op when resolve() did it; not so in a Flower worker
    alg_cls = ALGORITHMS.get(cfg.algorithm)
    hyper = build_options(alg_cls.Hyper, cfg.algorithm_options, "algorithm")
    faults = build_options(FaultOptions, cfg.faults_options, "faults")
    device = resolve_device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if data is None:
        data = build_scenario(cfg.scenario, cfg.scenario_options, cfg.seed, cfg.data_dir or None)
    data = data.to(device)
    model_name = data.default_model if cfg.model == "auto" else cfg.model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = build_model(model_name, data.input_shape, data.num_classes, cfg.model_options)
    model = alg_cls.wrap_model(model.to(device), hyper, data, cfg.seed)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    ctx = Context(
        model=model,
        data=data,
        device=device,
        seed=cfg.seed,
        sgd=SGDConfig(cfg.lr, cfg.momentum, cfg.weight_decay),
        batch_size=cfg.batch_size,
        local_epochs=None if cfg.local_steps else cfg.local_epochs,
        local_steps=cfg.local_steps or None,
        trainer=LocalTrainer(model, compile=cfg.compile, execution=cfg.execution),
        initial_params=params,
        initial_buffers=buffers,
        cohort_size=cfg.cohort_size or 0,
    )
    algorithm = alg_cls(hyper, ctx)
    participation = cfg.participation or data.participation
    runner = Runner(
        algorithm,
        ctx,
        rounds=cfg.rounds,
        participation=participation,
        clients_per_round=cfg.clients_per_round or None,
        eval_every=eval_interval(cfg),
        on_round=on_round,
        faults=faults,
    )
    check_cohort_memory(params, min(runner.k, runner.cohort_size), device)
    return Experiment(cfg, data, ctx, algorithm, runner)


COPIES_PER_CLIENT = 4  # parameters, gradients, optimiser state, upload: a lower bound


def check_cohort_memory(params: dict, width: int, device: torch.device) -> None:
    """Refuse, before anything is recorded, a cohort whose clients' model copies alone
    would not fit in this machine's memory (CPU runs; a GPU reports its own)."""
    ram = physical_memory()
    if device.type != "cpu" or ram is None or width < 1:
        return
    per_client = sum(p.numel() for p in params.values()) * 4 * COPIES_PER_CLIENT
    if per_client * width > ram:
        fits = max(1, int(ram // per_client))
        raise FedshiftError(
            f"a cohort of {width} clients training this model needs at least "
            f"{per_client * width / 2**30:.1f} GiB (parameters, gradients and optimiser "
            f"state per client), more than this machine's {ram / 2**30:.0f} GiB; set "
            f"cohort_size to at most {fits} (or choose a smaller model)"
        )


def cpu_info(field: str = "model name") -> str:
    """One field of the CPU's description (Linux's /proc/cpuinfo: ``model name``,
    ``vendor_id``, …), else what ``platform`` knows of the processor."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_info(device: torch.device | str) -> dict:
    """What a run's numbers depend on besides its config and seed. ``cpu`` and
    ``cpu_capability`` (the vector instructions torch's CPU kernels use, e.g. AVX2 or
    AVX512) are kept because float rounding differs between them: a 600-round FedPIN run
    repeated on an Intel AVX-512 host after an earlier host ended 1.4 points of worst-case
    accuracy apart at the same config, seed and thread count (docs/runs.md)."""
    import numpy
    import sklearn

    info = {
        "fedshift": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "sklearn": sklearn.__version__,
        "platform": platform.platform(),
        "cpu": cpu_info(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


__all__ = ["Experiment", "RoundRecord", "build_experiment", "environment_info"]
