"""Datasets (names, registry, readers, synthetic generators), partitions, sampling, micro-batches.

Nothing is imported here, so that the torch-free parts (:mod:`gnnpar.data.registry`, read by the
config checks) stay so: import the module you need, e.g. ``gnnpar.data.datasets``.
"""
