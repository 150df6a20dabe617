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

The package is built in layers; every import, lazy ones included, points down (ARCHITECTURE.md;
the list is ``[tool.importlinter]`` in pyproject.toml, checked by tests/test_layers.py)::

    __main__
    cli | api | lightning            the command line | gnnpar.fit, gnnpar.load | for Lightning
    advise | bench
    run | predict | configure        start the ranks | predictions | flags -> a checked Config
    result                           result.json and model.pt
    strategies                       one StrategySpec each, the registry
    training                         the one loop and its plug-ins
    parallel | runtime               collectives, gossip, pipeline stages | ranks as processes
    models
    data
    config                           the settings' schema and parser
    csr | targets | omp | _version
    errors                           UsageError, RankFailedError

This module is the face above them all: it sets the OpenMP wait policy before torch loads
(:mod:`gnnpar.omp`), re-exports the errors and the version, and hands ``fit``, ``load`` and
``FitResult`` up from :mod:`gnnpar.api` on first use. Nothing inside the package imports it.
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
