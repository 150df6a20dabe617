"""What a pipeline step feeds and who talks to whom: the pieces behind pipeline.py and hybrid.py.

* :class:`Mesh`: the 2-D process mesh replica x stage (rank = replica * S + stage). Stages of one
  replica form a pipeline group; the same stage of every replica forms a gradient-reduce group
  (study 000 figure 2). One replica: the world group, nothing to reduce.
* :class:`GraphJob`: full-batch node classification; the training step's micro-batches come
  from a plan over the training nodes, evaluation's from a plan over all nodes
  (data/microbatch.py). :class:`ImageJob`: ViG mini-batches, split evenly into chunks.
* :class:`StageRunner`: this rank's stage, once with the training shapes (schedule with loss,
  backward) and once with the evaluation shapes (forward-only GPipe), sharing the parameters.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from gnnpar import UsageError
from gnnpar.config import Config
from gnnpar.data.datasets import GraphDataset, ImageDataset
from gnnpar.data.microbatch import MicroBatchPlan, build_plan, receptive_hops
from gnnpar.engine import image_batches
from gnnpar.metrics import score
from gnnpar.pipe import (
    StageModule,
    boundary_shapes,
    bounds,
    build_stage,
    make_schedule,
    run_schedule,
    summed_loss,
)


@dataclass
class Mesh:
    replicas: int
    stages: int
    rank: int
    pipe_group: dist.ProcessGroup | None = None  # None: the world group
    reduce_group: dist.ProcessGroup | None = None

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def is_reporter(self) -> bool:
        """Replica 0's last stage: it sees the losses, so it shows the progress bar."""
        return self.replica == 0 and self.stage == self.stages - 1

    @classmethod
    def create(cls, replicas: int, stages: int, rank: int, timeout_s: float) -> Mesh:
        if not dist.is_initialized():  # one process (--stages 1): pipelining still wants a group
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        mesh = cls(replicas, stages, rank)
        if replicas == 1:
            return mesh
        timeout = datetime.timedelta(seconds=timeout_s)
        # Every rank creates every group, in the same order (new_group is collective).
        for r in range(replicas):
            g = dist.new_group([r * stages + s for s in range(stages)], timeout=timeout)
            if r == mesh.replica:
                mesh.pipe_group = g
        for s in range(stages):
            g = dist.new_group([r * stages + s for r in range(replicas)], timeout=timeout)
            if s == mesh.stage:
                mesh.reduce_group = g
        return mesh

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum this stage's gradients over the replicas (losses are already scaled globally)."""
        if self.replicas == 1 or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.reduce_group)
        for p, g in zip(params, _unflatten_dense_tensors(flat, grads)):
            p.grad = g


@dataclass
class Batch:
    x: torch.Tensor | None  # whole step's input (first stage only)
    target: torch.Tensor | None  # whole step's targets (last stage only)
    own_scale: float  # summed micro-batch losses * own_scale = this replica's own mean loss


