"""The process runtime of a run: everything about ranks as processes, nothing about training.

Starting local ranks (:mod:`~gnnpar.runtime.launch`, with the fork server's imports in
:mod:`~gnnpar.runtime.preload`, a leaf), taking a task's rank from SLURM
(:mod:`~gnnpar.runtime.slurm`), joining the process group (:mod:`~gnnpar.runtime.dist`),
bounded waits on its key-value store (:mod:`~gnnpar.runtime.store`), heartbeats that name a rank
that stopped answering (:mod:`~gnnpar.runtime.heartbeat`), the memory check before anything is
allocated (:mod:`~gnnpar.runtime.footprint`) and giving freed memory back to the system
(:mod:`~gnnpar.runtime.allocator`). The training loop and its parts live in :mod:`gnnpar.training`,
collectives and the parallel layouts in :mod:`gnnpar.parallel`; one run, top to bottom, is
:mod:`gnnpar.run`.
"""
