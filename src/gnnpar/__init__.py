"""gnnpar: train graph neural networks in parallel and measure which strategy pays off.

Quick start (one process, bundled Cora)::

    gnnpar train --dataset cora --model gat --strategy sequential --out runs/gat
    gnnpar bench                      # the quick tour: every strategy on bundled Cora
    gnnpar datasets                   # what is available offline
    gnnpar predict RUN_DIR            # per-node predictions of a run's saved model

    import gnnpar
    run = gnnpar.fit(data, model="gcn", strategy="allreduce", workers=2, partitions=8)
    run.model(data.x, data.edge_index)  # logits; gnnpar.load(run.out) gives it back later

See README.md for multi-process (``--workers N``) and multi-machine (``torchrun``) use.
"""

import os

# OpenMP threads that spin while waiting (libgomp's default) turn a 2-thread step into a 40x
# slower one when the cores are shared with other processes (ranks, loader workers, other jobs):
# measured 0.6 s -> 26 s for 2 epochs of sampled SAGE on Cora. libgomp reads this when torch is
# first imported, so it is set here, before any gnnpar module imports torch; a user's own
# setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"


def __getattr__(name: str):
    """``gnnpar.fit``, ``gnnpar.load``, ``gnnpar.FitResult``: imported on first use (torch)."""
    if name in ("fit", "load", "FitResult"):
        from gnnpar import api

        return getattr(api, name)
    raise AttributeError(f"module 'gnnpar' has no attribute {name!r}")


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message and exits with status 2."""


class RankFailedError(RuntimeError):
    """A rank of a multi-process run failed: the CLI prints "rank R failed: <cause>", exit 1."""
