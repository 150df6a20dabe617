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

# How long an idle OpenMP thread spins before it sleeps. libgomp's default (300,000 spins, far
# longer when OMP_WAIT_POLICY=ACTIVE) turned a 2-thread step into a 40x slower one when the cores
# are shared with other processes (ranks, loader workers, other jobs): measured 0.6 s -> 26 s
# for 2 epochs of sampled SAGE on Cora. Sleeping at once (OMP_WAIT_POLICY=PASSIVE, the setting
# here until issue 21) wakes the other thread by a system call at every parallel region: a
# full-batch GAT step on CiteSeer, ~1,000 small regions, took 29-30 ms at 2 threads against 23 ms
# at 1. A short spin (10,000: tens of microseconds) catches the next region of the same step and
# still sleeps between steps: 16 ms at 2 threads (BENCHMARKS.md, issue 21). libgomp reads these
# when torch is first imported, so they are set here, before any gnnpar module imports torch;
# a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

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
