"""Pipeline stages: each stage's forward and backward per micro-batch for graph models, and
ViG's per-block costs per image composed into every pipeline shape."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from typing import Any

import torch

from gnnpar.advise.profile.core import REPEATS, Profile, flags_for, mean_time, reference
from gnnpar.advise.profile.memory import rank_estimate
from gnnpar.configure import build_config
from gnnpar.models import build_model
from gnnpar.parallel.pipeline.stages import PROFILE_IMAGES, bounds, profile_blocks, split_by_cost
from gnnpar.training.optim import build_optimizer
from gnnpar.training.pipeline_batches import GraphMicroBatches, StagePlace
from gnnpar.training.seeding import seed_everything


def profile_pipeline(
    base: dict,
    ds,
    shapes: Iterable[tuple[int, int, int]],
    prof: Profile,
    plans: dict[tuple[int, int, int], str] | None = None,
):
    """Each stage's forward and backward per micro-batch (every stage on this process, one at
    a time), the activation bytes at each cut, the optimizer step per stage; each shape
    (replicas, stages, chunks) configured as the strategy ``plans`` names for it (else the
    reference's: pipeline, or hybrid with copies)."""

    plans = plans or {}
    for replicas, stages, chunks in sorted(set(shapes)):
        strategy = plans.get((replicas, stages, chunks)) or reference("pipeline", replicas)
        extra = {"replicas": replicas} if replicas > 1 else {}
        flags = flags_for(base, strategy, stages=stages, chunks=chunks, **extra)
        flags["workers"] = replicas * stages
        cfg = build_config(None, flags)
        seed_everything(cfg.run.seed)
        model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
        job = GraphMicroBatches(cfg, ds, StagePlace(replicas, stages, 0, 0))
        x0, ei0 = job.probe()
        balance = cfg.strategy.balance or split_by_cost(profile_blocks(model, x0, ei0), stages)
        plan = job.train_plan
        fwd = [[0.0] * chunks for _ in range(stages)]
        bwd = [[0.0] * chunks for _ in range(stages)]
        act: list[float] = [0.0] * (stages - 1)
        for m in range(chunks):
            one = type(plan)(plan.batches[m : m + 1], plan.size, plan.num_nodes, plan.mode, 1)
            x, edge_index = one.features(ds.data.x), plan.batches[m].edge_index
            for s, (lo, hi) in enumerate(bounds(balance)):
                f, b, x = _stage_times(model, lo, hi, s == 0, s == stages - 1, x, edge_index)
                fwd[s][m], bwd[s][m] = f, b
                if s < stages - 1:
                    act[s] = float(x.numel() * x.element_size())
        opt = build_optimizer(cfg, model.parameters())
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt_s = mean_time(opt.step)
        counts = [0] * stages
        for s, (lo, hi) in enumerate(bounds(balance)):
            mods = [*model.blocks[lo:hi]] + ([model.stem] if s == 0 else [])
            mods += [model.head] if s == stages - 1 else []
            counts[s] = sum(p.numel() for mod in mods for p in mod.parameters())
        total = max(sum(counts), 1)
        prof.pipeline[f"{replicas}x{stages}x{chunks}"] = {
            "balance": list(balance),
            "fwd_s": fwd,
            "bwd_s": bwd,
            "act_bytes": act,
            "opt_s": [opt_s * c / total for c in counts],
            "grad_bytes": [4.0 * c for c in counts],
        }
        prof.memory[f"pipeline{replicas}x{stages}x{chunks}"] = rank_estimate(cfg, ds)


def profile_images(
    base: dict,
    ds,
    shapes: Iterable[tuple[int, int, int]],
    prof: Profile,
    plans: dict[tuple[int, int, int], str] | None = None,
):
    """ViG (study 000): the forward and the backward of every block (the stem in the first,
    the readout in the last) per image, from which every batch kind is composed.

    A ViG block treats every image on its own (a kNN graph per image, the rest per pixel, no
    batch statistics), so its time grows with the images it is given; at study 000's batch
    (1000 images) a step takes minutes here (BENCHMARKS.md), so each block is timed on at most
    :data:`~gnnpar.parallel.pipeline.stages.PROFILE_IMAGES` images (what ``train`` profiles
    its balance on) and scaled per image: ``m`` images cost ``m / p`` times the probe of ``p``.
    A batch or micro-batch of fewer images is timed at its own size (fixed costs per call weigh
    more there). Each timing: :func:`_stage_times` (mean of several after a warm-up).

    What a step then costs (``prof.images``; composed here for :func:`gnnpar.advise.predict.simulate`):

    * sequential, ``B`` images: the blocks' forward + backward per image x ``B``, plus the
      optimizer step (``full_step_s``; a short last batch: :func:`image_step_s`);
    * a pipeline stage, per micro-batch of ``B / M`` images: its blocks' forward (backward) per
      image x ``B / M``; it sends its last block's output, bytes per image x ``B / M``; its
      optimizer step is the model's in proportion to its parameters; hybrid all-reduces its
      gradients (4 bytes a parameter) with the same stage of the other copies;
    * steps per epoch (:func:`gnnpar.advise.predict.image_steps`): sequential
      ``ceil(images / B)``, pipeline and hybrid ``floor(images / (R B))``, at most
      ``--max-steps``; an epoch is their sum, which the event simulation adds up.
    """

    cfg = build_config(None, flags_for(base, reference("full")))
    seed_everything(cfg.run.seed)
    model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
    blocks, batch = len(model.blocks), cfg.strategy.batch_size
    shapes = sorted(set(shapes))
    sizes = {batch} | {batch // m for _, _, m in shapes}
    most = min(PROFILE_IMAGES, int(ds.train_x.size(0)))
    probes: dict[str, dict[str, list[float]]] = {}
    act: list[float] = []
    for p in sorted({max(1, min(n, most)) for n in sizes}):
        x = ds.train_x[:p]
        fwd, bwd, act = [], [], []  # act: the largest probe's (the last one taken)
        for i in range(blocks):
            f, b, x = _stage_times(model, i, i + 1, i == 0, i == blocks - 1, x, None)
            fwd.append(f / p)
            bwd.append(b / p)
            act.append(float(x.numel() * x.element_size()) / p)
        probes[str(p)] = {"fwd_s": fwd, "bwd_s": bwd}
    counts = [sum(p.numel() for p in block.parameters()) for block in model.blocks]
    counts[0] += sum(p.numel() for p in model.stem.parameters())
    counts[-1] += sum(p.numel() for p in model.head.parameters())
    opt = build_optimizer(cfg, model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt_s = mean_time(opt.step)
    prof.images = {
        "probes": probes,  # str(images timed) -> per block, seconds per image
        "act_bytes_per_image": act,  # each block's output, per image
        "block_params": counts,
        "opt_s": opt_s,
    }
    prof.full_step_s = image_step_s(prof, batch)
    prof.memory["full"] = rank_estimate(cfg, ds)
    for replicas, stages, chunks in shapes:
        strategy = (plans or {}).get((replicas, stages, chunks)) or reference("pipeline", replicas)
        extra = {"replicas": replicas} if replicas > 1 else {}
        flags = flags_for(base, strategy, stages=stages, chunks=chunks, **extra)
        flags["workers"] = replicas * stages
        scfg = build_config(None, flags)
        image_pipeline(prof, replicas, stages, chunks, scfg.strategy.balance)
        prof.memory[f"pipeline{replicas}x{stages}x{chunks}"] = rank_estimate(scfg, ds)


def image_pipeline(
    prof: Profile, replicas: int, stages: int, chunks: int, balance: list[int] | None = None
) -> dict[str, Any]:
    """``prof.pipeline["RxSxM"]`` of ViG, composed from the per-block costs (see
    :func:`profile_images`): ``balance`` (blocks per stage), or the split ``gnnpar train``
    makes from the blocks' forward + backward times
    (:func:`~gnnpar.parallel.pipeline.stages.split_by_cost`)."""

    im = prof.images
    mb = prof.batch_size // chunks  # images per micro-batch
    fwd, bwd = image_block_s(prof, mb)
    balance = balance or split_by_cost([f + b for f, b in zip(fwd, bwd)], stages)
    spans = list(bounds(balance))
    counts, act = im["block_params"], im["act_bytes_per_image"]
    total = max(sum(counts), 1)
    shape = {
        "balance": list(balance),
        "fwd_s": [[sum(fwd[lo:hi])] * chunks for lo, hi in spans],
        "bwd_s": [[sum(bwd[lo:hi])] * chunks for lo, hi in spans],
        "act_bytes": [act[hi - 1] * mb for _, hi in spans[:-1]],
        "opt_s": [im["opt_s"] * sum(counts[lo:hi]) / total for lo, hi in spans],
        "grad_bytes": [4.0 * sum(counts[lo:hi]) for lo, hi in spans],
    }
    prof.pipeline[f"{replicas}x{stages}x{chunks}"] = shape
    return shape


def image_block_s(prof: Profile, images: int) -> tuple[list[float], list[float]]:
    """Each block's forward and backward seconds on ``images`` images: the probe of that
    many where one was timed, else the largest probe's per-image times scaled."""
    probes = prof.images["probes"]
    key = str(images) if str(images) in probes else max(probes, key=int)
    p = probes[key]
    return [t * images for t in p["fwd_s"]], [t * images for t in p["bwd_s"]]


def image_step_s(prof: Profile, images: int) -> float:
    """One sequential ViG step on ``images`` images: forward, backward, optimizer."""
    fwd, bwd = image_block_s(prof, images)
    return sum(fwd) + sum(bwd) + prof.images["opt_s"]


def _stage_times(model, lo: int, hi: int, first: bool, last: bool, x, edge_index):
    """(forward s, backward s, output) of blocks [lo, hi) on one micro-batch."""
    inp = x.detach().requires_grad_(x.is_floating_point() and not first)

    def forward():
        h = model.stem(inp) if first else inp
        for block in model.blocks[lo:hi]:
            h = block(h, edge_index)
        return model.head(h) if last else h

    f = mean_time(forward)
    outs = [forward() for _ in range(REPEATS + 1)]
    times = []
    for out in outs:
        t0 = time.perf_counter()
        out.backward(torch.ones_like(out))
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        out = forward()
    return f, statistics.fmean(times[1:]), out
