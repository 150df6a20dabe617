"""Datasets and what is made of them: the dataset types (:mod:`~gnnpar.data.types`), named
datasets (:mod:`~gnnpar.data.datasets`: registry, readers, synthetic generators), the user's own
graphs (:mod:`~gnnpar.data.user`), the on-disk cache (:mod:`~gnnpar.data.cache`, its lock in
:mod:`~gnnpar.data.filelock`), partitions, neighbour sampling (:mod:`~gnnpar.data.sampling`) and
micro-batches.

Importing the package imports none of them: each is imported by name where it is used.
"""
