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

# Idle OpenMP threads sleep at once (OMP_WAIT_POLICY=PASSIVE). libgomp's default spin (300,000
# spins) turned a 2-thread step into a 40x slower one when the cores are shared with other
# processes (ranks, loader workers, other jobs): measured 0.6 s -> 26 s for 2 epochs of sampled
# SAGE on Cora. A short spin (GOMP_SPINCOUNT=10000) was tried as the default (issue 21): it made
# full-batch GAT on CiteSeer 16 ms per step at 2 threads instead of 29-30 ms (PASSIVE wakes the
# other thread by a system call at each of ~1,000 small parallel regions), but with two
# processes on the two cores `gnnpar advise`'s co-run probe measured a step 8-11x slower than
# alone instead of ~2x (4 runs, alternating, quiet machine: BENCHMARKS.md, issue 21), so PASSIVE
# stays the default. A user running one process per core can set GOMP_SPINCOUNT=10000 (without
# OMP_WAIT_POLICY); a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. libgomp reads these
# when torch is first imported, so they are set here, before any gnnpar module imports torch.
if "GOMP_SPINCOUNT" not in os.environ:
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
