"""Built-in scenarios; importing this package registers them."""

from . import basic, digits_shortcut  # noqa: F401
