"""AllReduce-GCN: synchronous data-parallel Cluster-GCN (study 003 algorithms 3 and 4).

The graph is split into ``--partitions n`` subgraphs (mini-batches). They are dealt once,
statically, round-robin from a seeded permutation: rank ``r`` owns ``perm[r::p]``. Every epoch
each rank trains its own subgraphs in a fresh seeded order, and every rank runs the same number
of steps, ``ceil(n / p)``: when ``p`` does not divide ``n`` the ranks holding one subgraph fewer
sit out the last step's computation but still join its collective, sending a zero gradient that
is not counted in the mean. So every subgraph is trained exactly once per epoch, and nothing is
repeated or dropped (``per_worker_batches`` shows the uneven share).

Averaging, every ``--sync-every K`` steps (a step counter running across epochs):

* ``--average grads`` (the study's periodic gradient averaging, algorithm 4): before the optimizer
  step the gradients are all-reduced and averaged; other steps update with local gradients only.
  K = 1 is plain synchronous data parallelism (algorithm 3), the maths of DDP. One ``all_reduce``
  of a flat gradient buffer is used rather than ``DistributedDataParallel``: the uneven last
  step needs a mean over the ranks that actually had a batch, and the time a rank is blocked
  waiting for the others (``per_worker_wait_s``, the study's synchronisation barrier) is then one
  measured call instead of being hidden inside DDP's backward hooks.
* ``--average params`` (local SGD / periodic model averaging): every rank steps on its own
  gradients and every K steps the parameters are averaged with torch's
  ``PeriodicModelAverager``. With plain SGD and K = 1 this equals gradient averaging (when
  ``p`` divides ``n``; at an uneven last step the idle ranks' unchanged parameters count in the
  average, as torch's averager weighs every rank equally).

With K > 1 the ranks' models differ at the end (and Adam's moments always differ), so two
candidates are scored on the validation set, as GossipGCN does: the average of the ranks' models
and the best local model, all scored on rank 0 (:func:`~gnnpar.strategies.base.choose_final_model`).
The better one is the final model
(``final_model: "average"`` or ``"best-local:rankN"``, both candidates' scores under
``candidates``). The choice matters with ``--average grads``: averaging gradients never pulls
the models back together, so after K > 1 they drift apart and their average can be far worse
than either (synthetic-amazon, BENCHMARKS.md). With K = 1 every rank holds the same model:
``"rank0"``.

Time: ``train_time_s`` is the wall time from a common start of each epoch until every rank has
finished it (a barrier closes the epoch and counts as waiting), summed over epochs; partitioning
and evaluation are outside it. ``--slowdown RANK=F`` / ``--jitter X`` emulate stragglers.

    gnnpar train --dataset cora --model gcn --strategy allreduce --partitions 8 --workers 2
    gnnpar train --dataset synthetic-reddit --scale 0.05 --model sage --strategy allreduce \\
        --partitions 40 --workers 2 --sync-every 20 --average params --slowdown 1=3
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from gnnpar import UsageError, comm
from gnnpar.config import Config
from gnnpar.data.datasets import GraphDataset
from gnnpar.data.partition import load_partitions
from gnnpar.dist import DistContext
from gnnpar.engine import evaluate_graph, graph_loss
from gnnpar.metrics import Progress
from gnnpar.models import build_model
from gnnpar.strategies.base import (
    Outcome,
    Straggler,
    build_optimizer,
    choose_final_model,
    seed_everything,
)


def assign_parts(num_parts: int, world: int, seed: int) -> list[list[int]]:
    """Static, even split of the subgraphs: rank r owns ``perm[r::world]`` (sizes differ by <= 1)."""
    perm = torch.randperm(num_parts, generator=torch.Generator().manual_seed(seed)).tolist()
    return [perm[r::world] for r in range(world)]


def epoch_order(parts: list[int], seed: int, epoch: int, rank: int) -> list[int]:
    """The order in which a rank trains its own subgraphs in one epoch (seeded, reproducible)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch * 1009 + rank)
    return [parts[i] for i in torch.randperm(len(parts), generator=g).tolist()]


