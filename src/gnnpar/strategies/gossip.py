"""GossipGCN and its active/passive variant: asynchronous Cluster-GCN with a work pool.

Study 003 chapter 4 (algorithms 5 and 6). Every rank keeps its own model and takes the next
subgraph from a shared work pool whenever it is free (:class:`~gnnpar.training.sources.PoolSource`), so
fast ranks train more subgraphs (table 4.8). Every ``--sync-every K`` steps a rank pairs with a
random available partner, or serves the partner that already picked it, and the two average
their parameters (``--average params``, the default) or gradients (``--average grads``, the
study's) point to point (:class:`GossipSync`). No rank ever waits for all others. The pool, the
pairing protocol and its deadlock-freedom argument live in :mod:`gnnpar.parallel.gossip`.

Which to average. Averaging gradients never pulls two models back together: between exchanges,
and whenever a straggler makes the pool's split uneven, the ranks' parameters drift apart, and
every exchange then updates each model with a gradient taken at the other's parameters. On
synthetic-amazon with rank 1 slowed 3x this cost 12 points of micro-F1 at K = 1 against
all-reduce; averaging parameters contracts the difference at every exchange and stayed within
0.4 points of it (BENCHMARKS.md, "Gossip against allreduce"); hence the default.

At the end the best local model (the study's choice) and the average of all local models are
scored on validation and the better one is kept (:func:`~gnnpar.training.final_model.choose_final_model`).

    gnnpar train --dataset cora --model gcn --strategy gossip --partitions 8 --workers 2
    gnnpar train --dataset synthetic-reddit --scale 0.05 --model sage --strategy gossip \\
        --partitions 40 --workers 2 --sync-every 20 --slowdown 1=3

Across shards (each host holding only its shard of a sharded graph, README "Sharded across
hosts"): every host's pool holds its own shard's subgraphs (gnnpar.data.shard_parts); a rank
takes from its own host's pool first and then from the others', fetching such a subgraph from
a rank of its host (:func:`pool_of`, gnnpar.parallel.fetch); every subgraph is still trained
once per epoch. Checkpoints (``--checkpoint-every``, at epoch ends) as on one host: before the
barrier every rank serves the others' fetches until all have come to it (SubgraphFetch.pause),
and each rank's part holds the pools' counters and where it takes next (ShardedPool.state), so
a resumed or restarted run still trains every subgraph once per epoch.

gossip-bipartite (strategies/gossip_bipartite.py) is this with another pairing topology.
"""

from __future__ import annotations

import random
from functools import partial
from typing import TYPE_CHECKING

from gnnpar.config.schema import Config
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.strategies.allreduce import check_partitioned
from gnnpar.strategies.spec import (
    AVERAGING,
    AVERAGING_KEYS,
    CLUSTER_GCN,
    EVAL_MODE,
    SIM_GOSSIP,
    STRAGGLER_KEYS,
    STRAGGLERS,
    Advice,
    StrategySpec,
    data_parallel,
)

if TYPE_CHECKING:
    from gnnpar.runtime.dist import DistContext
    from gnnpar.training.loop import Plan


def check(cfg: Config, dims: ParallelDims) -> None:
    check_partitioned(cfg, dims, cfg.strategy.name)


def defaults(cfg: Config) -> None:
    """Parameters: gossip ranks are always out of step, so averaging gradients would let their
    models drift apart (module docstring)."""
    if cfg.strategy.average is None:
        cfg.strategy.average = "params"


def pool_of(parts, cfg: Config, ctx: DistContext):  # noqa: ANN001, ANN201
    """(the subgraphs by id, the work pool, what the source runs once the pool is empty for
    it, what it runs before a checkpoint). One graph: every subgraph here, one pool. Across
    shards: this host's subgraphs, one pool per host (ShardedPool: its own first), another
    host's subgraph fetched from one of its ranks when taken (SubgraphFetch), and every rank
    serving the others' fetches until all are done, or all have come to a checkpoint
    (gnnpar.parallel.fetch)."""
    import bisect

    from gnnpar.data.shard_parts import offsets
    from gnnpar.parallel.fetch import SubgraphFetch
    from gnnpar.parallel.gossip import ShardedPool, WorkPool

    r = cfg.run
    if not parts.across:
        batches = [b.to(ctx.device) for b in parts.graph.batches()]
        pool = WorkPool(ctx.store, "gossip/pool", len(batches), r.epochs, r.seed)
        return batches, pool, None, None
    at = offsets(parts.sizes)
    own = {parts.first + i: b.to(ctx.device) for i, b in enumerate(parts.graph.batches())}
    pools = [list(range(a, a + n)) for a, n in zip(at, parts.sizes, strict=True)]
    host = int(parts.exchange.host)
    pool = ShardedPool(ctx.store, "gossip/pool", pools, host, r.epochs, r.seed)
    answerer = [int(a) for a in parts.exchange.answerer]

    def server_of(p: int) -> int:
        return answerer[bisect.bisect_right(at, p) - 1]

    fetch = SubgraphFetch(
        ctx.store, "gossip/fetch", ctx.rank, ctx.world_size, own, server_of, cfg.strategy.timeout_s
    )
    return fetch, pool, fetch.drain, fetch.pause


