"""Strategies by CLI name: one explicit dict, no registry magic."""

from __future__ import annotations

from gnnpar.strategies.sequential import Sequential

STRATEGIES: dict[str, type] = {
    "sequential": Sequential,
}
