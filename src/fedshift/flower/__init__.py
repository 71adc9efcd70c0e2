"""fedshift on Flower (https://flower.ai): any registered algorithm as a Flower ServerApp +
ClientApp, in Flower's simulation engine or deployed on SuperLink + SuperNodes, with the
same numbers as the in-process engine. Needs the extra: ``pip install 'fedshift[flower]'``.

``fedshift.flower.apps`` holds ``server_app`` / ``client_app``; ``fedshift.flower.run`` the
``simulate`` and ``deploy`` entry points; ``fedshift flower run`` the command line.
"""

from __future__ import annotations

from ..errors import FedshiftError

INSTALL_HINT = "Flower is not installed; install it with: pip install 'fedshift[flower]'"


def require_flower() -> None:
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise FedshiftError(INSTALL_HINT) from None
