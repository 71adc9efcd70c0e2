"""fedshift: federated learning under distribution shift, with clients as a tensor dimension."""

__version__ = "0.1.0"

from .api import RunOutcome, make_config, run, scenario  # noqa: E402
from .results.frames import load_client_metrics, load_rounds, load_runs  # noqa: E402

__all__ = [
    "RunOutcome",
    "__version__",
    "load_client_metrics",
    "load_rounds",
    "load_runs",
    "make_config",
    "run",
    "scenario",
]
