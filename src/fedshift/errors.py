"""The exception type for user mistakes: the CLI prints it as one line, no traceback."""


class FedshiftError(ValueError):
    """Bad input from the user (unknown name, bad value, missing file): one clear sentence."""


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'x'?)' when ``word`` is a likely typo of one of ``choices``, else ''."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
