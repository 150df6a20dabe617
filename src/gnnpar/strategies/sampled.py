"""Neighbour-sampled data-parallel training (study 002): GraphSAGE / GAT mini-batches under DDP.

Every rank trains on its own neighbour-sampled mini-batches (:mod:`gnnpar.data.sampling`: seeds
first, loss on ``out[:batch_size]``) and ``torch.nn.parallel.DistributedDataParallel`` averages
the gradients. Models and optimiser as table 1: ``sage`` 3 x 256 mean, dropout 0.5; ``gat3``
3 x 16, 1 head, dropout 0.6; Adam lr 5e-3, weight decay 5e-4; fan-outs 25,10,10.

    gnnpar train --dataset cora --model sage --strategy sampled --batch-size 512
    gnnpar train --dataset synthetic-reddit --scale 0.05 --model gat3 --strategy sampled \\
        --workers 4 --loader-workers 2 --batch-size 1024 --fanouts 25,10,10

Equal steps: each epoch's shuffle of the training nodes is cut into equal blocks per rank and the
remainder (< ranks nodes, different each epoch) is dropped (:func:`~gnnpar.data.sampling.loader.
shard_plan`), so every rank runs the same number of all-reduces. Across shards, ``--seeds local``
deals each host's ranks its own shard's training nodes instead (the same plan: :func:`gnnpar.
data.sampling.distributed.local_epoch_seeds`). Evaluation runs once, at the
end, on rank 0: exact full-graph inference (:func:`gnnpar.training.evaluation.evaluate_graph`, which
bounds memory on big graphs) where its hidden states fit the memory the run may use, else the scored
nodes in mini-batches through the training sampler and fan-outs (``--eval-mode``, :func:`gnnpar.
training.evaluation.choose_eval_mode`); ``--eval-every`` is not used because an evaluation in the
middle would hold every other rank at the next all-reduce.

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
   cores / local ranks threads (``train.set_threads``); where several ranks share a host their
   idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, see
   :mod:`gnnpar`; one process alone on the cores spins briefly, ``GOMP_SPINCOUNT=10000``).
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

Result keys (the loop's, :mod:`gnnpar.result`): ``time_breakdown_s`` (per rank: data_wait,
compute, sync seconds summed over the run), ``max_rank_train_time_s`` (study 002's headline: the
longest training time of any rank), ``per_worker_batches``, ``data_wait_share``. ``sync`` is the
gradient all-reduce time that backward did not hide (:class:`gnnpar.training.sync.DDPHooks`).
"""

from __future__ import annotations

import sys
import time
from functools import partial
from typing import TYPE_CHECKING

from gnnpar.config.schema import Config
from gnnpar.errors import UsageError
from gnnpar.models.presets import model_kind
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.strategies.spec import (
    EVAL_MODE,
    SIM_SAMPLED,
    STEP_CHECKPOINTS,
    STEPS_KEYS,
    STRAGGLERS,
    Advice,
    StrategySpec,
    check_stragglers,
    data_parallel,
    reads,
)

if TYPE_CHECKING:
    from gnnpar.data.types import GraphDataset
    from gnnpar.runtime.dist import DistContext
    from gnnpar.training.loop import Plan


def check(cfg: Config, dims: ParallelDims) -> None:
    s, m = cfg.strategy, cfg.model
    if m.name == "vig":
        raise UsageError("--strategy sampled trains graph models; use --model sage or gat3.")
    # a factory's model has the layers it has: its fan-outs set the sample's hops (pyg:NAME's
    # are --layers, like the built-in models')
    if model_kind(m.name) != "factory" and len(s.fanouts) != m.layers:
        raise UsageError(
            f"--fanouts gives {len(s.fanouts)} fan-outs ({','.join(map(str, s.fanouts))}) but "
            f"--model {m.name} has {m.layers} layers: give one fan-out per layer, "
            f"e.g. --fanouts {','.join(['10'] * m.layers)}."
        )
    check_stragglers(cfg, dims)


