"""Parallelism degrees of a run, built and checked once, before any process is launched.

After torchtitan's ``ParallelDims``: ``replicas`` copies of the model (data parallelism) times
``stages`` pipeline stages must equal the world size. The world size is torchrun's
``WORLD_SIZE`` when launched by it, else ``--workers``. Each strategy's degrees:

=================================  ==========  ==========
strategy                           replicas    stages
=================================  ==========  ==========
sequential                         1           1
allreduce, gossip*, sampled        world       1
pipeline                           1           --stages
hybrid                             --replicas  --stages
=================================  ==========  ==========

Process groups come from one :class:`~torch.distributed.device_mesh.DeviceMesh` of shape
``(replicas, stages)`` with dimensions ``("dp", "pp")``: rank ``= replica * stages + stage``;
the ``pp`` group of a rank is its pipeline, the ``dp`` group the same stage in every copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from gnnpar import UsageError
from gnnpar.config import Config
from gnnpar.runtime.dist import env_world_size

DATA_PARALLEL = ("allreduce", "gossip", "gossip-bipartite", "sampled")


@dataclass(frozen=True)
class ParallelDims:
    replicas: int
    stages: int
    world: int

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.stages < 1:
            raise UsageError("--replicas and --stages must each be at least 1.")
        if self.replicas * self.stages != self.world:
            what = (
                f"{self.replicas} replicas x {self.stages} stages"
                if self.replicas > 1
                else f"{self.stages} stages"
            )
            raise UsageError(
                f"{what} needs {self.replicas * self.stages} ranks, but the run has "
                f"{self.world}; pass --workers {self.replicas * self.stages}."
            )

    @property
    def pipelined(self) -> bool:
        return self.stages > 1

    @classmethod
    def for_run(cls, cfg: Config) -> ParallelDims:
        """The degrees ``cfg`` asks for, checked against the world size it will run with."""
        s = cfg.strategy
        launched = env_world_size()
        world = launched if launched is not None else s.workers
        if s.name == "sequential":
            if world > 1:
                how = "torchrun started" if launched is not None else "--workers asks for"
                raise UsageError(
                    f"--strategy sequential trains in one process, but {how} {world}: that "
                    "would train identical copies. Use --workers 1, or a parallel strategy "
                    "(allreduce, gossip, sampled: data parallel; pipeline: stages)."
                )
            return cls(1, 1, 1)
        if s.name in DATA_PARALLEL:
            return cls(world, 1, world)
        replicas = s.replicas if s.name == "hybrid" else 1
        try:
            return cls(replicas, s.stages, world)
        except UsageError as e:
            raise UsageError(f"--strategy {s.name} with {e}") from None

    def build_mesh(self, device_type: str):
        """The (replicas, stages) DeviceMesh over the initialised world group."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(
            device_type, (self.replicas, self.stages), mesh_dim_names=("dp", "pp")
        )
