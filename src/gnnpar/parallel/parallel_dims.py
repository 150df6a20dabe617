"""Parallelism degrees of a run: computed and checked once, before any process is launched.

After torchtitan's ``ParallelDims``: ``replicas`` copies of the model (data parallelism) times
``stages`` pipeline stages equal the world size. Each strategy's spec says how the world size
splits (``StrategySpec.degrees``, :mod:`gnnpar.strategies.spec`), and
:meth:`~gnnpar.strategies.spec.StrategySpec.parallel_dims` checks it against the world size
(torchrun's ``WORLD_SIZE`` when launched by it, else ``--workers``):

=================================  ==========  ==========
strategy                           replicas    stages
=================================  ==========  ==========
sequential                         1           1
allreduce, gossip*, sampled        world       1
pipeline                           1           --stages
hybrid                             --replicas  --stages
=================================  ==========  ==========

:func:`gnnpar.run.prepare` builds it once and hands it to every rank. Process groups come from
one :class:`~torch.distributed.device_mesh.DeviceMesh` of shape ``(replicas, stages)`` with
dimensions ``("dp", "pp")``: rank ``= replica * stages + stage``; the ``pp`` group of a rank is
its pipeline, the ``dp`` group the same stage in every copy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelDims:
    replicas: int
    stages: int
    world: int

    @property
    def pipelined(self) -> bool:
        return self.stages > 1

    def build_mesh(self, device_type: str):
        """The (replicas, stages) DeviceMesh over the initialised world group."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(
            device_type, (self.replicas, self.stages), mesh_dim_names=("dp", "pp")
        )
