"""GPipe pipeline parallelism (Huang et al., NeurIPS 2019) for ViG and GNNs; studies 000 and 001.

Each rank holds one stage (a contiguous run of the model's blocks; stem on the first, readout on
the last); every mini-batch is cut into ``--chunks`` micro-batches that flow through the stages
with torch.distributed.pipelining (ScheduleGPipe, or Schedule1F1B with ``--schedule 1f1b``).
Without ``--balance`` the split is chosen by profiling each block (parallel/pipeline/stages.py).

Graphs (gat, gcn, sage): one step is one full-batch epoch. ``--microbatch exact`` (default)
plans micro-batches of target nodes plus their L-hop subgraphs, so the step's loss and gradient
equal the full-batch ones; ``--microbatch index`` reproduces study 001's contiguous node chunks
that lose the edges between chunks (data/microbatch.py). Images (vig): ``--batch-size`` images
per step, split evenly into the chunks.

    gnnpar train --dataset cora --model gat --strategy pipeline --workers 2 --chunks 4
    gnnpar train --dataset cora --model pyg:GIN --strategy pipeline --workers 2
    gnnpar train --dataset cora --model mymodels:build --split-at prop --strategy pipeline \\
        --workers 2
    gnnpar train --dataset synthetic-cifar10 --model vig --strategy pipeline --workers 2 \\
        --chunks 5 --batch-size 40 --max-steps 20

A user's model (``--model pyg:NAME`` / ``module:function``) is cut into blocks by
:func:`gnnpar.models.adapt.to_block_model` (PyG's BasicGNNs and Sequential, a ``blocks``
attribute, or ``--split-at``); a model it cannot cut trains with ``--stages 1`` only. Its exact
micro-batches cover ``--hops`` or the hops counted from its message-passing layers.

result.json adds: balance (and how it was chosen), gpipe_bound S*M/(M+S-1), the micro-batch
plan with its halo_overhead (nodes computed / nodes in the graph); for a user's model, how it
was cut (model_cut), hops and hops_source, and its batch-statistics layers. The hybrid strategy
(strategies/hybrid.py) is this with ``--replicas`` copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gnnpar.config.schema import Config
from gnnpar.data.registry import kind_of
from gnnpar.errors import UsageError
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.strategies.spec import (
    PIPELINE,
    SIM_PIPELINE,
    STEP_CHECKPOINTS,
    Advice,
    StrategySpec,
    pipelined,
    reads,
)

if TYPE_CHECKING:
    from gnnpar.runtime.dist import DistContext
    from gnnpar.training.loop import Plan


def check(cfg: Config, dims: ParallelDims) -> None:
    """Checks shared by pipeline and hybrid, before anything is launched."""
    from gnnpar.models import BUILDERS  # torch-free

    s, m = cfg.strategy, cfg.model
    if m.name not in BUILDERS:  # a user's model: its blocks are known once built (check_cut)
        if s.stages > 1 and not m.split_at and m.name.startswith("pyg:"):  # or by its class
            from gnnpar.models.adapt import why_not_by_class
            from gnnpar.models.user import pyg_class

            why = why_not_by_class(pyg_class(m.name.removeprefix("pyg:")))
            if why is not None:
                raise UsageError(f"--strategy {s.name} --stages {s.stages}: {why}")
        return check_schedule(cfg)
    blocks = m.layers  # every built-in model has one block per layer (models/__init__.py)
    if s.stages > blocks:
        raise UsageError(
            f"--stages {s.stages} is more than the {blocks} blocks of --model {m.name}; "
            f"use --stages {blocks} or fewer (or more --layers)."
        )
    if s.balance is not None and (len(s.balance) != s.stages or sum(s.balance) != blocks):
        from gnnpar.parallel.pipeline.stages import split_by_cost  # for the example only

        raise UsageError(
            f"--balance {','.join(map(str, s.balance))} must give {s.stages} stage sizes "
            f"(one per --stages) that add up to the model's {blocks} blocks, e.g. "
            f"--balance {','.join(map(str, split_by_cost([1.0] * blocks, s.stages)))}."
        )
    check_schedule(cfg)


def check_schedule(cfg: Config) -> None:
    """The checks that do not depend on the model's blocks."""
    s = cfg.strategy
    if s.schedule == "1f1b" and s.chunks < s.stages:
        raise UsageError(
            f"--schedule 1f1b needs at least as many --chunks as --stages "
            f"(got {s.chunks} < {s.stages}); use more chunks or --schedule gpipe."
        )
    if kind_of(cfg.data.dataset) == "image":
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


