"""gnnpar: train graph neural networks in parallel and measure which strategy pays off.

Quick start (one process, bundled Cora)::

    gnnpar train --dataset cora --model gat --strategy sequential --out runs/gat
    gnnpar bench                      # the quick tour: every strategy on bundled Cora
    gnnpar datasets                   # what is available offline

See README.md for multi-process (``--workers N``) and multi-machine (``torchrun``) use.
"""

__version__ = "0.1.0"


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message and exits with status 2."""


class RankFailedError(RuntimeError):
    """A rank of a multi-process run failed: the CLI prints "rank R failed: <cause>", exit 1."""
