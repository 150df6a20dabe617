"""What a strategy is, as one torch-free object: :class:`StrategySpec`.

A spec says everything the rest of gnnpar needs to know about a strategy before any process
starts, and how a rank builds it:

* ``reads``: the settings whose use depends on the strategy that it reads (and for which kinds
  of dataset). :func:`gnnpar.configure.used_by` derives from the specs which runs read
  each such setting, for the "is used by ... only" errors and ``gnnpar train --help``.
* ``degrees``: how the world size splits into data-parallel copies x pipeline stages
  (:class:`~gnnpar.parallel.parallel_dims.ParallelDims`, built once by
  :func:`gnnpar.run.prepare` through :meth:`StrategySpec.parallel_dims`).
* ``defaults``: fills the strategy's settings the user left unset
  (:func:`gnnpar.configure.resolve`), e.g. what is averaged.
* ``check(cfg, dims)``: the strategy's checks that need no data, once before launch.
* ``advice``: how ``gnnpar advise`` profiles and simulates it (:class:`Advice`); None: advise
  does not consider it (and says so).
* ``step_rows``: what one training step of a graph holds, for the memory estimate
  (:func:`gnnpar.models.memory.estimate_bytes`, through :meth:`StrategySpec.memory`): None for
  the whole graph, or one subgraph with --partitions. Whether a smaller ``--batch-size`` helps a
  run that does not fit comes from ``reads``; the model copies a machine holds from ``degrees``.
* ``across_shards``: it trains a sharded dataset with each host holding only its own shard
  (:func:`gnnpar.run.run_rank` loads the host's shard instead of the whole graph).
* ``build(cfg, dataset, ctx, dims) -> Plan``: on every rank, the parts that plug into the one
  training loop (:mod:`gnnpar.training.loop`). It imports torch and the training parts when it
  runs, so that the spec, and the config checks that read it, do not.

Each strategy is one module of this package that defines its ``SPEC``;
:mod:`gnnpar.strategies.registry` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gnnpar.config.schema import DATASET_KINDS, Config, StrategyConfig
from gnnpar.errors import UsageError
from gnnpar.parallel.parallel_dims import ParallelDims

if TYPE_CHECKING:
    from gnnpar.runtime.dist import DistContext
    from gnnpar.training.loop import Plan


# ---------------------------------------------------------------- the settings a strategy reads
def reads(*keys: str, kinds: tuple[str, ...] = DATASET_KINDS) -> dict[str, tuple[str, ...]]:
    """``{key: kinds}``: settings (flag names) read when the dataset is of one of ``kinds``."""
    return dict.fromkeys(keys, kinds)


# Groups that several strategies read
CLUSTER_GCN = reads("partitions", "partitioner", kinds=("graph",))  # subgraphs of a graph
AVERAGING = reads("sync-every", "average")  # periodic averaging (gnnpar.training.sync)
STRAGGLERS = reads("slowdown", "jitter")  # emulated stragglers (gnnpar.training.straggler)
PIPELINE = {
    **reads("stages", "chunks", "balance", "schedule"),
    **reads("microbatch", kinds=("graph",)),  # image batches are cut evenly
}
STEP_CHECKPOINTS = reads("checkpoint-every-steps")  # the ranks reach common steps
# how a graph's final scores are computed (gnnpar.training.evaluation.choose_eval_mode)
EVAL_MODE = reads("eval-mode", kinds=("graph",))

# result.json keys that several strategies' plans add (Plan.extra): {key: meaning}
STRAGGLER_KEYS = {"slowdown": '--slowdown as {"rank": factor}', "jitter": "--jitter"}
AVERAGING_KEYS = {"sync_every": "--sync-every K", "average": "--average: grads or params"}
STEPS_KEYS = {"steps_per_epoch": "steps every rank runs per epoch"}


def check_stragglers(cfg: Config, dims: ParallelDims) -> None:
    """--slowdown names ranks that the run has (for the strategies that read STRAGGLERS)."""
    bad = sorted(r for r in cfg.strategy.slowdown if r >= dims.world)
    if bad:
        raise UsageError(
            f"--slowdown names rank {bad[0]}, but the run has ranks 0..{dims.world - 1} only."
        )


# ---------------------------------------------------------------- what gnnpar advise needs
# The simulations of gnnpar.advise (each a function of gnnpar.advise.predict, on the event
# simulations of gnnpar.advise.simulate); a strategy names the one that models its training:
SIM_ONE_RANK = "one-rank"  # one process trains every batch in turn (the full graph or subgraphs)
SIM_LOCKSTEP = "lockstep"  # data parallel on subgraphs, averaging every sync_every steps
SIM_GOSSIP = "gossip"  # a shared pool of subgraphs, ranks averaging in pairs
SIM_PIPELINE = "pipeline"  # stages over ranks (with replicas where it reads --replicas)
SIM_SAMPLED = "sampled"  # data parallel on neighbour-sampled batches under DDP
SIMULATIONS = (SIM_ONE_RANK, SIM_LOCKSTEP, SIM_GOSSIP, SIM_PIPELINE, SIM_SAMPLED)


@dataclass(frozen=True)
class Advice:
    """How ``gnnpar advise`` profiles and simulates a strategy: torch-free facts it reads from
    the spec (the rest it derives from the spec itself: the settings grid from ``reads``, e.g.
    --partitions, --sync-every, --average, --stages/--chunks/--schedule, --replicas,
    --batch-size/--loader-workers; whether it takes --slowdown/--jitter stragglers from
    ``reads``; its ranks from ``degrees``).

    * ``simulation``: one of :data:`SIMULATIONS`; it also says what the profile measures for
      it (the full graph or each subgraph's step; sampled batches; pipeline stages) and its
      memory per rank.
    * ``default``: in advise's grid when ``--strategies`` is not given.
    * ``bipartite``: SIM_GOSSIP: active ranks pair with passive ones only.
    * ``across_shards``: on a sharded folder, each host holds only its shard and the step
      exchanges the frontier and the feature rows with their owners: the simulated step adds
      that exchange over the cluster's network (:mod:`gnnpar.advise.shard_exchange`), and the
      batches are made in the rank (no loader workers).
    * ``own_plan``: the profile times its steps through its own plan (its ``build``, in one
      process as rank 0); else through the reference plan of what it needs measured (the first
      registered strategy of that simulation: a one-rank step of the full graph or of a subgraph,
      a sampled batch, a pipeline's stages; :func:`gnnpar.advise.profile.core.reference`), as
      the data-parallel strategies on subgraphs, whose steps are a one-rank step each.
    """

    simulation: str
    default: bool = True
    bipartite: bool = False
    own_plan: bool = False
    across_shards: bool = False

    def __post_init__(self) -> None:
        if self.simulation not in SIMULATIONS:
            raise ValueError(
                f"Advice(simulation={self.simulation!r}): one of {', '.join(SIMULATIONS)}"
            )


# ---------------------------------------------------------------- what the memory estimate needs
# (settings, a graph dataset) -> (rows, message edges) of one training step of one model copy:
# the rows whose hidden outputs the backward pass keeps, and the edges whose messages it keeps
StepRows = Callable[[Config, Any], tuple[int, int]]


@dataclass(frozen=True)
class Memory:
    """A strategy's facts for the memory estimate (:func:`gnnpar.models.memory.estimate_bytes`
    and :func:`gnnpar.runtime.footprint.check_memory` take them as plain arguments: the layers
    below the strategies know no spec): ``step_rows`` (see :data:`StepRows`; None: the whole
    graph, or one subgraph with --partitions) and ``batch_sized`` (a smaller ``--batch-size``
    makes its steps smaller, said when a run is refused). The model copies a machine's ranks
    hold come from the run's :class:`~gnnpar.parallel.parallel_dims.ParallelDims` (``degrees``)."""

    step_rows: StepRows | None
    batch_sized: bool


# ---------------------------------------------------------------- parallel degrees
Degrees = Callable[[StrategyConfig, int], tuple[int, int]]  # (settings, world) -> (copies, stages)


def one_process(s: StrategyConfig, world: int) -> tuple[int, int]:
    return 1, 1


def data_parallel(s: StrategyConfig, world: int) -> tuple[int, int]:
    return world, 1


def pipelined(s: StrategyConfig, world: int) -> tuple[int, int]:
    return 1, s.stages


def replicated_pipeline(s: StrategyConfig, world: int) -> tuple[int, int]:
    return s.replicas, s.stages


def _no_check(cfg: Config, dims: ParallelDims) -> None:
    pass


def _no_defaults(cfg: Config) -> None:
    pass


@dataclass(frozen=True, eq=False)
class StrategySpec:
    name: str  # --strategy NAME
    help: str  # one line for ``gnnpar train --help``
    degrees: Degrees
    build: Callable[[Config, Any, DistContext, ParallelDims], Plan]
    reads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    check: Callable[[Config, ParallelDims], None] = _no_check
    defaults: Callable[[Config], None] = _no_defaults
    # result.json keys its Plan.extra adds, {key: meaning}: gnnpar.result refuses any other
    result_keys: Mapping[str, str] = field(default_factory=dict)
    advice: Advice | None = None  # how gnnpar advise profiles and simulates it
    step_rows: StepRows | None = None  # the memory estimate's step of a graph (None: whole graph)
    # it trains a sharded dataset with each host holding only its own shard (gnnpar.run)
    across_shards: bool = False

    def memory(self, kind: str) -> Memory:
        """The memory estimate's facts of this strategy on a dataset of ``kind``."""
        return Memory(self.step_rows, kind in self.reads.get("batch-size", ()))

    def parallel_dims(self, cfg: Config, launched: int | None = None) -> ParallelDims:
        """The degrees ``cfg`` asks for, checked against the world size it will run with:
        ``launched`` (torchrun's WORLD_SIZE) if given, else ``--workers``."""
        world = launched if launched is not None else cfg.strategy.workers
        replicas, stages = self.degrees(cfg.strategy, world)
        if replicas * stages == world:
            return ParallelDims(replicas, stages, world)
        if self.degrees is one_process:
            how = "torchrun started" if launched is not None else "--workers asks for"
            raise UsageError(
                f"--strategy {self.name} trains in one process, but {how} {world}: that "
                "would train identical copies. Use --workers 1, or a parallel strategy "
                "(allreduce, gossip, sampled: data parallel; pipeline: stages)."
            )
        what = f"{replicas} replicas x {stages} stages" if replicas > 1 else f"{stages} stages"
        raise UsageError(
            f"--strategy {self.name} with {what} needs {replicas * stages} ranks, but the run "
            f"has {world}; pass --workers {replicas * stages}."
        )
