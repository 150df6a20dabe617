"""Datasets and what is made of them: the dataset types (:mod:`~gnnpar.data.types`), the
torch-free table of named datasets (:mod:`~gnnpar.data.registry`, read by the config checks),
named datasets (:mod:`~gnnpar.data.datasets`: readers, synthetic generators), the user's own
graphs (:mod:`~gnnpar.data.user`), the on-disk cache (:mod:`~gnnpar.data.cache`, its lock in
:mod:`~gnnpar.data.filelock`), partitions, neighbour sampling (:mod:`~gnnpar.data.sampling`) and
micro-batches.

Importing the package imports none of them (so the torch-free parts stay so): each is imported
by name where it is used.
"""
