"""How ranks split and share the work: parallel degrees, collectives, gossip and pipelines.

The run's parallelism degrees (:mod:`~gnnpar.parallel.parallel_dims`), the timed collectives the
strategies share (:mod:`~gnnpar.parallel.collectives`), gossip averaging with its work pool and
pairing protocol (:mod:`gnnpar.parallel.gossip`) and GPipe pipelines of a block model
(:mod:`gnnpar.parallel.pipeline`). Starting processes and joining the process group are
:mod:`gnnpar.runtime`'s; the loop and the sync policies that call into this package are
:mod:`gnnpar.training`'s; the strategies that compose them are :mod:`gnnpar.strategies`.
"""
