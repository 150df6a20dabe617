"""GPipe pipeline parallelism (Huang et al., NeurIPS 2019) for ViG and GNNs; studies 000 and 001.

Each rank holds one stage (a contiguous run of the model's blocks; stem on the first, readout on
the last); every mini-batch is cut into ``--chunks`` micro-batches that flow through the stages
with torch.distributed.pipelining (ScheduleGPipe, or Schedule1F1B with ``--schedule 1f1b``).
Without ``--balance`` the split is chosen by profiling each block (pipe.split_by_cost).

Graphs (gat, gcn, sage): one step is one full-batch epoch. ``--microbatch exact`` (default)
plans micro-batches of target nodes plus their L-hop subgraphs, so the step's loss and gradient
equal the full-batch ones; ``--microbatch index`` reproduces study 001's contiguous node chunks
that lose the edges between chunks (data/microbatch.py). Images (vig): ``--batch-size`` images
per step, split evenly into the chunks.

    gnnpar train --dataset cora --model gat --strategy pipeline --workers 2 --chunks 4
    gnnpar train --dataset synthetic-cifar10 --model vig --strategy pipeline --workers 2 \\
        --chunks 5 --batch-size 40 --max-steps 20

result.json adds: balance (and how it was chosen), gpipe_bound S*M/(M+S-1), the micro-batch
plan with its halo_overhead (nodes computed / nodes in the graph), per-stage step times.
The hybrid strategy (strategies/hybrid.py) is this class with ``--replicas`` copies.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from gnnpar import UsageError
from gnnpar.config import Config
from gnnpar.data.datasets import REGISTRY, GraphDataset, ImageDataset
from gnnpar.dist import DistContext, launched_by_torchrun
from gnnpar.metrics import Progress, StepTimer, summarize
from gnnpar.models import build_model
from gnnpar.pipe import gpipe_bound, profile_blocks, split_by_cost
from gnnpar.strategies import pipeline_jobs as loops
from gnnpar.strategies.base import Outcome, build_optimizer, seed_everything


def ranks_of_run(cfg: Config) -> int:
    """Ranks this run will have: torchrun's WORLD_SIZE when launched by it, else --workers."""
    if launched_by_torchrun():
        return int(os.environ["WORLD_SIZE"])
    return cfg.strategy.workers


def check_pipeline(cfg: Config, replicas: int) -> None:
    """Checks shared by pipeline and hybrid, before anything is launched."""
    s, m = cfg.strategy, cfg.model
    blocks = m.layers  # every gnnpar model has one block per layer (models/__init__.py)
    if s.stages > blocks:
        raise UsageError(
            f"--stages {s.stages} is more than the {blocks} blocks of --model {m.name}; "
            f"use --stages {blocks} or fewer (or more --layers)."
        )
    if s.balance is not None:
        if len(s.balance) != s.stages or sum(s.balance) != blocks:
            raise UsageError(
                f"--balance {','.join(map(str, s.balance))} must give {s.stages} stage sizes "
                f"(one per --stages) that add up to the model's {blocks} blocks, e.g. "
                f"--balance {','.join(map(str, split_by_cost([1.0] * blocks, s.stages)))}."
            )
    if s.schedule == "1f1b" and s.chunks < s.stages:
        raise UsageError(
            f"--schedule 1f1b needs at least as many --chunks as --stages "
            f"(got {s.chunks} < {s.stages}); use more chunks or --schedule gpipe."
        )
    if REGISTRY[cfg.data.dataset].kind == "image":
        if s.chunks > s.batch_size:
            raise UsageError(
                f"--chunks {s.chunks} is more than the {s.batch_size} images of a mini-batch "
                f"(--batch-size); use fewer chunks or a larger batch."
            )
        if s.batch_size % s.chunks:
            raise UsageError(
                f"--batch-size {s.batch_size} must be a multiple of --chunks {s.chunks}: the "
                f"pipeline needs equal micro-batches (static shapes)."
            )
    ranks = ranks_of_run(cfg)
    if replicas * s.stages != ranks:
        what = f"{replicas} replicas x {s.stages} stages" if replicas > 1 else f"{s.stages} stages"
        raise UsageError(
            f"--strategy {s.name} with {what} needs {replicas * s.stages} ranks, but the run "
            f"has {ranks}; pass --workers {replicas * s.stages}."
        )


