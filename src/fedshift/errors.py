"""The one exception type for user mistakes: the CLI prints its message as one line, no traceback."""


class FedshiftError(ValueError):
    """Bad input from the user (unknown name, bad value, missing file): one clear sentence."""
