"""fedshift: federated learning under distribution shift, with clients as a tensor dimension."""

import os as _os

from ._version import __version__

# Idle OpenMP threads sleep instead of spinning: beside other busy processes, spinning
# threads starve each other (a batched step took 10 ms on one thread and 90–145 ms on two
# spinning ones; docs/performance.md). It takes effect only before torch loads its OpenMP
# runtime (so on the command line, and for `import fedshift` before `import torch`); an
# OMP_WAIT_POLICY already set wins (set it empty for OpenMP's own default).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .algorithms.base import Algorithm, register_algorithm  # noqa: E402
from .api import RunOutcome, make_config, run, scenario  # noqa: E402
from .data import FederatedData, Split, register_scenario  # noqa: E402
from .models import register_model  # noqa: E402
from .options import opt, require  # noqa: E402
from .results.frames import load_client_metrics, load_rounds, load_runs  # noqa: E402

__all__ = [
    "Algorithm",
    "FederatedData",
    "RunOutcome",
    "Split",
    "__version__",
    "load_client_metrics",
    "load_rounds",
    "load_runs",
    "make_config",
    "opt",
    "register_algorithm",
    "register_model",
    "register_scenario",
    "require",
    "run",
    "scenario",
]
