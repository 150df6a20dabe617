"""Training steps through the strategies' own plans: the full graph and each subgraph, the
training loop's own cost per step, and a step in the real loop against alone."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import replace

import torch

from gnnpar.advise.profile.core import (
    PROBE_ROUNDS,
    PROBE_SIDE_S,
    REPEATS,
    Profile,
    _plan,
    _probe_epochs,
    _share,
    _train_step,
    flags_for,
    interleaved_times,
    probe_rounds,
    reference,
)
from gnnpar.advise.profile.memory import rank_estimate
from gnnpar.training.loop import Final, train
from gnnpar.training.sources import ShuffledBatches


def profile_graph_batches(
    base: dict,
    ds,
    partitions: Iterable[int],
    full: bool,
    prof: Profile,
    plan: str | None = None,
    parts_plan: str | None = None,
):
    """The full graph, through the plan of the strategy ``plan``, and every subgraph of each
    partition count, through ``parts_plan``'s (None: the reference's,
    :func:`~gnnpar.advise.profile.core.reference`)."""
    if full:
        cfg, plan = _plan(flags_for(base, plan or reference("full")), ds)
        (batch,) = plan.source.batches
        split: list[tuple[float, float]] = []
        (prof.full_step_s,) = interleaved_times([_train_step(plan, split)(batch)])
        prof.slowed_share = _share(split)
        (prof.full_first_s,) = _first_step_extra(_train_step(plan), [batch], [prof.full_step_s])
        prof.memory["full"] = rank_estimate(cfg, ds)
    for p in sorted(set(partitions)):
        cfg, plan = _plan(flags_for(base, parts_plan or reference("parts"), partitions=p), ds)
        split = []
        batches = plan.source.batches
        prof.parts_step_s[str(p)] = interleaved_times(
            [_train_step(plan, split)(b) for b in batches]
        )
        if p == min(partitions):  # the subgraphs' share where a grid has some (the last word)
            prof.slowed_share = _share(split)
        step = _train_step(plan)
        prof.parts_first_s[str(p)] = _first_step_extra(step, batches, prof.parts_step_s[str(p)])
        prof.memory[f"parts{p}"] = rank_estimate(cfg, ds)


def loop_overhead_s(base: dict, ds, out: str, steps: int = 100) -> float:
    """What the one training loop adds to each step (source, progress, metrics line, step
    bookkeeping): the real loop (:func:`gnnpar.training.loop.train`) over the one-rank
    reference's plan (sequential's) with its step replaced by nothing, writing its metrics to ``out`` as a run does. The plan's
    final evaluation is replaced by nothing too: it is no part of a step, and it is a forward
    pass over the whole graph (synthetic-amazon at scale 1: the profile's 19 GiB peak)."""

    flags = flags_for(base, reference("full"))
    flags.update({"epochs": 1, "out": out})
    cfg, plan = _plan(flags, ds)
    zero = torch.zeros(())
    one = ds.data if ds.kind == "graph" else (ds.train_x[:1], ds.train_y[:1])  # never trained
    idle = replace(
        _no_final(plan),
        source=ShuffledBatches([one] * steps, 1, cfg.run.seed, None),
        step=lambda batch: zero,
    )
    outcome = train(cfg, idle)
    return statistics.fmean(outcome.ranks[0].step_times)


def _no_final(plan):
    """``plan`` without its final evaluation (a forward over the whole graph: no part of a
    step, and on a large graph most of a probe's time and memory)."""

    return replace(plan, finish=lambda: Final({"val": None, "test": None}, []))


def real_loop_factor(
    base: dict,
    ds,
    out: str,
    partitions: int | None,
    profiled_s: float,
    min_steps: int = 60,
    asked: int = PROBE_ROUNDS,
    plan: str | None = None,
) -> tuple[list[float], list[float]]:
    """How much longer a step takes in the real training loop than profiled alone, per round
    (:func:`probe_rounds`): the plan of ``plan`` (None: the reference's, sequential's; its
    ``partitions`` subgraphs, else the full graph) has its batches' steps timed alone (:func:`interleaved_times`), then is trained by
    :func:`gnnpar.training.loop.train` for a few epochs (at least ``min_steps`` steps after the
    first epoch, which warms up); the round's ratio is the mean of the loop's own step times
    over the mean of the steps alone (with one round, ``profiled_s``: the profile's mean step of
    these batches, which also sizes the rounds). What it covers and the profile does not: the
    slow steps between the quick ones (the loop's bookkeeping and Python's garbage collector
    disturbing the caches; on Cora-sized steps of ~1 ms the mean is 20-25% above the median).
    Also returns each round's steps alone over ``profiled_s``: the same steps timed again later,
    which says how far the machine's speed drifted while it was profiled (none: one round)."""

    per_epoch = partitions or 1
    strategy = plan or reference("full")
    flags = flags_for(base, strategy, **({"partitions": partitions} if partitions else {}))
    flags["epochs"] = _probe_epochs(min_steps, per_epoch, profiled_s)
    rounds, ratios, drift = probe_rounds(per_epoch * profiled_s, asked), [], []
    for i in range(rounds):
        cfg, plan = _plan({**flags, "out": os.path.join(out, str(i))}, ds)
        alone = profiled_s  # one round (long epochs): the profile's own timing of the batches
        if rounds > 1:
            step = _train_step(plan)
            fns = [step(b) for b in plan.source.batches]
            alone = statistics.fmean(interleaved_times(fns, 1 << 20, PROBE_SIDE_S))
            drift.append(alone / profiled_s if profiled_s > 0 else 1.0)
        times = train(cfg, _no_final(plan)).ranks[0].step_times[per_epoch:]
        if times and alone > 0:
            ratios.append(max(0.5, statistics.fmean(times) / alone))
    return ratios or [1.0], drift


def _first_step_extra(step, batches: list, steady_s: list[float]) -> list[float]:
    """Per subgraph, the seconds its first step in a run takes beyond its later ones: a step
    on a copy of it (new tensors, copied before the clock), minus its steady time."""
    copies = [b.clone() for b in batches]
    extra = []
    for c, steady in zip(copies, steady_s):
        t0 = time.perf_counter()
        step(c)()
        extra.append(max(0.0, time.perf_counter() - t0 - steady))
    return extra


def _fresh_batch_time(plan, data, repeats: int = REPEATS, split: list | None = None) -> float:
    """Mean seconds of a training step on a batch it has not seen: a run trains each sampled
    batch once, so what the model derives from a batch and keeps for the next call on the same
    tensors (the sparse input's CSR plan, the GCN adjacency) is made in every step. Each
    repetition trains its own copy of the batch (new tensors, copied before the clock), its
    features marked as the graph's rows, as the run's are (SampledSource.mark). ``split``: as
    :func:`_train_step`'s, for the timed steps."""
    first = plan.source.mark(data.clone())  # a step may let go of its batch's features
    t0 = time.perf_counter()
    _train_step(plan)(first)()  # warm-up: allocator, autograd graph, lazy initialisation
    # millisecond steps vary by +-30% from one set of 5 to the next: more of them, up to ~0.1 s
    warm = time.perf_counter() - t0
    repeats = max(repeats, min(4 * repeats, int(0.1 / max(warm, 1e-4))))
    copies = [plan.source.mark(data.clone()) for _ in range(repeats)]
    step, times = _train_step(plan, split), []
    for c in copies:
        t0 = time.perf_counter()
        step(c)()
        times.append(time.perf_counter() - t0)
    return statistics.fmean(times)
