"""Gossip averaging for GossipGCN (study 003 chapter 4), in three small parts.

Split as facebookresearch/stochastic_gradient_push splits its gossip: who may talk to whom
(:mod:`~gnnpar.gossip.topology`), how two ranks agree to talk without deadlock
(:mod:`~gnnpar.gossip.protocol`), and what they do when they talk (:mod:`~gnnpar.gossip.mixing`),
plus the shared work pool that hands out subgraphs (:mod:`~gnnpar.gossip.pool`) and the sync
policy that runs them at the training loop's step boundaries (:mod:`~gnnpar.gossip.sync`). Coordination
state lives only in torch.distributed's key-value store, so the same code runs across machines.
The strategy that composes them is :mod:`gnnpar.strategies.gossip`.
"""

from gnnpar.gossip.mixing import GossipTimeoutError, exchange_average
from gnnpar.gossip.pool import WorkPool
from gnnpar.gossip.protocol import Exchange, Pairing
from gnnpar.gossip.sync import GossipSync
from gnnpar.gossip.topology import AnyPeer, Bipartite, Topology

__all__ = [
    "AnyPeer",
    "Bipartite",
    "GossipSync",
    "GossipTimeoutError",
    "Exchange",
    "Pairing",
    "Topology",
    "WorkPool",
    "exchange_average",
]
