"""AllReduce-GCN: synchronous data-parallel Cluster-GCN (study 003 algorithms 3 and 4).

The graph is split into ``--partitions n`` subgraphs, dealt once, statically, to the ranks
(:class:`~gnnpar.training.sources.DealtPartitions`): every subgraph is trained exactly once per epoch and
every rank runs ``ceil(n / p)`` steps; a rank holding one subgraph fewer sits out the last step's
computation but joins its collective (``per_worker_batches`` shows the uneven share).

Averaging, every ``--sync-every K`` steps (:mod:`gnnpar.training.sync`):

* ``--average grads`` (:class:`~gnnpar.training.sync.GradAllReduce`; algorithm 4, K = 1 is algorithm 3
  and DDP's maths): one flat all-reduce rather than ``DistributedDataParallel``, because the
  uneven last step needs a mean over the ranks that had a batch, and the time a rank waits for
  the others (``per_worker_wait_s``) is then one measured call. The default at K = 1.
* ``--average params`` (:class:`~gnnpar.training.sync.ParamAverage`, local SGD with torch's averager):
  the default at K > 1, because averaging gradients never pulls the models back together, so
  after K > 1 they drift apart (synthetic-amazon, BENCHMARKS.md).

With K > 1 the ranks' models differ at the end: the average of them and the best local model
are scored on validation and the better is kept (:func:`~gnnpar.training.final_model.choose_final_model`;
``final_model`` in result.json). With K = 1 every rank holds the same model: ``"rank0"``.

Across shards (each host holding only its shard of a sharded graph), each host builds its own
shard's parts and deals them to its own ranks (gnnpar.training.cluster_parts); with K = 1 two
such hosts train the model one host trains over the unsharded graph dealt the same parts.

    gnnpar train --dataset cora --model gcn --strategy allreduce --partitions 8 --workers 2
    gnnpar train --dataset synthetic-reddit --scale 0.05 --model sage --strategy allreduce \\
        --partitions 40 --workers 2 --sync-every 20 --slowdown 1=3
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from gnnpar.config.schema import Config
from gnnpar.data.registry import kind_of
from gnnpar.errors import UsageError
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.strategies.spec import (
    AVERAGING,
    AVERAGING_KEYS,
    CLUSTER_GCN,
    EVAL_MODE,
    SIM_LOCKSTEP,
    STEP_CHECKPOINTS,
    STEPS_KEYS,
    STRAGGLER_KEYS,
    STRAGGLERS,
    Advice,
    StrategySpec,
    check_stragglers,
    data_parallel,
)

if TYPE_CHECKING:
    from gnnpar.runtime.dist import DistContext
    from gnnpar.training.loop import Plan


def check_partitioned(cfg: Config, dims: ParallelDims, name: str) -> None:
    """Cluster-GCN data parallelism: a graph, ``--partitions`` >= ranks, stragglers that exist."""
    d = cfg.data
    if kind_of(d.dataset) == "image":
        raise UsageError(
            f"--strategy {name} trains Cluster-GCN subgraphs of a graph; '{d.dataset}' holds "
            "images. Use a graph dataset."
        )
    if d.partitions is None:
        raise UsageError(
            f"--strategy {name} divides Cluster-GCN subgraphs among ranks: pass --partitions N "
            "with N >= --workers (study 003 uses 40 for Reddit)."
        )
    if d.partitions < dims.world:
        raise UsageError(
            f"--partitions {d.partitions} is fewer than the {dims.world} ranks: every rank needs "
            "at least one subgraph. Raise --partitions or lower --workers."
        )
    check_stragglers(cfg, dims)


def check(cfg: Config, dims: ParallelDims) -> None:
    check_partitioned(cfg, dims, "allreduce")


def defaults(cfg: Config) -> None:
    """Gradients at K = 1 (synchronous data parallelism, DDP's maths); parameters at K > 1,
    because averaging gradients never pulls the models back together, so between K > 1
    averagings they drift apart (synthetic-amazon, BENCHMARKS.md)."""
    s = cfg.strategy
    if s.average is None:
        s.average = "params" if s.sync_every > 1 else "grads"


def build(cfg: Config, ds, ctx: DistContext, dims: ParallelDims) -> Plan:
    from gnnpar.models import build_model
    from gnnpar.parallel import collectives
    from gnnpar.training.cluster_parts import cluster_parts, final_across
    from gnnpar.training.evaluation import evaluate_graph, full_graph_record
    from gnnpar.training.final_model import choose_final_model
    from gnnpar.training.loop import Final, Plan
    from gnnpar.training.losses import LocalStep, graph_loss
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.seeding import seed_everything, seed_rank_dropout
    from gnnpar.training.sources import DealtPartitions
    from gnnpar.training.straggler import Straggler
    from gnnpar.training.sync import GradAllReduce, ParamAverage

    s, r = cfg.strategy, cfg.run
    parts = cluster_parts(cfg, ds, ctx)  # this host's parts, across shards
    seed_everything(r.seed)
    model = build_model(
        cfg.model, ds.num_features, ds.num_classes, ds.multilabel, graph=getattr(ds, "data", None)
    )
    model.to(ctx.device)
    collectives.broadcast_parameters(model)  # one starting point, whatever each init did
    seed_rank_dropout(r.seed, ctx.rank)
    params = list(model.parameters())
    opt = build_optimizer(cfg, params)
    Policy = ParamAverage if s.average == "params" else GradAllReduce
    source = DealtPartitions(
        parts.graph, ctx.rank, ctx.world_size, r.epochs, r.seed, r.max_steps, ctx.device,
        deal=parts.deal(ctx.rank, ctx.world_size, r.seed), first=parts.first,
    )  # fmt: skip
    record = parts.record(cfg) if parts.across else full_graph_record(cfg.strategy.eval_mode)

    def evaluate() -> tuple[dict | None, list[float]]:
        if parts.across:  # every host scores its shard's nodes, every rank takes part
            scores, times = parts.scored(model, cfg, ds.multilabel)
            return (scores if ctx.is_main else None), times
        if not ctx.is_main:  # the others wait at the next epoch's (untimed) barrier
            return None, []
        scores, t = evaluate_graph(model, ds)
        return scores, [t]

    def finish() -> Final:
        if s.sync_every > 1 and ctx.world_size > 1:
            if parts.across:
                choice = final_across(model, params, parts, cfg, ds)
            else:
                choice = choose_final_model(model, params, ds, ctx.store, s.timeout_s)
            return Final(choice.scores, choice.eval_times, choice, evaluation=record)
        scores, times = {"val": float("nan"), "test": float("nan"), "train": None}, []
        if parts.across:  # every rank takes part, and gets the scores
            scores, times = parts.scored(model, cfg, ds.multilabel)
            return Final(scores, times, final_model="rank0", evaluation=record)
        if ctx.is_main:
            scores, t = evaluate_graph(model, ds)
            times.append(t)
        return Final(scores, times, final_model="rank0", evaluation=record)

    return Plan(
        f"allreduce {cfg.model.name} x{ctx.world_size}",
        model,
        opt,
        source,
        LocalStep(model, partial(graph_loss, multilabel=ds.multilabel)),
        finish,
        sync=Policy(params, s.sync_every),
        straggler=Straggler.for_rank(s.slowdown, s.jitter, r.seed, ctx.rank),
        evaluate=evaluate,
        reporter=ctx.is_main,
        partition_time_s=parts.seconds,
        extra={
            "slowdown": {str(k): v for k, v in sorted(s.slowdown.items())},
            "jitter": s.jitter,
            "sync_every": s.sync_every,
            "average": s.average,
            "partitioner": cfg.data.partitioner,
            "partitions": parts.num_parts,
            "partition_cache_hit": parts.cache_hit,
            "steps_per_epoch": source.steps,
        },
    )


SPEC = StrategySpec(
    name="allreduce",
    help="synchronous data-parallel Cluster-GCN",
    advice=Advice(SIM_LOCKSTEP),
    degrees=data_parallel,
    reads={**CLUSTER_GCN, **AVERAGING, **STRAGGLERS, **STEP_CHECKPOINTS, **EVAL_MODE},
    result_keys={
        **STRAGGLER_KEYS,
        **AVERAGING_KEYS,
        **STEPS_KEYS,
        "partitioner": "--partitioner",
        "partitions": "number of Cluster-GCN subgraphs",
        "partition_cache_hit": "the partitioning came from the cache",
    },
    build=build,
    check=check,
    defaults=defaults,
    across_shards=True,  # each host trains its own shard's parts (training/cluster_parts.py)
)
