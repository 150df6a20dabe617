"""GossipGCN and its active/passive variant: asynchronous Cluster-GCN with a work pool.

Study 003 chapter 4 (algorithms 5 and 6). Every rank keeps its own model and takes the next
subgraph from a shared work pool whenever it is free, so fast ranks train more subgraphs (table
4.8). Every ``--sync-every K`` steps a rank pairs with a random available partner, or serves the
partner that already picked it, and the two average their gradients (``--average grads``, the
study) or parameters (``--average params``) point to point. No rank ever waits for all others.
The pool, the pairing protocol and its deadlock-freedom argument live in :mod:`gnnpar.gossip`.

Which to average. Averaging gradients (the study's choice, the default) never pulls two models
back together: between exchanges, and whenever a straggler makes the pool's split uneven, the
ranks' parameters drift apart, and every exchange then updates each model with a gradient taken
at the other's parameters. On synthetic-amazon with rank 1 slowed 3x this costs several points
of micro-F1 at K = 1 against synchronous all-reduce; averaging parameters (``--average params``,
the gossip of models of the decentralised-SGD literature) contracts the difference at every
exchange and matched or beat all-reduce there at a bit under half its time (BENCHMARKS.md,
"Gossip against allreduce"). Prefer ``params`` whenever the ranks' speeds differ or K > 1.

At the end two candidates are scored on the validation set: the best local model (the study's
choice) and the average of all local models; the better one is the final model (``final_model``
in result.json: ``"best-local:rank1"`` or ``"average"``). Rank 0 scores all of them over one
evaluation copy of the graph (:func:`gnnpar.strategies.base.choose_final_model`), so the ranks
of a machine never build one each; ``per_worker_divergence`` says how far apart they ended.

    gnnpar train --dataset cora --model gcn --strategy gossip --partitions 8 --workers 2
    gnnpar train --dataset synthetic-reddit --scale 0.05 --model sage --strategy gossip \\
        --partitions 40 --workers 2 --sync-every 20 --slowdown 1=3
    gnnpar train ... --strategy gossip-bipartite --workers 4     # ranks 0,1 active; 2,3 passive
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gnnpar import UsageError, comm
from gnnpar.config import Config
from gnnpar.data.datasets import GraphDataset
from gnnpar.data.partition import build_partition_batches
from gnnpar.dist import DistContext
from gnnpar.engine import graph_loss
from gnnpar.gossip import (
    AnyPeer,
    Bipartite,
    Exchange,
    Pairing,
    Topology,
    WorkPool,
    exchange_average,
)
from gnnpar.metrics import Progress
from gnnpar.models import build_model
from gnnpar.strategies.base import (
    Outcome,
    Straggler,
    build_optimizer,
    choose_final_model,
    seed_everything,
)

# Test hook: "RANK:STEP:exit" makes that rank vanish after STEP steps, "RANK:STEP:stall" makes it
# stop answering; its partners must then fail with GossipTimeoutError instead of hanging.
FAULT_ENV = "GNNPAR_TEST_GOSSIP_FAULT"


@dataclass
class RankLog:
    """What one rank did; gathered on rank 0 for result.json."""

    batches: int = 0
    exchanges: int = 0
    wait_s: float = 0.0
    taken: list[list[int]] = field(default_factory=list)  # [epoch, subgraph] in order taken
    exchange_log: list[list] = field(default_factory=list)  # [step, partner, xid, initiated]
    step_times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    train_s: float = 0.0


class GossipGCN:
    name = "gossip"
    topology: type[Topology] = AnyPeer

    @classmethod
    def validate_config(cls, cfg: Config) -> None:
        from gnnpar.data.datasets import REGISTRY

        d, s = cfg.data, cfg.strategy
        if REGISTRY[d.dataset].kind == "image":
            raise UsageError(
                f"--strategy {cls.name} trains Cluster-GCN subgraphs of a graph; "
                f"'{d.dataset}' holds images. Use a graph dataset."
            )
        if d.partitions is None:
            raise UsageError(
                f"--strategy {cls.name} needs Cluster-GCN subgraphs for its work "
                "pool: pass --partitions N (study 003 uses 40 for Reddit)."
            )
        cls.check_world(cfg, s.workers)

    @classmethod
    def check_world(cls, cfg: Config, world: int) -> None:
        if cfg.data.partitions < world:
            raise UsageError(
                f"--partitions {cfg.data.partitions} is fewer than the {world} "
                "ranks: every rank needs at least one subgraph. Raise --partitions."
            )

    def run(self, cfg: Config, ds: GraphDataset, ctx: DistContext) -> Outcome:
        self.check_world(cfg, ctx.world_size)
        s, r = cfg.strategy, cfg.run
        seed_everything(r.seed)  # the same initial model on every rank, as gossip assumes
        model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
        model.to(ctx.device)
        opt = build_optimizer(cfg, model.parameters())
        torch.manual_seed(r.seed + 1000 * (ctx.rank + 1))  # distinct dropout masks per rank
        batches, partition_time = build_partition_batches(cfg, ds)
        batches = [b.to(ctx.device) for b in batches]

        store = comm.default_store()
        topo = self.topology(ctx.rank, ctx.world_size)
        pool = WorkPool(store, "gnnpar/gossip/pool", len(batches), r.epochs, r.seed)
        rng = random.Random(r.seed * 7919 + ctx.rank)
        pairing = Pairing(store, "gnnpar/gossip", topo, rng, s.timeout_s)
        pairing.open()
        if ctx.is_distributed:
            dist.barrier()  # every state key exists before anybody claims; common start time

        log = RankLog()
        straggler = Straggler(s.slowdown.get(ctx.rank, 1.0), s.jitter, r.seed + ctx.rank)
        fault = _fault_for(ctx.rank)
        params = [p for p in model.parameters() if p.requires_grad]

        def tensors() -> list[torch.Tensor]:
            if s.average == "params":
                return [p.data for p in params]
            for p in params:  # a rank that never trained (or an unused parameter) sends zeros
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            return [p.grad for p in params]

        def serve(x: Exchange) -> None:
            log.wait_s += exchange_average(tensors(), x.partner, s.timeout_s, f"exchange {x.xid}")
            log.exchanges += 1
            log.exchange_log.append([log.batches, x.partner, x.xid, x.initiated])
            pairing.finish(x)

        since = 0  # steps since this rank last averaged (as claimer or claimed)

        def sync_point() -> None:
            nonlocal since
            # pick one step early: the exchange happens at a later boundary (protocol.py)
            x = pairing.at_boundary(want=since >= s.sync_every - 1)
            while x is not None:
                serve(x)
                since = 0
                # the picker may line up its next pick at once when K = 1 (it never waits)
                x = pairing.at_boundary(want=s.sync_every == 1) if x.initiated else None

        desc = f"{self.name} {cfg.model.name} x{ctx.world_size}"
        shown, t0 = 0, time.perf_counter()
        with Progress(pool.total, desc, ctx.is_main and not r.quiet) as bar:
            while (item := pool.take()) is not None:
                pos, epoch, idx = item
                log.taken.append([epoch, idx])
                t = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = graph_loss(model, batches[idx], ds.multilabel)
                loss.backward()
                compute = time.perf_counter() - t
                log.batches += 1
                since += 1
                if s.average == "grads":
                    sync_point()
                t = time.perf_counter()
                opt.step()
                compute += time.perf_counter() - t
                if s.average == "params":
                    sync_point()
                slept = straggler.delay_s
                straggler.after_step(compute)
                log.step_times.append(compute + straggler.delay_s - slept)
                pairing.record_step(log.step_times[-1])
                log.losses.append(loss.item())
                if fault is not None and log.batches == fault[0]:
                    _inject(fault[1])
                info = f"loss {log.losses[-1]:.4f} exch {log.exchanges} wait {log.wait_s:.1f}s"
                bar.update(pos + 1 - shown, info)  # the pool's progress, all ranks together
                shown = pos + 1
            while True:  # clean-up (study lines 45-54): finish our pick, serve claims on us
                t = time.perf_counter()
                x = pairing.retire()
                log.wait_s += time.perf_counter() - t
                if x is None:
                    break
                serve(x)
            log.train_s = time.perf_counter() - t0
            if ctx.is_distributed:
                t = time.perf_counter()
                dist.barrier()  # the fast ranks' idle time at the end counts as waiting
                log.wait_s += time.perf_counter() - t
        train_time = time.perf_counter() - t0
        return self._finish(cfg, ds, ctx, model, params, log, train_time, partition_time)

    def _finish(self, cfg, ds, ctx, model, params, log: RankLog, train_time, partition_time):
        """Gather the logs, score both final candidates, keep the better one by validation."""
        logs = comm.gather_to_all(vars(log))
        choice = choose_final_model(model, params, ds, cfg.strategy.timeout_s)
        s = cfg.strategy
        me = logs[0]
        return Outcome(
            train_time_s=max(train_time, *(g["train_s"] for g in logs)),
            step_times=me["step_times"],
            test_step_times=choice.eval_times,
            loss_curve=me["losses"],
            per_worker_batches=[g["batches"] for g in logs],
            val_score=choice.scores["val"],
            test_score=choice.scores["test"],
            partition_time_s=partition_time,
            extra={
                "final_model": choice.name,
                "candidates": choice.candidates,
                "local_scores": [{"val": g["val"], "test": g["test"]} for g in choice.local_scores],
                # how far apart the local models ended: ||local - average|| / ||average|| per rank
                "per_worker_divergence": choice.divergence,
                "per_worker_exchanges": [g["exchanges"] for g in logs],
                "per_worker_wait_s": [g["wait_s"] for g in logs],
                "per_worker_train_s": [g["train_s"] for g in logs],
                "sync_every": s.sync_every,
                "average": s.average,
                "topology": self.topology.name,
                "slowdown": {str(k): v for k, v in s.slowdown.items()},
                "jitter": s.jitter,
                "pool_log": [g["taken"] for g in logs],
                "exchange_log": [g["exchange_log"] for g in logs],
            },
        )


class GossipBipartite(GossipGCN):
    """Study 003 algorithm 5: active ranks pick partners only among passive ranks."""

    name = "gossip-bipartite"
    topology = Bipartite

    @classmethod
    def check_world(cls, cfg: Config, world: int) -> None:
        super().check_world(cfg, world)
        if world < 2:
            raise UsageError(
                "--strategy gossip-bipartite needs at least 2 ranks (an active and "
                "a passive one): pass --workers 2 or more."
            )


def _fault_for(rank: int) -> tuple[int, str] | None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    who, step, mode = spec.split(":")
    return (int(step), mode) if int(who) == rank else None


def _inject(mode: str) -> None:
    if mode == "exit":
        os._exit(0)  # vanish without a word, like a machine that lost power
    while True:  # "stall": alive but never answers again (the agent kills us at the end)
        time.sleep(3600)
