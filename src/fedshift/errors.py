"""The exception type for user mistakes: the CLI prints it as one line, no traceback."""


class FedshiftError(ValueError):
    """Bad input from the user (unknown name, bad value, missing file): one clear sentence."""
