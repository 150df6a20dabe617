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


def _estimate(cfg, ds) -> dict[str, int]:

    return estimate_bytes(cfg, ds, 1)