def check_cut(cfg: Config, model) -> None:
    """A user's model (:func:`gnnpar.models.adapt.to_block_model`) has blocks enough for
    --stages, and --balance adds up to them; the same checks as :func:`check` for built-ins."""
    s, blocks = cfg.strategy, len(model.blocks)
    what = f"the model {type(model.user_module).__name__}"
    if s.stages > 1 and not model.splittable:
        raise UsageError(f"--strategy {s.name} --stages {s.stages}: {model.why_not_splittable}")
    seen: dict[int, int] = {}
    for i, block in enumerate(model.blocks):
        for p in block.parameters():
            if seen.setdefault(id(p), i) != i and s.stages > 1:
                raise UsageError(
                    f"--strategy {s.name}: blocks {seen[id(p)]} and {i} of {what} ({model.how}) "
                    f"share weights, which no two pipeline stages can; give each block its own."
                )
    if s.stages > blocks:
        raise UsageError(
            f"--stages {s.stages} is more than the {blocks} blocks of {what} ({model.how}); "
            f"use --stages {blocks} or fewer, or cut it at more places (--split-at)."
        )
    if s.balance is not None and (len(s.balance) != s.stages or sum(s.balance) != blocks):
        from gnnpar.parallel.pipeline.stages import split_by_cost  # for the example only

        raise UsageError(
            f"--balance {','.join(map(str, s.balance))} must give {s.stages} stage sizes "
            f"(one per --stages) that add up to the {blocks} blocks of {what} ({model.how}), "
            f"e.g. --balance {','.join(map(str, split_by_cost([1.0] * blocks, s.stages)))}."
        )


def build(cfg: Config, ds, ctx: DistContext, dims: ParallelDims) -> Plan:
    """This rank's stage of its pipeline (and replica, with hybrid's --replicas).

    Why one function: as every strategy's ``build``, it imports torch inside (the spec stays
    torch-free), and the plan's closures (``evaluate``, ``finish``) share the stage, the model
    and the process groups it makes."""
    import sys

    import torch
    import torch.distributed as dist

    from gnnpar.models import build_model
    from gnnpar.models.adapt import batch_statistics, check_same_output, join_where_not_tensors
    from gnnpar.models.user import CHECK_NODES, first_nodes
    from gnnpar.parallel import collectives
    from gnnpar.parallel.pipeline.stages import choose_balance, gpipe_bound
    from gnnpar.training.loop import Final, Plan
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.pipeline_batches import (
        GraphMicroBatches,
        ImageMicroBatches,
        StagePlace,
        receptive_field,
    )
    from gnnpar.training.pipeline_step import PipelineStep
    from gnnpar.training.precision import autocast
    from gnnpar.training.seeding import seed_everything
    from gnnpar.training.sync import NoSync, ReplicaGradSum

    r, s = cfg.run, cfg.strategy
    place = StagePlace.create(dims, ctx.device.type)
    seed_everything(r.seed)
    graph = getattr(ds, "data", None)  # PNA's degrees
    model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel, graph=graph)
    torch.manual_seed(r.seed + 7919 * place.replica)  # copies draw their own dropout
    user = getattr(model, "user_module", None) is not None  # a user's model, cut by adapt.py
    if user:
        join_where_not_tensors(model, *first_nodes(graph, CHECK_NODES))
        check_cut(cfg, model)
    cut_info = {}
    if ds.kind == "image":
        job = ImageMicroBatches(cfg, ds, place)
    else:
        hops, source = receptive_field(cfg.model, model, graph)
        job = GraphMicroBatches(cfg, ds, place, hops)
        cut_info = {"hops": hops, "hops_source": source}
    if user:  # the cut computes what the module's own forward does (a `blocks` convention)
        check_same_output(model, *job.probe())
        spans = batch_statistics(model.user_module)
        cut_info["batch_statistics"] = spans
        if spans and ds.kind != "image" and dist.get_rank() == 0:
            print(
                f"gnnpar: warning: {', '.join(spans)} of the model compute statistics over "
                f"their batch: over micro-batches (halo and padding rows included) its loss "
                f"and gradients differ from the full batch's.",
                file=sys.stderr,
                flush=True,
            )
    with autocast(r.precision, ctx.device):  # profile blocks in the run's arithmetic
        balance, block_times = choose_balance(cfg, model, job)
    if dist.get_rank() == 0 and not r.quiet:
        how = "--balance" if block_times is None else "profiled fwd+bwd s per block: "
        how += " ".join(f"{t:.3g}" for t in block_times or [])
        print(f"{s.name}: blocks per stage {balance} ({how.strip()})", flush=True)
    step = PipelineStep(cfg, model, job, place, balance, ctx.device)
    params = step.parameters()
    opt = build_optimizer(cfg, params)
    evals: list[list[float]] = []  # every evaluation's test-step times, this rank

    def evaluate() -> tuple[dict | None, list[float]]:
        evals.append(step.evaluate(job)[1])
        return None, []

    def finish() -> Final:
        payload, times = step.evaluate(job)
        evals.append(times)
        # every stage's trained weights (replica 0's: the copies are identical), so that
        # each rank ends holding the whole trained model (model.pt, gnnpar.load)
        weights = step.stage_state() if place.replica == 0 else {}
        everyone = collectives.gather_to_all((place.replica, place.last, payload, evals, weights))
        joined = {k: v for e in everyone for k, v in e[4].items()}
        model.load_state_dict(joined)
        lasts = sorted((e for e in everyone if e[1]), key=lambda e: e[0])
        scores = job.scores([e[2] for e in lasts])
        # an evaluation lasts until the slowest stage of replica 0 (which splits it) is done
        mine = [e[3] for e in everyone if e[0] == 0]
        times = [max(t) for call in zip(*mine) for t in zip(*call)]
        return Final(scores, times)

    S, M = s.stages, s.chunks
    return Plan(
        f"{s.name} {cfg.model.name}",
        model,
        opt,
        job,
        step,
        finish,
        sync=ReplicaGradSum(params, place.reduce_group) if place.replicas > 1 else NoSync(),
        evaluate=evaluate if job.eval_each_epoch else None,
        curve="replica-step" if place.replicas > 1 else "step",
        reporter=place.is_reporter,
        replica=place.replica,
        batches_per_step=M,
        partition_time_s=job.plan_time_s,
        extra={
            "stages": S,
            "chunks": M,
            "replicas": place.replicas,
            "schedule": s.schedule,
            "balance": balance,
            "balance_source": "--balance"
            if block_times is None
            else "profiled (fwd+bwd per block)",
            "block_time_s": block_times,
            "gpipe_bound": gpipe_bound(S, M),
            "boundary_dtypes": step.boundary_dtypes,  # activations sent between stages
            **cut_info,
            **({"model_cut": model.how} if user else {}),
            **job.extra(),
        },
    )