def world_size_for(cfg: Config) -> int:
    """Ranks the run will have: torchrun's WORLD_SIZE when under it, else --workers."""
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return cfg.strategy.workers


@dataclass
class RankLog:
    """What one rank did; gathered on every rank, rank 0 reports it."""

    batches: int = 0
    exchanges: int = 0
    wait_s: float = 0.0
    delay_s: float = 0.0
    step_times: list[float] = field(default_factory=list)
    loss_sum: list[float] = field(default_factory=list)  # per epoch: sum of this rank's losses


class AllReduce:
    name = "allreduce"

    @staticmethod
    def validate_config(cfg: Config) -> None:
        from gnnpar.data.datasets import REGISTRY

        d, s = cfg.data, cfg.strategy
        if REGISTRY[d.dataset].kind == "image":
            raise UsageError(
                f"--strategy allreduce trains Cluster-GCN subgraphs of a graph; '{d.dataset}' "
                "holds images. Use a graph dataset."
            )
        if d.partitions is None:
            raise UsageError(
                "--strategy allreduce divides Cluster-GCN subgraphs among ranks: pass "
                "--partitions N with N >= --workers (study 003 uses 40 for Reddit)."
            )
        world = world_size_for(cfg)
        if d.partitions < world:
            raise UsageError(
                f"--partitions {d.partitions} is fewer than the {world} ranks: every rank needs "
                "at least one subgraph. Raise --partitions or lower --workers."
            )
        bad = sorted(r for r in s.slowdown if r >= world)
        if bad:
            raise UsageError(
                f"--slowdown names rank {bad[0]}, but the run has ranks 0..{world - 1} only."
            )

    def run(self, cfg: Config, ds: GraphDataset, ctx: DistContext) -> Outcome:
        s, r = cfg.strategy, cfg.run
        self.validate_config(cfg)
        graph, partition_time, cache_hit = load_partitions(cfg, ds)
        seed_everything(r.seed)
        model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
        model.to(ctx.device)
        comm.broadcast_parameters(model)  # one starting point, whatever each rank's init did
        torch.manual_seed(r.seed + 1000 * (ctx.rank + 1))  # distinct dropout masks per rank
        params = list(model.parameters())
        opt = build_optimizer(cfg, params)
        averager = None
        if s.average == "params":
            with warnings.catch_warnings():  # period 1 "use DDP instead": K=1 is deliberate
                warnings.simplefilter("ignore", UserWarning)
                # warmup K-1: the first averaging comes after K local steps, then every K.
                averager = PeriodicModelAverager(period=s.sync_every, warmup_steps=s.sync_every - 1)
        mine = assign_parts(graph.num_parts, ctx.world_size, r.seed)[ctx.rank]
        steps = math.ceil(graph.num_parts / ctx.world_size)
        if r.max_steps:
            steps = min(steps, r.max_steps)
        straggler = Straggler(s.slowdown.get(ctx.rank, 1.0), s.jitter, r.seed + ctx.rank)
        log, clock = RankLog(), comm.WaitClock()
        train_time, eval_times, count = 0.0, [], 0
        desc = f"allreduce {cfg.model.name} x{ctx.world_size}"
        with Progress(r.epochs * steps, desc, ctx.is_main and not r.quiet) as bar:
            for epoch in range(r.epochs):
                order = epoch_order(mine, r.seed, epoch, ctx.rank)
                loss_sum = 0.0
                if comm.active():
                    dist.barrier()  # a common start; not timed
                t_epoch = time.perf_counter()
                for i in range(steps):
                    count += 1
                    t0 = time.perf_counter()
                    has_batch = i < len(order)
                    opt.zero_grad(set_to_none=True)
                    if has_batch:
                        batch = graph.batch(order[i]).to(ctx.device)
                        loss = graph_loss(model, batch, ds.multilabel)
                        loss.backward()
                        loss_sum += loss.item()
                        log.batches += 1
                        straggler.after_step(time.perf_counter() - t0)
                    sync = count % s.sync_every == 0
                    if averager is None:  # gradient averaging (algorithms 3 and 4)
                        if sync:
                            comm.average_gradients(params, has_batch, clock)
                            log.exchanges += 1
                        if has_batch or sync:
                            opt.step()
                    else:  # local SGD, then periodic model averaging
                        if has_batch:
                            opt.step()
                        t_wait = time.perf_counter()
                        averager.average_parameters(params)  # averages when its count says so
                        if sync:
                            clock.seconds += time.perf_counter() - t_wait
                            log.exchanges += 1
                    log.step_times.append(time.perf_counter() - t0)
                    info = f"epoch {epoch + 1} loss {loss_sum / max(i + 1, 1):.4f}"
                    bar.update(1, f"{info} waited {clock.seconds:.1f}s")
                clock.barrier()  # the epoch ends when every rank is done: waiting counts
                train_time += time.perf_counter() - t_epoch
                log.loss_sum.append(loss_sum)
                last = epoch + 1 == r.epochs
                if r.eval_every and (epoch + 1) % r.eval_every == 0 and not last:
                    if ctx.is_main:  # the others wait at the next epoch's (untimed) barrier
                        scores, t = evaluate_graph(model, ds)
                        eval_times.append(t)
                        bar.update(0, f"epoch {epoch + 1} val {scores['val']:.3f}")
        log.wait_s, log.delay_s = clock.seconds, straggler.delay_s
        logs = comm.gather_to_all(asdict(log))
        train_time = comm.max_over_ranks(train_time)
        if s.sync_every > 1 and ctx.world_size > 1:
            choice = choose_final_model(model, params, ds, cfg.strategy.timeout_s)
            eval_times += choice.eval_times
            final, scores = choice.name, choice.scores
            candidates, divergence = choice.candidates, choice.divergence
        else:
            final, candidates, divergence = "rank0", None, None
            scores = {"val": float("nan"), "test": float("nan"), "train": float("nan")}
            if ctx.is_main:
                scores, t = evaluate_graph(model, ds)
                eval_times.append(t)
        self.model = model  # the final model, for callers that want the weights
        n = graph.num_parts
        epoch_batches = [min(len(o), steps) for o in assign_parts(n, ctx.world_size, r.seed)]
        loss_curve = [
            sum(g["loss_sum"][e] for g in logs) / max(sum(epoch_batches), 1)
            for e in range(r.epochs)
        ]
        return Outcome(
            train_time_s=train_time,
            step_times=log.step_times,
            test_step_times=eval_times,
            loss_curve=loss_curve,
            per_worker_batches=[g["batches"] for g in logs],
            val_score=scores["val"],
            test_score=scores["test"],
            partition_time_s=partition_time,
            extra={
                "train_score": scores["train"],
                "final_model": final,
                **({"candidates": candidates} if candidates else {}),
                # ||rank's model - average|| / ||average||: how far the ranks' models drifted
                **({"per_worker_divergence": divergence} if divergence else {}),
                "per_worker_exchanges": [g["exchanges"] for g in logs],
                "per_worker_wait_s": [g["wait_s"] for g in logs],
                "per_worker_delay_s": [g["delay_s"] for g in logs],
                "per_worker_step_s": [sum(g["step_times"]) for g in logs],
                "slowdown": {str(k): v for k, v in sorted(s.slowdown.items())},
                "jitter": s.jitter,
                "sync_every": s.sync_every,
                "average": s.average,
                "partitioner": cfg.data.partitioner,
                "partitions": n,
                "partition_cache_hit": cache_hit,
                "steps_per_epoch": steps,
            },
        )
