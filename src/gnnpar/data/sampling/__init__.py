"""Neighbour sampling (GraphSAGE mini-batches, study 002), in three parts:

- :mod:`~gnnpar.data.sampling.sampler`: the sampler over a CSR graph (:class:`CSRGraph`,
  :class:`NeighborSampler`, the batch layout);
- :mod:`~gnnpar.data.sampling.kernel`: its compiled hop kernel (``sampler_kernel.c`` next to it,
  loaded with ctypes; vectorised torch when it is not built);
- :mod:`~gnnpar.data.sampling.loader`: distributed sharding of the seed nodes, the shared graph
  file, and the DataLoader whose worker processes make the batches.

:mod:`~gnnpar.data.sampling.reference` is a plain per-node sampler for tests and benchmarks.
Importing the package imports none of them.
"""
