"""A crowded machine: when other processes already keep every core busy, a run on several
intra-op threads shares the cores with them and can be several times slower (W1: 3.6
against 0.49 s a round beside three one-thread jobs on two cores; docs/performance.md).
fedshift does not lower the thread count by itself, since the thread count can change a
run's float rounding on some machines' BLAS (not on the development machine's:
benchmarks/thread_equality.py); it says so once, where someone watches."""

from __future__ import annotations

import os

import torch


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def crowded_hint(threads: int, device: str) -> str | None:
    """One sentence when a run with ``threads`` (config; 0 = PyTorch's default, the cores)
    on ``device`` (config: auto, cpu, …) would start on a machine whose other processes
    already fill every core (the one-minute load average at least the usable cores);
    else ``None``."""
    from .experiment import resolve_device

    if threads or resolve_device(device).type != "cpu" or not hasattr(os, "getloadavg"):
        return None
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average here: nothing to say
        return None
    intra_op, cores = torch.get_num_threads(), usable_cores()
    if intra_op <= 1 or load < cores:
        return None
    return (
        f"this machine is busy (load {load:.1f} on {cores} cores): runs on {intra_op} threads "
        "share the cores with the other processes and can be several times slower; "
        "--set threads=1 avoids that"
    )
