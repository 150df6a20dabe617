"""Sequential training on one process: the baseline every parallel strategy is measured against.

Regimes: full-batch node classification (Planetoid; study 001), Cluster-GCN subgraph mini-batches
(``--partitions N``; study 003 algorithms 1-2), image mini-batches (ViG; study 000). One source
(:class:`~gnnpar.training.sources.ShuffledBatches` or :class:`~gnnpar.training.sources.ImageBatches`), no sync.

    gnnpar train --dataset cora --model gat --strategy sequential
    gnnpar train --dataset synthetic-reddit --scale 0.01 --model sage --partitions 40
    gnnpar train --dataset synthetic-cifar10 --model vig --batch-size 32 --max-steps 20
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from gnnpar.config.schema import Config
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.strategies.spec import (
    CLUSTER_GCN,
    EVAL_MODE,
    SIM_ONE_RANK,
    STEP_CHECKPOINTS,
    Advice,
    StrategySpec,
    one_process,
    reads,
)

if TYPE_CHECKING:
    from gnnpar.runtime.dist import DistContext
    from gnnpar.training.loop import Plan


def build(cfg: Config, ds, ctx: DistContext, dims: ParallelDims) -> Plan:
    """The plan of the one process."""
    from gnnpar.data.partition import load_partitions
    from gnnpar.models import build_model
    from gnnpar.training.evaluation import evaluate_graph, evaluate_images, full_graph_record
    from gnnpar.training.loop import Final, Plan
    from gnnpar.training.losses import LocalStep, graph_loss, image_loss
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.seeding import seed_everything
    from gnnpar.training.sources import ImageBatches, ShuffledBatches

    r = cfg.run
    seed_everything(r.seed)
    model = build_model(
        cfg.model, ds.num_features, ds.num_classes, ds.multilabel, graph=getattr(ds, "data", None)
    )
    model.to(ctx.device)
    opt = build_optimizer(cfg, model.parameters())
    name = f"sequential {cfg.model.name}"
    if ds.kind == "image":
        bs = cfg.strategy.batch_size
        source = ImageBatches(ds, bs, r.epochs, r.seed, r.max_steps)
        step = LocalStep(model, partial(image_loss, device=ctx.device))

        def finish_images() -> Final:
            scores, times = evaluate_images(model, ds, bs, r.max_steps)
            return Final(scores, times)

        return Plan(name, model, opt, source, step, finish_images, curve="step")
    partition_time = 0.0
    if cfg.data.partitions is not None and cfg.data.partitions > 1:
        graph, partition_time, _ = load_partitions(cfg, ds)
        batches = graph.batches()
    else:
        batches = [ds.data]
    if ctx.device.type != "cpu":  # once, in place (on CPU the tensors stay the same objects)
        ds.data.to(ctx.device)
        batches = [b.to(ctx.device) for b in batches]
    source = ShuffledBatches(batches, r.epochs, r.seed, r.max_steps)
    step = LocalStep(model, partial(graph_loss, multilabel=ds.multilabel))

    def evaluate() -> tuple[dict, list[float]]:
        scores, t = evaluate_graph(model, ds)
        return scores, [t]

    def finish() -> Final:
        scores, t = evaluate_graph(model, ds)
        return Final(scores, [t], evaluation=full_graph_record(cfg.strategy.eval_mode))

    return Plan(
        name,
        model,
        opt,
        source,
        step,
        finish,
        evaluate=evaluate,
        partition_time_s=partition_time,
    )


SPEC = StrategySpec(
    name="sequential",
    help="one process, the baseline",
    advice=Advice(SIM_ONE_RANK),
    degrees=one_process,  # --workers > 1 would train identical copies: an error
    reads={
        **CLUSTER_GCN,
        **reads("batch-size", kinds=("image",)),
        **STEP_CHECKPOINTS,
        **EVAL_MODE,
    },
    build=build,
)
