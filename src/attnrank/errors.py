"""The one exception type a user's input can cause."""


class AttnRankError(Exception):
    """A problem with the user's input (path, file, architecture, option).

    The CLI prints its message as one line and exits with status 2.
    """
