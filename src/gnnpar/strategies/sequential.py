"""Sequential training on one process: the baseline every parallel strategy is measured against.

Regimes: full-batch node classification (Planetoid; study 001), Cluster-GCN subgraph mini-batches
(``--partitions N``; study 003 algorithms 1-2), image mini-batches (ViG; study 000).

    gnnpar train --dataset cora --model gat --strategy sequential
    gnnpar train --dataset synthetic-reddit --scale 0.01 --model sage --partitions 40
    gnnpar train --dataset synthetic-cifar10 --model vig --batch-size 32 --max-steps 20
"""

from __future__ import annotations

import torch

from gnnpar.config import Config
from gnnpar.data.datasets import GraphDataset, ImageDataset
from gnnpar.data.partition import build_partition_batches
from gnnpar.dist import DistContext
from gnnpar.engine import (
    evaluate_graph,
    evaluate_images,
    graph_loss,
    image_batches,
    image_loss,
)
from gnnpar.metrics import Progress, StepTimer
from gnnpar.models import build_model
from gnnpar.strategies.base import Outcome, build_optimizer, seed_everything


def sync(device: torch.device) -> None:
    """Wait for queued accelerator work, so a step's time is the time it took."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Sequential:
    @staticmethod
    def validate_config(cfg: Config) -> None:
        pass

    def run(self, cfg: Config, ds: GraphDataset | ImageDataset, ctx: DistContext) -> Outcome:
        seed_everything(cfg.run.seed)
        model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
        model.to(ctx.device)
        opt = build_optimizer(cfg, model.parameters())
        if isinstance(ds, ImageDataset):
            return self._images(cfg, ds, model, opt, ctx)
        return self._graph(cfg, ds, model, opt, ctx)

    def _graph(self, cfg, ds: GraphDataset, model, opt, ctx) -> Outcome:
        r = cfg.run
        parts = cfg.data.partitions
        partition_time = 0.0
        if parts is not None and parts > 1:
            batches, partition_time = build_partition_batches(cfg, ds)
        else:
            batches = [ds.data]
        if ctx.device.type != "cpu":  # once, in place (on CPU the tensors stay the same objects)
            ds.data.to(ctx.device)
            batches = [b.to(ctx.device) for b in batches]
        timer, losses, eval_times = StepTimer(), [], []
        steps = min(len(batches), r.max_steps or len(batches))
        gen = torch.Generator().manual_seed(r.seed)
        with Progress(r.epochs, f"sequential {cfg.model.name}", not r.quiet) as bar:
            for epoch in range(r.epochs):
                order = torch.randperm(len(batches), generator=gen)[:steps].tolist()
                epoch_loss = 0.0
                for i in order:
                    with timer:
                        opt.zero_grad(set_to_none=True)
                        loss = graph_loss(model, batches[i], ds.multilabel)
                        loss.backward()
                        opt.step()
                        sync(ctx.device)
                    epoch_loss += loss.item()
                losses.append(epoch_loss / steps)
                info = f"loss {losses[-1]:.4f}"
                if r.eval_every and (epoch + 1) % r.eval_every == 0 and epoch + 1 < r.epochs:
                    scores, t = evaluate_graph(model, ds)
                    eval_times.append(t)
                    info += f" val {scores['val']:.3f}"
                bar.update(1, info)
        scores, t = evaluate_graph(model, ds)
        eval_times.append(t)
        return Outcome(
            train_time_s=timer.total,
            step_times=timer.times,
            test_step_times=eval_times,
            loss_curve=losses,
            per_worker_batches=[len(timer.times)],
            val_score=scores["val"],
            test_score=scores["test"],
            partition_time_s=partition_time,
            extra={"train_score": scores["train"]},
        )

    def _images(self, cfg, ds: ImageDataset, model, opt, ctx) -> Outcome:
        r, bs = cfg.run, cfg.strategy.batch_size
        timer, losses = StepTimer(), []
        per_epoch = -(-ds.train_x.size(0) // bs)
        steps = min(per_epoch, r.max_steps or per_epoch)
        with Progress(r.epochs * steps, "sequential vig", not r.quiet) as bar:
            for epoch in range(r.epochs):
                batches = image_batches(ds.train_x, ds.train_y, bs, r.seed + epoch)
                for _, (x, y) in zip(range(steps), batches):
                    with timer:
                        opt.zero_grad(set_to_none=True)
                        loss = image_loss(model, x.to(ctx.device), y.to(ctx.device))
                        loss.backward()
                        opt.step()
                        sync(ctx.device)
                    losses.append(loss.item())
                    bar.update(1, f"loss {losses[-1]:.4f}")
        scores, test_times = evaluate_images(model, ds, bs, r.max_steps)
        return Outcome(
            train_time_s=timer.total,
            step_times=timer.times,
            test_step_times=test_times,
            loss_curve=losses,
            per_worker_batches=[len(timer.times)],
            val_score=scores["val"],
            test_score=scores["test"],
        )