SPEC = StrategySpec(
    name="pipeline",
    help="a GPipe pipeline of --stages stages",
    advice=Advice(SIM_PIPELINE, own_plan=True),  # hybrid's too: its own config per shape
    degrees=pipelined,
    reads={**PIPELINE, **reads("batch-size", kinds=("image",)), **STEP_CHECKPOINTS},
    build=build,
    check=check,
    result_keys={
        "stages": "--stages",
        "chunks": "--chunks (micro-batches per step)",
        "replicas": "--replicas (copies of the pipeline)",
        "schedule": "--schedule: gpipe or 1f1b",
        "balance": "blocks per stage",
        "balance_source": "--balance, or profiled (fwd+bwd per block)",
        "block_time_s": "profiled seconds per block (null with --balance)",
        "gpipe_bound": "GPipe's ideal speed-up S*M/(M+S-1)",
        "boundary_dtypes": "dtypes of the activations sent between stages",
        "microbatch": "graphs: --microbatch (exact or index)",
        "hops": "graphs: the receptive field in edges that each exact micro-batch covers",
        "hops_source": "graphs: where hops came from: --hops, the built-in model's rule, or "
        "counted (message-passing layers of a user's model; gnnpar.models.adapt)",
        "model_cut": "a user's model: how it was cut into blocks (gnnpar.models.adapt)",
        "batch_statistics": "a user's model: its layers whose statistics span the batch "
        "(BatchNorm, graph-mode LayerNorm, ...): with them, micro-batches are not exact",
        "halo_overhead": "graphs: nodes computed per step / nodes in the graph (training plan)",
        "halo_duplication": "graphs: nodes computed / distinct nodes of the training plan",
        "eval_halo_overhead": "graphs: halo_overhead of the evaluation plan",
        "plan_train": "graphs: summary of the training micro-batch plan",
        "plan_eval": "graphs: summary of the evaluation micro-batch plan",
        "global_batch_size": "images: replicas x --batch-size",
        "micro_batch_size": "images: --batch-size / --chunks",
    },
)