def defaults(cfg: Config) -> None:
    """Study 002's fan-outs 25,10,10 (10 for every further layer)."""
    s, layers = cfg.strategy, cfg.model.layers
    if s.fanouts is None:
        s.fanouts = [25, 10, 10][:layers] + [10] * max(0, layers - 3)


def step_rows(cfg: Config, ds) -> tuple[int, int]:
    """The memory estimate's step: ``--batch-size`` seed nodes (their sampled neighbours not
    counted) and one message per seed and first-hop fan-out."""
    s = cfg.strategy
    rows = min(s.batch_size, ds.num_nodes)
    return rows, rows * max(1, (s.fanouts or [1])[0])  # the seeds' first hop


def build(cfg: Config, ds: GraphDataset, ctx: DistContext, dims: ParallelDims) -> Plan:
    """This rank's sampled batches (of the whole graph, or of its host's shard across shards),
    its model under DDP, and the final scores.

    Why one function: as every strategy's ``build``, it imports torch inside (the spec stays
    torch-free), and the plan's ``finish`` shares the source, the model and the choice between
    the whole graph and the shards that it makes."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gnnpar.models import build_model
    from gnnpar.runtime.allocator import heap_block_limit, reuse_large_blocks
    from gnnpar.training.evaluation import (
        SAMPLED_SPLITS,
        choose_eval_mode,
        evaluate_graph,
        evaluate_sampled,
        scored_nodes,
    )
    from gnnpar.training.loop import Final, Plan
    from gnnpar.training.losses import LocalStep, seed_logits, seed_loss
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.precision import autocast
    from gnnpar.training.seeding import seed_everything
    from gnnpar.training.sources import SampledSource, ShardSampledSource
    from gnnpar.training.straggler import Straggler
    from gnnpar.training.sync import DDPHooks, NoSync

    s, r = cfg.strategy, cfg.run
    across = bool(ds.info.get("across_shards"))  # each host holds only its shard
    if s.seeds == "local" and not across:
        raise UsageError(
            f"--seeds local deals each host its own shard's training nodes: dataset "
            f"'{ds.name}' is not trained across shards (each host holding only its "
            f"shard-<h>/ of a folder prepared with --shards). Use --seeds global."
        )
    if not across:
        train_idx = ds.data.train_mask.nonzero().view(-1)
        if train_idx.numel() < ctx.world_size:
            raise UsageError(
                f"Dataset '{ds.name}' has {train_idx.numel()} training nodes, fewer than the "
                f"{ctx.world_size} ranks: every rank needs at least one. Use fewer --workers."
            )
    # every step's large tensors from the same heap memory (no page faults); inside a memory
    # limit, only blocks up to a 32nd of it (a heap keeping 512 MiB of freed blocks grew a
    # rank's evaluation to 0.77 GB, against 0.58 GB without, in 0.73 GiB; and papers100m 0.05's
    # steps, 15-10-5, batch 1024, from 0.60 GB beyond the model in the first step to 0.99 GB in
    # the fourth, against 0.51-0.56 GB over six steps with 40 MB blocks: the freed batches and
    # activations fragment the heap, and each step's new layout grows it)
    reuse_large_blocks(heap_block_limit())
    seed_everything(r.seed)  # same initial weights on every rank (DDP also broadcasts them)
    if across:
        if s.loader_workers and ctx.is_main:
            print(
                "gnnpar: training across shards samples in each rank's own process (its "
                "exchanges with the other hosts are collectives; the next batch is made on a "
                f"thread while the model trains): --loader-workers {s.loader_workers} is not used",
                file=sys.stderr,
            )
        source = ShardSampledSource(cfg, ds, ctx)
    else:
        source = SampledSource(cfg, ds, ctx, train_idx)
    model = build_model(
        cfg.model, ds.num_features, ds.num_classes, ds.multilabel, graph=getattr(ds, "data", None)
    )
    model.to(ctx.device)
    sync: NoSync = NoSync()
    net: nn.Module = model
    if ctx.is_distributed:
        sync = DDPHooks()
        cuda = ctx.device.type == "cuda"
        net = DistributedDataParallel(model, device_ids=[ctx.device.index] if cuda else None)
        net.register_comm_hook(None, sync.hook)
    opt = build_optimizer(cfg, net.parameters())
    # rank 0 keeps the graph training sampled from for a sampled final evaluation
    source.keep_graph = not across and ctx.is_main and s.eval_mode != "layerwise"
    source.start()

    def finish() -> Final:  # the loop has closed the source: its workers are stopped
        t0 = time.perf_counter()
        scores = {"val": 0.0, "test": 0.0, "train": 0.0}
        evaluation: dict = {}
        if across:  # every host scores its shard's nodes, sampled (all ranks take part)
            from gnnpar.data.sampling.distributed import evaluate_across

            model.cpu().eval()  # the batches' seeds scored on their trimmed layers
            with autocast(cfg.run.precision, "cpu"):
                scores = evaluate_across(
                    lambda b: seed_logits(model, b.to_data()), source.batches.sampler,
                    s.batch_size, ds.multilabel,
                )  # fmt: skip
            model.train()
            evaluation = {"eval_mode": "sampled", "eval_fanouts": list(s.fanouts)}
            evaluation["eval_batch_size"] = s.batch_size
            return Final(scores, [time.perf_counter() - t0], evaluation=evaluation)
        try:
            if ctx.is_main:  # on the CPU where the graph is
                choice = choose_eval_mode(s.eval_mode, model, ds, s.fanouts, s.batch_size)
                evaluation = choice.record()
                if not r.quiet:
                    print(choice.line(), flush=True)
                with autocast(cfg.run.precision, "cpu"):  # the loop's is the training device's
                    if choice.mode == "sampled":
                        ids = scored_nodes(ds.data, SAMPLED_SPLITS)
                        batches = source.eval_batches(ids, s.fanouts, s.batch_size, r.seed)
                        # under a memory limit the batches are made here: a loader worker
                        # would hold a second sampler and interpreter beside the model's heap
                        workers = 0 if choice.limited else s.loader_workers
                        scores = evaluate_sampled(model.cpu(), ds, batches, workers, s.timeout_s)[0]
                    else:  # exact full-graph scores
                        source.release()  # the sampler's graph first
                        scores = evaluate_graph(model.cpu(), ds)[0]
        finally:
            source.release()
        return Final(scores, [time.perf_counter() - t0], evaluation=evaluation)

    return Plan(
        f"sampled {cfg.model.name}",
        model,
        opt,
        source,
        # the batch's features freed before the backward (the loop holds the batch until then)
        LocalStep(net, partial(seed_loss, multilabel=ds.multilabel, free_features=True)),
        finish,
        sync=sync,
        straggler=Straggler.for_rank(s.slowdown, s.jitter, r.seed, ctx.rank),
        reporter=ctx.is_main,
        extra={
            "steps_per_epoch": source.steps,
            "seeds_per_rank": source.per_rank,
            "loader_workers": source.workers,  # fewer than asked where they did not fit
            "graph_setup_time_s": source.setup_s,
            "seeds": s.seeds,
            # across shards the source says only whether the whole batch is made ahead
            "made_ahead": {True: "batch", False: None}.get(source.ahead, source.ahead),
        },
    )


SPEC = StrategySpec(
    name="sampled",
    help="neighbour-sampled mini-batches under DDP",
    advice=Advice(SIM_SAMPLED, across_shards=True),
    degrees=data_parallel,
    reads={
        **reads("fanouts", "batch-size", "loader-workers"),
        **reads("feature-cache", "seeds", kinds=("graph",)),
        **STRAGGLERS,
        **STEP_CHECKPOINTS,
        **EVAL_MODE,
    },
    build=build,
    check=check,
    defaults=defaults,
    step_rows=step_rows,
    across_shards=True,  # each host samples its own shard, exchanging with the others
    result_keys={
        **STEPS_KEYS,
        "seeds_per_rank": "training nodes per rank per epoch",
        "loader_workers": "--loader-workers",
        "graph_setup_time_s": "time to write the shared graph",
        "seeds": "--seeds: global or local (each host's own training nodes)",
        "made_ahead": "what a thread makes while the model trains (batch, sampling or none)",
    },
)
