"""Strategies by CLI name: one explicit dict, no registry magic."""

from __future__ import annotations

from gnnpar.strategies.gossip import GossipBipartite, GossipGCN
from gnnpar.strategies.sequential import Sequential

STRATEGIES: dict[str, type] = {
    "sequential": Sequential,
    "gossip": GossipGCN,
    "gossip-bipartite": GossipBipartite,
}