class GraphJob:
    """Full-batch node classification: one step per epoch."""

    eval_each_epoch = True
    steps_per_epoch = 1

    def __init__(self, cfg: Config, ds: GraphDataset, mesh: Mesh) -> None:
        self.ds, self.mesh, R, M = ds, mesh, mesh.replicas, cfg.strategy.chunks
        self.eval_each_epoch = R == 1  # hybrid: evaluation is split over replicas, done once
        data, n = ds.data, ds.num_nodes
        hops = receptive_hops(cfg.model.name, cfg.model.layers)
        mode, seed = cfg.strategy.microbatch, cfg.run.seed
        t0 = time.perf_counter()
        train = data.train_mask.nonzero().view(-1)
        full_train = build_plan(
            data.edge_index, n, train, R * M, hops, mode, seed, "training nodes"
        )
        full_eval = build_plan(
            data.edge_index, n, torch.arange(n), R * M, hops, mode, seed, "nodes"
        )
        self.plan_time_s = time.perf_counter() - t0
        self.plans = (full_train, full_eval)
        self.train_plan = self._mine(full_train, M)
        self.eval_plan = self._mine(full_eval, M)
        self.denominator = float(train.numel())  # the loss is the mean over ALL training nodes
        own = sum(int(b.out_nodes.numel()) for b in self.train_plan.batches)
        first, last = mesh.stage == 0, mesh.stage == mesh.stages - 1
        self.batch = Batch(
            self.train_plan.features(data.x) if first else None,
            self.train_plan.targets(data.y) if last else None,
            self.denominator / max(own, 1),
        )
        self.eval_x = self.eval_plan.features(data.x) if first else None
        self.train_graphs = self.train_plan.edge_indices()
        self.eval_graphs = self.eval_plan.edge_indices()

    def _mine(self, plan: MicroBatchPlan, chunks: int) -> MicroBatchPlan:
        r = self.mesh.replica
        part = plan.batches[r * chunks : (r + 1) * chunks]
        return MicroBatchPlan(part, plan.size, plan.num_nodes, plan.mode, plan.hops)

    def probe(self, eval_plan: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.eval_plan if eval_plan else self.train_plan
        first = MicroBatchPlan(plan.batches[:1], plan.size, plan.num_nodes, plan.mode, plan.hops)
        return first.features(self.ds.data.x), plan.batches[0].edge_index

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        yield self.batch

    def eval_batches(self) -> Iterator[tuple[bool, torch.Tensor | None, object]]:
        yield True, self.eval_x, None  # (timed as a test step, input, context for collect)

    def start_collect(self) -> None:
        self._outs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def collect(self, out: torch.Tensor, context: object) -> None:
        self._outs.append(self.eval_plan.gather(out))

    def payload(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.cat([i for i, _ in self._outs])
        return ids, torch.cat([o for _, o in self._outs])

    def scores(self, payloads: list) -> dict[str, float]:
        data = self.ds.data
        out = torch.zeros(data.num_nodes, self.ds.num_classes)
        for ids, rows in payloads:
            out[ids] = rows.float()
        return {
            split: score(
                out[data[f"{split}_mask"]], data.y[data[f"{split}_mask"]], self.ds.multilabel
            )
            for split in ("train", "val", "test")
        }

    def extra(self) -> dict:
        train, ev = self.plans
        unique = int(torch.cat([b.nodes for b in train.batches]).unique().numel())
        return {
            "microbatch": train.mode,
            "halo_overhead": train.halo_overhead,
            "halo_duplication": train.nodes_computed / max(unique, 1),
            "eval_halo_overhead": ev.halo_overhead,
            "plan_train": train.summary(),
            "plan_eval": ev.summary(),
        }


class ImageJob:
    """ViG mini-batches: each replica takes its own --batch-size images of every global batch."""

    eval_each_epoch = False  # as the sequential image trainer: evaluate once at the end

    def __init__(self, cfg: Config, ds: ImageDataset, mesh: Mesh) -> None:
        self.ds, self.mesh, self.cfg = ds, mesh, cfg
        R, B = mesh.replicas, cfg.strategy.batch_size
        self.B, self.M, self.global_batch = B, cfg.strategy.chunks, R * B
        full = ds.train_x.size(0) // self.global_batch
        if full < 1:
            raise UsageError(
                f"--batch-size {B} x {R} replicas is more than the {ds.train_x.size(0)} "
                f"training images; use a smaller --batch-size."
            )
        self.steps_per_epoch = min(full, cfg.run.max_steps or full)
        self.denominator = float(self.global_batch)
        self.plan_time_s = 0.0
        self.train_graphs = self.eval_graphs = None
        self.first, self.last = mesh.stage == 0, mesh.stage == mesh.stages - 1

    def probe(self, eval_plan: bool = False) -> tuple[torch.Tensor, None]:
        return self.ds.train_x[: self.B // self.M], None

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        r, B, seed = self.mesh.replica, self.B, self.cfg.run.seed + epoch
        batches = image_batches(self.ds.train_x, self.ds.train_y, self.global_batch, seed)
        for _, (x, y) in zip(range(self.steps_per_epoch), batches):
            mine = slice(r * B, (r + 1) * B)
            yield Batch(
                x[mine] if self.first else None,
                y[mine] if self.last else None,
                float(self.mesh.replicas),
            )

    def eval_batches(self) -> Iterator[tuple[bool, torch.Tensor | None, object]]:
        cap = self.cfg.run.max_steps
        for split in ("val", "test"):
            x, y = getattr(self.ds, f"{split}_x"), getattr(self.ds, f"{split}_y")
            for i, (bx, by) in enumerate(image_batches(x, y, self.B, None)):
                if cap is not None and i >= cap:
                    break
                if i % self.mesh.replicas != self.mesh.replica:
                    continue
                pad = self.B - bx.size(0)  # static shapes: pad the last batch, drop its rows
                if pad:
                    bx = torch.cat([bx, bx.new_zeros(pad, *bx.shape[1:])])
                yield split == "test", bx if self.first else None, (split, by)

    def start_collect(self) -> None:
        self._counts = {"val": [0, 0], "test": [0, 0]}

    def collect(self, out: torch.Tensor, context: object) -> None:
        split, y = context
        pred = out[: y.numel()].argmax(-1)
        self._counts[split][0] += int((pred == y).sum())
        self._counts[split][1] += int(y.numel())

    def payload(self) -> dict:
        return self._counts

    def scores(self, payloads: list) -> dict[str, float]:
        out = {}
        for split in ("val", "test"):
            correct = sum(p[split][0] for p in payloads)
            seen = sum(p[split][1] for p in payloads)
            out[split] = correct / max(seen, 1)
        return out

    def extra(self) -> dict:
        return {"global_batch_size": self.global_batch, "micro_batch_size": self.B // self.M}


class StageRunner:
    """This rank's stage for training (loss + backward) and evaluation (forward only)."""

    def __init__(self, cfg: Config, model, job, mesh: Mesh, balance: list[int], device) -> None:
        S, M, idx = mesh.stages, cfg.strategy.chunks, mesh.stage
        self.first, self.last, self.M, self.model = idx == 0, idx == S - 1, M, model
        lo, hi = bounds(balance)[idx]
        loss = summed_loss(job.denominator, job.ds.multilabel)
        self.train_sched, self.train_mod = self._stage(
            model, job, mesh, balance, lo, hi, job.train_graphs, False, device, loss, cfg
        )
        self.eval_sched, _ = self._stage(
            model, job, mesh, balance, lo, hi, job.eval_graphs, True, device, None, cfg
        )

    def _stage(self, model, job, mesh, balance, lo, hi, graphs, for_eval, device, loss, cfg):
        x0, ei0 = job.probe(for_eval)
        shapes = boundary_shapes(model, x0, ei0, balance)
        idx = mesh.stage
        module = StageModule(model, lo, hi, self.first, self.last, graphs)
        stage = build_stage(
            module,
            idx,
            mesh.stages,
            shapes[idx],
            shapes[idx + 1],
            x0.dtype,
            device,
            mesh.pipe_group,
        )
        return make_schedule(stage, self.M, loss, cfg.strategy.schedule), module

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.train_mod.parameters() if p.requires_grad]

    def train_step(self, batch: Batch) -> list:
        losses: list = []
        run_schedule(self.train_sched, self.first, self.last, self.M, batch.x, batch.target, losses)
        return losses

    @torch.no_grad()
    def evaluate(self, job) -> tuple[object, list[float]]:
        """Forward every evaluation batch through the pipeline; the last stage collects."""
        self.model.eval()
        job.start_collect()
        times = []
        for timed, x, context in job.eval_batches():
            t0 = time.perf_counter()
            out = run_schedule(self.eval_sched, self.first, self.last, self.M, x)
            if timed:
                times.append(time.perf_counter() - t0)
            if self.last:
                job.collect(out, context)
        self.model.train()
        return (job.payload() if self.last else None), times
