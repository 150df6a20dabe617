"""The two errors every layer may raise, and how the command line ends on each."""


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message and exits with status 2."""


class RankFailedError(RuntimeError):
    """A rank of a multi-process run failed: the CLI prints "rank R failed: <cause>", exit 1."""