def build(cfg: Config, ds, ctx: DistContext, dims: ParallelDims, bipartite: bool = False) -> Plan:
    """``bipartite``: active ranks pick partners among passive ones only (gossip-bipartite)."""
    import torch.distributed as dist

    from gnnpar.models import build_model
    from gnnpar.parallel.gossip import AnyPeer, Bipartite, Pairing
    from gnnpar.training.cluster_parts import cluster_parts, final_across
    from gnnpar.training.final_model import choose_final_model
    from gnnpar.training.gossip_sync import GossipSync
    from gnnpar.training.loop import Final, Plan
    from gnnpar.training.losses import LocalStep, graph_loss
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.seeding import seed_everything, seed_rank_dropout
    from gnnpar.training.sources import PoolSource
    from gnnpar.training.straggler import Straggler

    topology = Bipartite if bipartite else AnyPeer
    s, r = cfg.strategy, cfg.run
    seed_everything(r.seed)  # the same initial model on every rank, as gossip assumes
    model = build_model(
        cfg.model, ds.num_features, ds.num_classes, ds.multilabel, graph=getattr(ds, "data", None)
    )
    model.to(ctx.device)
    opt = build_optimizer(cfg, model.parameters())
    seed_rank_dropout(r.seed, ctx.rank)
    parts = cluster_parts(cfg, ds, ctx)  # this host's parts, across shards
    batches, pool, on_empty, on_pause = pool_of(parts, cfg, ctx)
    rng = random.Random(r.seed * 7919 + ctx.rank)
    pairing = Pairing(ctx.store, "gossip", topology(ctx.rank, ctx.world_size), rng, s.timeout_s)
    pairing.open()
    if ctx.is_distributed:
        dist.barrier()  # every state key exists before anybody claims; common start time
    params = [p for p in model.parameters() if p.requires_grad]
    sync = GossipSync(pairing, params, s.average, s.sync_every, s.timeout_s)
    if on_empty is not None:  # while waiting for a fetch: the exchange a partner waits in
        batches.idle = sync.serve_pending

    def finish() -> Final:
        from gnnpar.training.evaluation import full_graph_record

        if parts.across:  # every rank scores each candidate with the others
            choice = final_across(model, params, parts, cfg, ds)
            return Final(choice.scores, choice.eval_times, choice, evaluation=parts.record(cfg))
        choice = choose_final_model(model, params, ds, ctx.store, s.timeout_s)
        return Final(
            choice.scores,
            choice.eval_times,
            choice,
            evaluation=full_graph_record(cfg.strategy.eval_mode),
        )

    return Plan(
        f"{cfg.strategy.name} {cfg.model.name} x{ctx.world_size}",
        model,
        opt,
        PoolSource(pool, batches, on_empty, on_pause),
        LocalStep(model, partial(graph_loss, multilabel=ds.multilabel)),
        finish,
        sync=sync,
        straggler=Straggler.for_rank(s.slowdown, s.jitter, r.seed, ctx.rank),
        lockstep=False,
        reporter=ctx.is_main,
        partition_time_s=parts.seconds,
        extra={
            "sync_every": s.sync_every,
            "average": s.average,
            "topology": topology.name,
            "slowdown": {str(k): v for k, v in s.slowdown.items()},
            "jitter": s.jitter,
        },
    )


SPEC = StrategySpec(
    name="gossip",
    help="asynchronous Cluster-GCN, averaging with one partner at a time",
    advice=Advice(SIM_GOSSIP),
    degrees=data_parallel,
    # no --checkpoint-every-steps: gossip ranks reach no common step, only epoch ends
    reads={**CLUSTER_GCN, **AVERAGING, **STRAGGLERS, **EVAL_MODE},
    result_keys={
        **STRAGGLER_KEYS,
        **AVERAGING_KEYS,
        "topology": "who may pair with whom (any, bipartite)",
    },
    build=build,
    check=check,
    defaults=defaults,
    across_shards=True,  # a host's pool is its shard's parts; others' are fetched (pool_of)
)
