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

from gnnpar import omp  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)
from gnnpar._version import __version__
from gnnpar.errors import RankFailedError, UsageError

__all__ = ["FitResult", "RankFailedError", "UsageError", "__version__", "fit", "load"]


def __getattr__(name: str):
    """``gnnpar.fit``, ``gnnpar.load``, ``gnnpar.FitResult``: imported on first use (torch)."""
    if name in ("fit", "load", "FitResult"):
        from gnnpar import api

        return getattr(api, name)
    raise AttributeError(f"module 'gnnpar' has no attribute {name!r}")
