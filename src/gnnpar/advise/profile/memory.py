"""Memory: the resident memory of this process and a run's estimate (:mod:`gnnpar.models.memory`)."""

from __future__ import annotations

import os

from gnnpar.models.memory import estimate_bytes


def current_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def rank_estimate(cfg, ds) -> dict[str, int]:
    """One rank's model state and activations (:func:`estimate_bytes`), with what the run's
    strategy declares of its step (``StrategySpec.step_rows``)."""
    from gnnpar.strategies import registry

    return estimate_bytes(cfg, ds, 1, step_rows=registry.get(cfg.strategy.name).step_rows)
