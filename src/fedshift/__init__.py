"""fedshift: federated learning under distribution shift, with clients as a tensor dimension."""

__version__ = "0.1.0"

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
