"""Built-in scenarios, one module per family; importing this package registers them all."""

from ...registry_import import import_submodules

import_submodules(__name__, __path__)
