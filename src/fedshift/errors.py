"""The exceptions a user meets: a mistake (``FedshiftError``, printed as one line, no
traceback), a run that diverged, and a run stopped on request."""


class FedshiftError(ValueError):
    """Bad input from the user (unknown name, bad value, missing file): one clear sentence."""


class FedshiftWarning(UserWarning):
    """A setting that runs but is likely not what the user wants (FedBN without BatchNorm,
    a pFedMe step that overshoots): the CLI prints it as one ``warning:`` line."""


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'x'?)' when ``word`` is a likely typo of one of ``choices``, else ''."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Diverged(FedshiftError):
    """Training diverged (non-finite global or personal state, or too many rounds that
    trained nothing): the run stops, is marked ``diverged`` without metrics; the rounds
    it did are recorded and its last checkpoint (from before) stays usable."""

    def __init__(self, round_: int, why: str) -> None:
        super().__init__(f"the run diverged in round {round_}: {why}")
        self.round = round_
        self.why = why
        self.hint = ""  # how to continue, added by the caller that knows the run id
        self.run_id: str | None = None  # likewise: the stored run that diverged


class RunStopped(Exception):
    """Training stopped on request after ``rounds_done`` rounds; a checkpoint was written."""

    def __init__(self, rounds_done: int) -> None:
        super().__init__(f"stopped after round {rounds_done}")
        self.rounds_done = rounds_done
