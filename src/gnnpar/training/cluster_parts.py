"""The Cluster-GCN subgraphs a rank of allreduce or gossip trains, of a graph in one piece or
sharded across hosts, and how a run across shards scores its model.

* An unsharded graph: ``--partitions`` parts of the whole graph (:func:`gnnpar.data.partition.
  load_partitions`, cached), dealt over all ranks.
* A sharded graph (``gnnpar prepare --shards H``), whatever each host holds: the parts lie
  within shards (:mod:`gnnpar.data.shard_parts`). Across shards (each host holds only its own)
  a host builds its own shard's parts alone; a host holding every shard builds them all over
  the unsharded graph, the same tensors. Shard h's parts go to the ranks of host h: its node
  rank across shards, else rank ``r`` counts as host ``r // (world / H)`` (torchrun numbers a
  host's ranks in a row), when ``H`` divides the world, so that one host with every shard deals
  the parts as H hosts each holding its own would (the equality the tests check); where it does
  not, they are dealt over all ranks.

Across shards no host holds the whole graph, so the model is scored as sampled training scores
it there (:func:`gnnpar.data.sampling.distributed.evaluate_across`: every host its shard's val
and test nodes, sampled with :func:`eval_fanouts`, all ranks together).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from gnnpar.config.schema import Config
from gnnpar.data.partition import PartitionedGraph, load_partitions
from gnnpar.parallel import collectives
from gnnpar.runtime.dist import DistContext

EVAL_BATCH = 1024  # seed nodes per evaluation batch across shards


def eval_fanouts(layers: int) -> list[int]:
    """Neighbours sampled per layer when scoring across shards: the sampled strategy's
    default (study 002's 25, 10, 10; 10 for every further layer)."""
    return [25, 10, 10][:layers] + [10] * max(0, layers - 3)


@dataclass
class ClusterParts:
    """The parts this rank's host holds and how they are dealt."""

    graph: PartitionedGraph  # this host's parts (across shards) or every part
    seconds: float  # partitioning (or reading the cache): partition_time_s
    cache_hit: bool
    first: int = 0  # the id of graph's part 0
    sizes: list[int] | None = None  # parts per shard (a sharded graph)
    host_of_rank: list[int] | None = None  # the deal by host, or None: over all ranks
    across: bool = False
    shard: Any = None  # across: this host's ShardGraph
    exchange: Any = None  # across: the Exchange that evaluation samples through
    sampler: Any = None  # across: evaluation's ShardSampler, made at the first evaluation
    extra: dict = field(default_factory=dict)

    @property
    def num_parts(self) -> int:
        return sum(self.sizes) if self.sizes else self.graph.num_parts

    def deal(self, rank: int, world: int, seed: int) -> tuple[list[int], int] | None:
        """(this rank's part ids, steps per epoch) for DealtPartitions, or None: its own deal."""
        if self.host_of_rank is None:
            return None
        from gnnpar.data.shard_parts import deal_by_host

        mine, steps = deal_by_host(self.sizes, self.host_of_rank, seed)
        return mine[rank], steps

    def evaluate(self, model: torch.nn.Module, cfg: Config, multilabel: bool) -> dict:
        """Across shards: the model's val and test scores, sampled (every rank takes part)."""
        from gnnpar.data.sampling.distributed import ShardSampler, evaluate_across
        from gnnpar.training.losses import seed_logits

        if self.sampler is None:  # made once, by every rank together
            self.sampler = ShardSampler(self.shard, self.exchange, eval_fanouts(cfg.model.layers))
        was = model.training
        model.eval()  # the batches' seeds scored on their trimmed layers, as sampled does
        try:
            return evaluate_across(
                lambda b: seed_logits(model, b.to_data()), self.sampler, EVAL_BATCH, multilabel
            )
        finally:
            model.train(was)

    def scored(self, model: torch.nn.Module, cfg: Config, multilabel: bool):  # noqa: ANN201
        """(:meth:`evaluate`'s scores, [the seconds it took])."""
        t0 = time.perf_counter()
        scores = self.evaluate(model, cfg, multilabel)
        return scores, [time.perf_counter() - t0]

    def record(self, cfg: Config) -> dict:
        """result.json's record of how the final scores were computed, across shards."""
        fanouts = eval_fanouts(cfg.model.layers)
        return {"eval_mode": "sampled", "eval_fanouts": fanouts, "eval_batch_size": EVAL_BATCH}


def cluster_parts(cfg: Config, ds, ctx: DistContext) -> ClusterParts:
    """This rank's host's parts of ``ds`` per ``cfg.data`` (see the module docstring)."""
    d, seed = cfg.data, cfg.run.seed
    shards = ds.info.get("sharded")
    if not shards:
        graph, seconds, hit = load_partitions(cfg, ds)
        return ClusterParts(graph, seconds, hit)
    from gnnpar.data import shard_parts

    t0 = time.perf_counter()
    if ds.info.get("across_shards"):
        from gnnpar.data.sampling.distributed import Exchange, ShardGraph

        host = int(ds.info["host"])
        shard = ShardGraph.open(ds.info["source"], host)
        graph, first, sizes = shard_parts.host_parts(shard, host, d.partitions, d.partitioner, seed)
        exchange = Exchange(shard.bounds, host)  # collective: every rank's host
        return ClusterParts(
            graph, time.perf_counter() - t0, False, first, sizes,
            [int(h) for h in exchange.host_of_rank], True, shard, exchange,
        )  # fmt: skip
    graph, sizes = shard_parts.whole_graph_parts(
        ds.data, ds.info["source"], d.partitions, d.partitioner, seed
    )
    world = ctx.world_size
    by_host = None
    if world % shards == 0:
        by_host = [r // (world // shards) for r in range(world)]
    return ClusterParts(graph, time.perf_counter() - t0, False, 0, sizes, by_host)


def final_across(model: torch.nn.Module, params: list, parts: ClusterParts, cfg: Config, ds):
    """Across shards, for ranks whose models differ (gossip; allreduce with K > 1): every rank's
    model and their average scored on validation (each by all ranks together), the better kept,
    as :func:`gnnpar.training.final_model.choose_final_model` keeps it; every rank ends holding
    it. Collective."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from gnnpar.training.final_model import pick_final

    flats = collectives.all_gather_flat(parameters_to_vector(params).detach())
    average = torch.stack(flats).mean(0)
    scores, times = [], []
    for flat in [*flats, average]:
        with torch.no_grad():
            vector_to_parameters(flat, params)
        t0 = time.perf_counter()
        scores.append(parts.evaluate(model, cfg, ds.multilabel))
        times.append(time.perf_counter() - t0)
    choice = pick_final(scores, flats, average, times)
    best = choice.candidates["best_local"]["rank"]
    with torch.no_grad():
        vector_to_parameters(average if choice.name == "average" else flats[best], params)
    return choice
