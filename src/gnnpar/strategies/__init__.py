"""Strategies by CLI name: one explicit dict, no registry magic."""

from __future__ import annotations

from gnnpar.strategies.allreduce import AllReduce
from gnnpar.strategies.gossip import GossipBipartite, GossipGCN
from gnnpar.strategies.hybrid import Hybrid
from gnnpar.strategies.pipeline import Pipeline
from gnnpar.strategies.sampled import Sampled
from gnnpar.strategies.sequential import Sequential

STRATEGIES: dict[str, type] = {
    "sequential": Sequential,
    "allreduce": AllReduce,
    "pipeline": Pipeline,
    "hybrid": Hybrid,
    "sampled": Sampled,
    "gossip": GossipGCN,
    "gossip-bipartite": GossipBipartite,
}
