"""Pipeline micro-batches: the sources of the pipeline and hybrid strategies.

* :class:`GraphMicroBatches`: full-batch node classification, one step per epoch; the step's
  micro-batches come from a plan over the training nodes, evaluation's from a plan over all
  nodes (:mod:`gnnpar.data.microbatch`). With R copies of the pipeline each takes its own R-th.
* :class:`ImageMicroBatches`: ViG mini-batches; each copy takes its own ``--batch-size`` images
  of every global batch, split evenly into ``--chunks``.

Each yields, per step, a :class:`Batch`: the whole step's input (first stage only), targets
(last stage only) and the scale that turns the summed micro-batch losses into this copy's own
mean loss. Where a rank sits in the mesh is a :class:`StagePlace`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gnnpar.config.schema import Config
from gnnpar.data.microbatch import MicroBatchPlan, build_plan, receptive_hops
from gnnpar.data.types import GraphDataset, ImageDataset
from gnnpar.errors import UsageError
from gnnpar.training.metrics import score
from gnnpar.training.sources import Resumable, image_batches


@dataclass(frozen=True)
class StagePlace:
    """This rank's place in the (replicas x stages) mesh and the groups it talks in."""

    replicas: int
    stages: int
    replica: int
    stage: int
    pipe_group: dist.ProcessGroup | None = None  # this copy's stages
    reduce_group: dist.ProcessGroup | None = None  # this stage in every copy

    @classmethod
    def create(cls, dims, device_type: str) -> StagePlace:
        """This rank's place in the (dp, pp) DeviceMesh of ``dims``. One process (--stages 1):
        pipelining still wants a process group, so a private one-rank group is made."""
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return cls.from_mesh(dims.build_mesh(device_type))

    @classmethod
    def from_mesh(cls, mesh) -> StagePlace:
        """From a DeviceMesh with dimensions ("dp", "pp") (:meth:`ParallelDims.build_mesh`)."""
        replica, stage = mesh.get_coordinate()
        return cls(
            mesh.size(0), mesh.size(1), replica, stage, mesh.get_group("pp"), mesh.get_group("dp")
        )

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def is_reporter(self) -> bool:
        """Replica 0's last stage: it sees the losses, so it shows the progress bar."""
        return self.replica == 0 and self.last


@dataclass
class Batch:
    x: torch.Tensor | None  # whole step's input (first stage only)
    target: torch.Tensor | None  # whole step's targets (last stage only)
    own_scale: float  # summed micro-batch losses * own_scale = this replica's own mean loss


def receptive_field(mcfg, model, graph=None) -> tuple[int, str]:
    """The hops an exact micro-batch must cover, and where that number came from: ``--hops``;
    a built-in model's rule (:func:`~gnnpar.data.microbatch.receptive_hops`); or, for a user's
    model, its message-passing layers counted, and its propagate calls in one forward on
    ``graph``'s first nodes where given (:func:`~gnnpar.models.adapt.message_passing_hops`)."""
    if mcfg.hops is not None:
        return int(mcfg.hops), "--hops"
    user = getattr(model, "user_module", None)
    if user is None:
        return receptive_hops(mcfg.name, mcfg.layers), "built-in model"
    from gnnpar.models.adapt import message_passing_hops
    from gnnpar.models.user import CHECK_NODES, first_nodes

    probe = (None, None) if graph is None else first_nodes(graph, CHECK_NODES)
    return message_passing_hops(user, *probe), "counted (message-passing layers of the model)"


class GraphMicroBatches(Resumable):
    """Full-batch node classification: one step per epoch."""

    eval_each_epoch = True
    steps_per_epoch = 1

    def __init__(
        self, cfg: Config, ds: GraphDataset, mesh: StagePlace, hops: int | None = None
    ) -> None:
        """``hops``: the receptive field the exact plan covers (:func:`receptive_field`);
        None: the built-in model's."""
        self.ds, self.mesh, R, M = ds, mesh, mesh.replicas, cfg.strategy.chunks
        self.eval_each_epoch = R == 1  # hybrid: evaluation is split over replicas, done once
        data, n = ds.data, ds.num_nodes
        if hops is None:
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
        self.total_steps = cfg.run.epochs
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

    def epoch(self, epoch: int) -> Iterator[Batch]:
        return self._counted(iter([self.batch]))

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


class ImageMicroBatches(Resumable):
    """ViG mini-batches: each replica takes its own --batch-size images of every global batch."""

    eval_each_epoch = False  # as the sequential image trainer: evaluate once at the end

    def __init__(self, cfg: Config, ds: ImageDataset, mesh: StagePlace) -> None:
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
        self.total_steps = cfg.run.epochs * self.steps_per_epoch
        self.denominator = float(self.global_batch)
        self.plan_time_s = 0.0
        self.train_graphs = self.eval_graphs = None
        self.first, self.last = mesh.stage == 0, mesh.stage == mesh.stages - 1

    def probe(self, eval_plan: bool = False) -> tuple[torch.Tensor, None]:
        return self.ds.train_x[: self.B // self.M], None

    def epoch(self, epoch: int) -> Iterator[Batch]:
        r, B, seed = self.mesh.replica, self.B, self.cfg.run.seed + epoch
        batches = image_batches(self.ds.train_x, self.ds.train_y, self.global_batch, seed)
        mine = slice(r * B, (r + 1) * B)
        for _, (x, y) in self._counted(zip(range(self.steps_per_epoch), batches)):
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