class Pipeline:
    name = "pipeline"

    @staticmethod
    def validate_config(cfg: Config) -> None:
        if cfg.strategy.replicas != 1:
            raise UsageError(
                "--replicas is for --strategy hybrid (copies of the pipeline); "
                "--strategy pipeline is one copy."
            )
        check_pipeline(cfg, 1)

    def replicas(self, cfg: Config) -> int:
        return 1

    def run(self, cfg: Config, ds: GraphDataset | ImageDataset, ctx: DistContext) -> Outcome:
        R, S = self.replicas(cfg), cfg.strategy.stages
        if ctx.world_size != R * S:
            raise UsageError(f"{R} x {S} pipeline stages need {R * S} ranks, got {ctx.world_size}.")
        mesh = loops.Mesh.create(R, S, ctx.rank, cfg.strategy.timeout_s)
        seed_everything(cfg.run.seed)
        model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
        torch.manual_seed(cfg.run.seed + 7919 * mesh.replica)  # replicas draw their own dropout
        if isinstance(ds, ImageDataset):
            job = loops.ImageJob(cfg, ds, mesh)
        else:
            job = loops.GraphJob(cfg, ds, mesh)
        balance, block_times = self.choose_balance(cfg, model, job)
        runner = loops.StageRunner(cfg, model, job, mesh, balance, ctx.device)
        opt = build_optimizer(cfg, runner.parameters())
        return self.train(cfg, job, runner, opt, mesh, balance, block_times)

    def choose_balance(self, cfg: Config, model, job) -> tuple[list[int], list[float] | None]:
        """--balance, or rank 0 profiles each block on a real micro-batch and tells the rest."""
        S = cfg.strategy.stages
        if cfg.strategy.balance is not None:
            return list(cfg.strategy.balance), None
        box: list = [None, None]
        if dist.get_rank() == 0:  # Mesh.create made a group even for one process
            x0, ei0 = job.probe()
            times = profile_blocks(model, x0, ei0)
            box = [split_by_cost(times, S), times]
        dist.broadcast_object_list(box, src=0)
        return box[0], box[1]

    def train(self, cfg, job, runner, opt, mesh, balance, block_times) -> Outcome:
        r = cfg.run
        timer, eval_times, losses = StepTimer(), [], []
        show = mesh.is_reporter and not r.quiet
        if mesh.rank == 0 and not r.quiet:
            how = "--balance" if block_times is None else "profiled fwd+bwd s per block: "
            how += " ".join(f"{t:.3g}" for t in block_times or [])
            print(f"{self.name}: blocks per stage {balance} ({how.strip()})", flush=True)
        total = r.epochs * job.steps_per_epoch
        with Progress(total, f"{self.name} {cfg.model.name}", show) as bar:
            for epoch in range(r.epochs):
                for batch in job.train_batches(epoch):
                    with timer:
                        opt.zero_grad(set_to_none=True)
                        step_losses = runner.train_step(batch)
                        mesh.reduce_grads(runner.parameters())
                        opt.step()
                    if runner.last:
                        losses.append(sum(float(v.detach()) for v in step_losses) * batch.own_scale)
                    bar.update(1, f"loss {losses[-1]:.4f}" if losses else "")
                if job.eval_each_epoch and r.eval_every and (epoch + 1) % r.eval_every == 0:
                    if epoch + 1 < r.epochs:
                        eval_times += runner.evaluate(job)[1]
        final, times = runner.evaluate(job)
        eval_times += times
        return self.outcome(
            cfg, job, runner, mesh, balance, block_times, timer, eval_times, losses, final
        )

    def outcome(
        self, cfg, job, runner, mesh, balance, block_times, timer, eval_times, losses, final
    ) -> Outcome:
        mine = {
            "rank": mesh.rank,
            "replica": mesh.replica,
            "stage": mesh.stage,
            "steps": timer.times,
            "evals": eval_times,
            "losses": losses if runner.last else None,
            "final": final if runner.last else None,
            "micro_batches": len(timer.times) * cfg.strategy.chunks,
        }
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        # A pipeline step ends when its slowest stage does: per step, the max over ranks.
        steps = [max(t) for t in zip(*(e["steps"] for e in everyone))]
        # Evaluation batches are split over replicas: report replica 0's pipeline.
        evals = [max(t) for t in zip(*(e["evals"] for e in everyone if e["replica"] == 0))]
        lasts = sorted((e for e in everyone if e["final"] is not None), key=lambda e: e["replica"])
        scores = job.scores([e["final"] for e in lasts])
        curve: list[float] | dict[str, list[float]] = lasts[0]["losses"]
        if mesh.replicas > 1:
            curve = {f"replica{e['replica']}": e["losses"] for e in lasts}
        S, M = cfg.strategy.stages, cfg.strategy.chunks
        extra = {
            "stages": S,
            "chunks": M,
            "replicas": mesh.replicas,
            "schedule": cfg.strategy.schedule,
            "balance": balance,
            "balance_source": "--balance"
            if block_times is None
            else "profiled (fwd+bwd per block)",
            "block_time_s": block_times,
            "gpipe_bound": gpipe_bound(S, M),
            "stage_step_time_s": [summarize(e["steps"]) for e in everyone],
            "step_times_s": steps,  # every step, in order (the first includes the warm-up)
            "train_score": scores.get("train"),
            **job.extra(),
        }
        return Outcome(
            train_time_s=sum(steps),
            step_times=steps,
            test_step_times=evals,
            loss_curve=curve,
            per_worker_batches=[e["micro_batches"] for e in everyone],
            val_score=scores["val"],
            test_score=scores["test"],
            partition_time_s=job.plan_time_s,
            extra=extra,
        )
