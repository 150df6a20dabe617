"""Strategies by CLI name: one explicit dict, no registry magic.

A strategy is a class with two static (or class) methods:

* ``check(cfg, dims)``: checks that need no data, run once before any process is launched
  (:func:`gnnpar.run.prepare`); raise :class:`gnnpar.UsageError`.
* ``build(cfg, dataset, ctx, dims) -> Plan``: on every rank, the parts that plug into the one
  training loop (:mod:`gnnpar.training.loop`): model, optimizer, source, step, sync policy, finish.
"""

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
