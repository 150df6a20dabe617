"""Neighbour-sampled data-parallel training (study 002): GraphSAGE / GAT mini-batches under DDP.

Every rank trains on its own neighbour-sampled mini-batches (:mod:`gnnpar.data.sampling`: seeds
first, loss on ``out[:batch_size]``) and ``torch.nn.parallel.DistributedDataParallel`` averages
the gradients. Models and optimiser as table 1: ``sage`` 3 x 256 mean, dropout 0.5; ``gat3``
3 x 16, 1 head, dropout 0.6; Adam lr 5e-3, weight decay 5e-4; fan-outs 25,10,10.

    gnnpar train --dataset cora --model sage --strategy sampled --batch-size 512
    gnnpar train --dataset synthetic-reddit --scale 0.05 --model gat3 --strategy sampled \\
        --workers 4 --loader-workers 2 --batch-size 1024 --fanouts 25,10,10

Equal steps: each epoch's shuffle of the training nodes is cut into equal blocks per rank and the
remainder (< ranks nodes, different each epoch) is dropped (:func:`~gnnpar.data.sampling.
shard_plan`), so every rank runs the same number of all-reduces. Evaluation runs once, at the
end, on rank 0 (exact full-graph inference, :func:`gnnpar.engine.evaluate_graph`, which bounds
memory on big graphs); ``--eval-every`` is not used because an evaluation in the middle would
hold every other rank at the next all-reduce.

Why study 002 deadlocked at 4 GPUs x 2 data workers (section 4.2), and what prevents it here.
The usual culprits, all multiplied by ranks x workers:

1. ``fork`` after threads exist. Linux's default DataLoader start method forks the rank, which
   by then runs gloo/NCCL threads, an OpenMP/MKL pool and a CUDA context. The child inherits
   locks held by threads that do not exist in it (malloc arenas, libgomp's pool, the process
   group's store socket); its first parallel region or allocation may wait forever. Here workers
   start with ``forkserver``: forked from a clean server process that only imported torch and
   the sampler, so they hold no thread, no pool and no process group (workers never call
   collectives, and what they receive is a small picklable plan, not the process state).
2. Oversubscription. Each worker would inherit the rank's thread count: 4 ranks x 2 workers x
   all cores of OpenMP threads spin against each other and the gloo threads, which stalls steps
   until a timeout looks like a hang. Workers run ``torch.set_num_threads(1)``; each rank gets
   cores / local ranks threads (``train.set_threads``); idle OpenMP threads sleep instead of
   spinning (``OMP_WAIT_POLICY=PASSIVE``, set in :mod:`gnnpar`).
3. Memory. Reddit (~6 GB in memory) loaded by 4 ranks, plus copy-on-write faults in forked
   workers, exceeds 16 GB; a worker killed by the OOM killer leaves the rank waiting for a batch
   that never comes. Here the graph is written once per machine to ``/dev/shm`` and every rank
   and worker maps it (``torch.load(mmap=True)``); only mini-batches cross process boundaries.
   The file is unlinked at once (reached through ``/proc/<pid>/fd``), so a killed run leaks
   nothing, and a worker exits when its rank dies (it watches the rank's pid: a forkserver
   worker's parent is the fork server, so DataLoader's own parent check would not notice).
4. Uneven step counts across ranks (a rank with one batch more waits forever in its last
   all-reduce): prevented by the equal-steps plan above.
5. Waits without a deadline: the DataLoader has ``timeout=--timeout`` and the process group the
   same timeout, so a stuck worker or peer ends the run with an error that names it.

Result keys added: ``time_breakdown_s`` (per rank: data_wait, compute, sync seconds summed over
the run), ``max_rank_train_time_s`` (study 002's headline: the longest training time of any rank),
``per_worker_batches``, ``data_wait_share``. ``sync`` is the gradient all-reduce time that backward
did not hide: from the moment the last gradient bucket is handed to the all-reduce to the moment
the last all-reduce completes (it includes waiting for a slower rank).
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from gnnpar import UsageError
from gnnpar.config import Config
from gnnpar.data.datasets import GraphDataset
from gnnpar.data.sampling import (
    CSRGraph,
    SampledBatches,
    build_loader,
    save_shared_graph,
    shard_plan,
)
from gnnpar.dist import DistContext
from gnnpar.engine import evaluate_graph
from gnnpar.metrics import Progress, loss_fn
from gnnpar.models import build_model
from gnnpar.strategies.base import Outcome, Straggler, build_optimizer, seed_everything


class SyncTimer:
    """State of :func:`timed_allreduce`: when the last bucket was handed over and completed."""

    def __init__(self) -> None:
        self.last_call = 0.0
        self.last_done = 0.0

    def exposed(self) -> float:
        return max(0.0, self.last_done - self.last_call)


# No annotations on the arguments: DDP compares them with dist.GradBucket at run time, and
# postponed annotations (strings) fail that check.
def timed_allreduce(state, bucket):  # noqa: ANN001
    """DDP comm hook: the default all-reduce (average), timed (``sync`` in the module docstring)."""
    state.last_call = time.perf_counter()

    def done(fut: torch.futures.Future) -> torch.Tensor:
        state.last_done = time.perf_counter()
        return fut.value()

    return allreduce_hook(None, bucket).then(done)


class Sampled:
    @staticmethod
    def validate_config(cfg: Config) -> None:
        s, m = cfg.strategy, cfg.model
        if m.name == "vig":
            raise UsageError("--strategy sampled trains graph models; use --model sage or gat3.")
        if len(s.fanouts) != m.layers:
            raise UsageError(
                f"--fanouts gives {len(s.fanouts)} fan-outs ({','.join(map(str, s.fanouts))}) but "
                f"--model {m.name} has {m.layers} layers: give one fan-out per layer, "
                f"e.g. --fanouts {','.join(['10'] * m.layers)}."
            )

    def run(self, cfg: Config, ds: GraphDataset, ctx: DistContext) -> Outcome:
        r = cfg.run
        data = ds.data
        train_idx = data.train_mask.nonzero().view(-1)
        if train_idx.numel() < ctx.world_size:
            raise UsageError(
                f"Dataset '{ds.name}' has {train_idx.numel()} training nodes, fewer than the "
                f"{ctx.world_size} ranks: every rank needs at least one. Use fewer --workers."
            )
        seed_everything(r.seed)  # same initial weights on every rank (DDP also broadcasts them)
        t0 = time.perf_counter()
        path, fd = _share_graph(ds, ctx)
        setup_s = time.perf_counter() - t0
        try:
            return self._train(cfg, ds, ctx, path, train_idx, setup_s)
        finally:
            if fd is not None:
                os.close(fd)  # the file is already unlinked: its pages go with the last mapping

    def _train(self, cfg, ds: GraphDataset, ctx, path: str, train_idx, setup_s: float) -> Outcome:
        s, r = cfg.strategy, cfg.run
        per_rank, steps = shard_plan(train_idx.numel(), ctx.world_size, s.batch_size)
        steps = min(steps, r.max_steps or steps)
        batches = SampledBatches(
            path, train_idx, s.fanouts, s.batch_size, ctx.rank, ctx.world_size, r.seed, steps
        )
        loader = build_loader(batches, r.epochs, s.loader_workers, s.timeout_s)
        model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
        model.to(ctx.device)
        sync = SyncTimer()
        net: nn.Module = model
        if ctx.is_distributed:
            cuda = ctx.device.type == "cuda"
            net = DistributedDataParallel(model, device_ids=[ctx.device.index] if cuda else None)
            net.register_comm_hook(sync, timed_allreduce)
        opt = build_optimizer(cfg, net.parameters())
        straggler = Straggler(s.slowdown.get(ctx.rank, 1.0), s.jitter, r.seed + ctx.rank)
        wait_s = compute_s = sync_s = train_s = first_wait_s = 0.0
        step_times: list[float] = []
        losses: list[float] = []
        bar = Progress(r.epochs * steps, f"sampled {cfg.model.name}", ctx.is_main and not r.quiet)
        t0 = time.perf_counter()
        it = iter(loader)  # starts the workers (set-up, not training); one pass for the run
        loader_start_s = time.perf_counter() - t0
        with bar:
            for epoch in range(r.epochs):
                t_epoch = time.perf_counter()
                epoch_loss = 0.0
                for batch in _timed(it, steps, step_times):
                    t1 = time.perf_counter()
                    wait_s += t1 - step_times[-1]
                    if len(step_times) == 1:
                        first_wait_s = t1 - step_times[0]
                    sync.last_call = sync.last_done = 0.0  # a step without a hook adds 0
                    batch = batch.to_data().to(ctx.device)
                    opt.zero_grad(set_to_none=True)
                    out = net(batch.x, batch.edge_index)[: batch.batch_size]
                    loss = loss_fn(out, batch.y, ds.multilabel)
                    loss.backward()
                    opt.step()
                    epoch_loss += loss.item()
                    t2 = time.perf_counter()
                    straggler.after_step(t2 - t1)
                    t3 = time.perf_counter()
                    step_sync = sync.exposed() if ctx.is_distributed else 0.0
                    sync_s += step_sync
                    compute_s += t3 - t1 - step_sync
                    step_times[-1] = t3 - step_times[-1]  # start time -> whole step duration
                    bar.update(1, f"epoch {epoch + 1} loss {loss.item():.4f}")
                train_s += time.perf_counter() - t_epoch
                losses.append(epoch_loss / steps)
        del it, loader  # stops the workers before evaluation
        breakdown = {"data_wait": wait_s, "compute": compute_s, "sync": sync_s}
        gathered = _gather(ctx, (breakdown, train_s, len(step_times), first_wait_s))
        t0 = time.perf_counter()
        # exact full-graph scores; engine.graph_logits bounds memory on big graphs
        # (on the CPU, where the graph is: a big graph need not fit the accelerator)
        scores = evaluate_graph(model.cpu(), ds)[0] if ctx.is_main else {"val": 0.0, "test": 0.0}
        eval_s = time.perf_counter() - t0
        total_wait = sum(b["data_wait"] for b, *_ in gathered)
        total = sum(sum(b.values()) for b, *_ in gathered)
        return Outcome(
            train_time_s=train_s,
            step_times=step_times,
            test_step_times=[eval_s],
            loss_curve=losses,
            per_worker_batches=[n for _, _, n, _ in gathered],
            val_score=scores["val"],
            test_score=scores["test"],
            extra={
                "time_breakdown_s": [b for b, *_ in gathered],
                "max_rank_train_time_s": max(t for _, t, *_ in gathered),
                "rank_train_time_s": [t for _, t, *_ in gathered],
                "data_wait_share": total_wait / total if total else 0.0,
                "train_score": scores.get("train", 0.0),
                "steps_per_epoch": steps,
                "seeds_per_rank": per_rank,
                "loader_workers": s.loader_workers,
                "graph_setup_time_s": setup_s,
                "loader_start_time_s": loader_start_s,
                # part of data_wait: the first batch cannot be prefetched (pipeline fill)
                "first_batch_wait_s": [g[3] for g in gathered],
            },
        )


def _timed(it, steps: int, starts: list[float]):
    """Take ``steps`` batches from ``it``, appending the time each wait for one began."""
    for _ in range(steps):
        starts.append(time.perf_counter())
        yield next(it)


def _gather(ctx: DistContext, item: object) -> list:
    if not ctx.is_distributed:
        return [item]
    out: list = [None] * ctx.world_size
    dist.all_gather_object(out, item)
    return out


def _share_graph(ds: GraphDataset, ctx: DistContext) -> tuple[str, int | None]:
    """Local rank 0 writes CSR + features + labels once per machine; every rank gets a path.

    The file is unlinked as soon as it is written and reached through ``/proc/<pid>/fd/<fd>`` of
    local rank 0 (which keeps it open until the end of the run), so nothing is left behind in
    ``/dev/shm`` however the run ends, SIGKILL included: the memory is freed when the last
    process unmaps it. Returns (path, the fd to close on local rank 0 or None).
    """
    path, fd = None, None
    if ctx.local_rank == 0:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        name = os.path.join(folder, f"gnnpar-sampled-{os.getpid()}-{uuid.uuid4().hex[:8]}.pt")
        d = ds.data
        save_shared_graph(name, CSRGraph.from_edge_index(d.edge_index, ds.num_nodes), d.x, d.y)
        fd = os.open(name, os.O_RDONLY)
        os.unlink(name)
        path = f"/proc/{os.getpid()}/fd/{fd}"
    paths = _gather(ctx, path)
    return paths[ctx.rank - ctx.local_rank], fd  # torchrun numbers a machine's ranks in a row
