"""Gossip averaging for GossipGCN (study 003 chapter 4), in three small parts.

Split as facebookresearch/stochastic_gradient_push splits its gossip: who may talk to whom
(:mod:`~gnnpar.parallel.gossip.topology`), how two ranks agree to talk without deadlock
(:mod:`~gnnpar.parallel.gossip.protocol`), and what they do when they talk (:mod:`~gnnpar.parallel.gossip.mixing`),
plus the shared work pool that hands out subgraphs (:mod:`~gnnpar.parallel.gossip.pool`). Coordination
state lives only in torch.distributed's key-value store, so the same code runs across machines.
The sync policy that runs them at the training loop's step boundaries is a plug-in of the loop,
:mod:`gnnpar.training.gossip_sync`; the strategy that composes them is
:mod:`gnnpar.strategies.gossip`.
"""

from gnnpar.parallel.gossip.mixing import GossipTimeoutError, exchange_average
from gnnpar.parallel.gossip.pool import ShardedPool, WorkPool
from gnnpar.parallel.gossip.protocol import Exchange, Pairing
from gnnpar.parallel.gossip.topology import AnyPeer, Bipartite, Topology

__all__ = [
    "AnyPeer",
    "Bipartite",
    "GossipTimeoutError",
    "Exchange",
    "Pairing",
    "ShardedPool",
    "Topology",
    "WorkPool",
    "exchange_average",
]
