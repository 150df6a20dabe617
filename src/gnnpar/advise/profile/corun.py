"""Two ranks training at once, in the probe's processes: the co-run factor, how late a rank
woken from an all-reduce resumes (:func:`wake_s`), and the stragglers' after-pause ratios."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gnnpar.advise import simulate as sim
from gnnpar.advise.profile.core import (
    PROBE_SIDE_S,
    _probe_epochs,
    _train_step,
    interleaved_times,
    probe_rounds,
)
from gnnpar.advise.profile.steps import _no_final
from gnnpar.configure import build_config
from gnnpar.data.datasets import load_dataset
from gnnpar.data.sampling.loader import shard_plan
from gnnpar.models.memory import FLOAT_BYTES
from gnnpar.parallel import collectives
from gnnpar.runtime.dist import DistContext
from gnnpar.strategies import registry
from gnnpar.training.loop import train


def _corun_factor(
    flags: dict,
    ctx,
    rounds: int,
    min_steps: int = 40,
    straggle: dict | None = None,
    gossip: dict | None = None,
) -> tuple[list[float], list[dict[str, float]], list[float], list[float]]:
    """How much slower a step is in a real two-rank run than alone, per round
    (:func:`probe_rounds`): the steps of allreduce's own plan (rank 0's dealt subgraphs) timed
    by rank 0 alone, the other rank idle at a barrier; then that plan on both ranks (averaging
    every ``--sync-every`` steps) trained by the real loop (:func:`gnnpar.training.loop.train`)
    for at least ``min_steps`` steps per rank after a first epoch that warms up: the mean of
    both ranks' step times (without waiting for each other) over the steps alone. What it
    covers: the two ranks sharing cores (SMT siblings) and memory bandwidth, gloo's and the
    heartbeat's threads, and the loop's own slow steps (:func:`real_loop_factor`).

    After each round, the same plan averaging gradients every step (:func:`_sync_run`): how
    late a rank that waited at an all-reduce resumes (:func:`wake_s`), per round; and with
    ``straggle`` (the grid's ``--slowdown``/``--jitter`` flags), the plan trained with the
    stragglers: a straggler's step after its pause over alone (:func:`_straggled_step_ratio`),
    and with ``gossip`` (its flags) gossip's rank beside the straggler
    (:func:`_beside_straggler_ratio`), per round (else empty lists)."""
    import torch.distributed as dist

    cfg = build_config(None, flags)
    ds = _probe_dataset(cfg)
    spec = registry.get(cfg.strategy.name)
    plan = spec.build(cfg, ds, ctx, spec.parallel_dims(cfg, ctx.world_size))
    mine = [plan.source.graph.batch(p) for p in plan.source.mine]
    steps = [_train_step(plan)(b) for b in mine]

    def alone() -> float:  # the same kind of steps, the other rank idle
        dist.barrier()
        times = interleaved_times(steps, 1 << 20, PROBE_SIDE_S) if ctx.rank == 0 else []
        return statistics.fmean(collectives.gather_to_all(times)[0] or [0.0])

    runs: list[dict[str, float]] = []
    after: list[float] = []
    beside: list[float] = []
    per_epoch = plan.source.steps

    def after_round(epochs: int) -> None:
        runs.append(_sync_run(flags, ds, ctx, epochs))
        if not straggle:
            return
        solo = alone()  # the same steps alone, once for this round's straggled runs
        ratio = _straggled_step_ratio(flags, straggle, ds, ctx, epochs, per_epoch, solo)
        if ratio is not None:
            after.append(ratio)
        if gossip:  # its pool and pairing keys in a store namespace of this round's own
            store = dist.PrefixStore(f"advise/beside{len(runs)}/", ctx.store)
            ratio = _beside_straggler_ratio(
                gossip, straggle, ds, replace(ctx, store=store), epochs, solo
            )
            if ratio is not None:
                beside.append(ratio)

    ratios = _two_rank_rounds(
        flags, ds, ctx, per_epoch, alone, rounds, min_steps, after_round=after_round
    )
    return ratios, runs, after, beside


def _sync_run(flags: dict, ds, ctx, epochs: int) -> dict[str, Any]:
    """allreduce of ``flags`` with the gradients averaged every step (K = 1), trained by the real
    loop on both ranks for ``epochs``: its wall time (the slower rank's summed epochs), each
    rank's steps without their waits, and the epochs. What the wall time holds beyond the steps
    is what the all-reduces and barriers cost inside training (:func:`wake_s`)."""
    k1 = {**flags, "sync-every": 1, "average": "grads"}
    run = _train_on_ranks(k1, ds, ctx, epochs)
    return {
        "wall_s": run.train_time_s,
        "step_s": [r.step_times for r in run.ranks],
        "epochs": epochs,
    }


def wake_s(run: dict[str, Any], comm: dict[str, Any], param_bytes: int) -> float:
    """How late a rank that waited at an all-reduce resumes (``simulate.Cluster.wake_s``), from
    a :func:`_sync_run`: the value that makes the simulation of that very run (its ranks' own
    step times, lock-step with K = 1, the fitted links for the gradients and a count, a barrier
    per epoch) last its measured wall time; found by bisection, as the simulated time grows
    with it. 0 where the run was no slower than simulated without it. On a 2-vCPU AMD EPYC VM:
    1.3-2.1 ms (the back-to-back exchange: ~0.2 ms)."""

    ring, p2p = sim.Link(*comm["ring_step"]), sim.Link(*comm["p2p_link"])
    epochs, steps = int(run["epochs"]), run["step_s"]
    per_epoch = len(steps[0]) // max(1, epochs)
    if per_epoch < 1 or any(len(s) != per_epoch * epochs for s in steps):
        return 0.0
    compute = [[s[e * per_epoch : (e + 1) * per_epoch] for e in range(epochs)] for s in steps]

    def simulated(wake: float) -> float:
        two = sim.Cluster(1, len(steps), ring, p2p, wake_s=wake)
        return sim.lockstep(two, compute, 1, param_bytes + FLOAT_BYTES).train_time_s

    wall = run["wall_s"]
    excess = max(0.0, wall - simulated(0.0)) / (per_epoch * epochs)  # per step
    lo, hi = 0.0, 4 * excess
    if excess <= 0:
        return 0.0
    if simulated(hi) < wall:  # the same rank always waited, which hides it: the excess per step
        return excess
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulated(mid) < wall else (lo, mid)
    return (lo + hi) / 2


def _beside_straggler_ratio(flags: dict, straggle: dict, ds, ctx, epochs: int, solo: float):
    """gossip of ``flags`` trained by the real loop on both ranks with the stragglers of
    ``straggle`` (the slowest on rank 1) for ``epochs``: rank 0's mean step after its first
    ``epochs``-th of them (taking from the pool, training, its pairing's store calls; not its
    waits for the partner) over ``solo``. The pool's main worker beside a sleeping straggler on
    a 2-vCPU AMD EPYC VM stepped 1.3-1.4x as long as alone, and slower than beside a rank that
    computes (Cora, 3x straggler: 1.64 ms mean against ~1.5 in an even run; gossip was
    predicted 15-25% short there without it, BENCHMARKS.md 2026-11-27). gossip's pool and
    pairing keep their keys in ``ctx.store``: give each call a namespace of its own (a second
    run on the same keys finds the pool handed out and trains nothing)."""
    fast = _train_on_ranks({**flags, **straggle}, ds, ctx, epochs).ranks[0]
    steps = fast.step_times[len(fast.step_times) // max(epochs, 1) :]
    if not steps or solo <= 0:
        return None
    return max(1.0, statistics.fmean(steps) / solo)


def _straggled_step_ratio(
    flags: dict, straggle: dict, ds, ctx, epochs: int, per_epoch: int, solo: float
) -> float | None:
    """The strategy of ``flags`` trained by the real loop on both ranks with the stragglers of
    ``straggle`` (the slowest on rank 1) for ``epochs``: rank 1's mean step after the first
    epoch, its pauses taken out (shared over its steps by their length), over ``solo`` (the
    same kind of step alone). What a straggler's step right after its pause costs in a real
    run: the emulation sleeps, and the thread resumes on a cold core."""
    slow = _train_on_ranks({**flags, **straggle}, ds, ctx, epochs).ranks[1]
    steps = slow.step_times[per_epoch:]
    if not steps or solo <= 0:
        return None
    own = sum(steps) - slow.delay_s * sum(steps) / max(sum(slow.step_times), 1e-12)
    return max(1.0, own / len(steps) / solo)


def _sampled_corun_factor(
    flags: dict,
    alone_s: float,
    ctx,
    rounds: int,
    min_steps: int = 30,
    straggle: dict | None = None,
    straggled_steps: int = 10,
) -> tuple[list[float], list[float]]:
    """The co-run factor of sampled training, per round, which differs from the subgraph
    strategies': each step's gradients are averaged by DDP, whose hooks and gloo's thread run
    during the backward, beside the other rank's step. Rank 0 alone first makes and trains a
    few of its batches (the other rank idle at a barrier); then sampled's own plan (``flags``:
    two ranks, batches made in the rank) is trained by the real loop on both ranks for at least
    ``min_steps`` steps after a first epoch that warms up: the mean of both ranks' steps
    (making the batch and training it, not the wait at the all-reduce, which the simulation
    charges itself) over the steps alone. ``alone_s``: the profile's own cost of such a batch
    (making and step), which sizes the rounds.

    With ``straggle`` (the grid's ``--slowdown``/``--jitter`` on these two ranks, the slowest
    on rank 1), each round also trains that plan with the stragglers for at least
    ``straggled_steps`` steps after the first epoch, and returns, per round, rank 1's mean step
    (making its batch and training it, its pauses taken out) over the steps alone: what a step
    right after a straggler's pause costs in a real run (``simulate.Stragglers.after_pause``).
    The emulation sleeps, and the thread resumes on a cold core: on a 2-vCPU AMD EPYC VM a Cora
    batch's making and step took 1.3-1.45x as long in such runs as alone, and a 3x straggler's
    epoch was predicted 28% short without it. Measured in a real run rather than by sleeping in
    this process: a probe that slept alone here, with the other core idle too, gave 0.98-1.39
    from one round to the next, and 1.4-1.8x for Cora's subgraph steps, whose runs showed
    nothing of it (BENCHMARKS.md, 2026-11-27, issue 22). Returns (co-run ratios, after-pause
    ratios; empty without ``straggle``)."""
    import torch.distributed as dist

    cfg = build_config(None, flags)
    ds = _probe_dataset(cfg)
    per_epoch = _sampled_steps(cfg, ds, ctx.world_size)
    # batches of a rank's size, made and trained by a plan of one rank; built on both ranks,
    # as sharing the graph file gathers its path from every rank of the process group
    bs = cfg.strategy.batch_size
    size = min(bs, shard_plan(int(ds.data.train_mask.sum()), ctx.world_size, bs)[0])
    solo = build_config(None, {**flags, "batch-size": max(1, size)})
    spec = registry.get(solo.strategy.name)
    mine = spec.build(solo, ds, DistContext(), spec.parallel_dims(solo, 1))

    def alone() -> float:  # timed by rank 0, the other rank idle
        dist.barrier()
        times = [_made_and_trained_s(mine, PROBE_SIDE_S)] if ctx.rank == 0 else []
        return statistics.fmean(collectives.gather_to_all(times)[0] or [0.0])

    after: list[float] = []
    epochs = _probe_epochs(straggled_steps, per_epoch, 3 * alone_s)

    def straggled(_epochs: int) -> None:
        ratio = _straggled_step_ratio(flags, straggle, ds, ctx, epochs, per_epoch, alone())
        if ratio is not None:
            after.append(ratio)

    try:
        ratios = _two_rank_rounds(
            flags,
            ds,
            ctx,
            per_epoch,
            alone,
            rounds,
            min_steps,
            alone_s,
            after_round=straggled if straggle else None,
        )
        return ratios, after
    finally:
        mine.source.close()


def _made_and_trained_s(plan, budget_s: float) -> float:
    """Mean seconds to make one of sampled's batches in this process and train it (a fresh
    batch each step, as the loop's), over as many batches as fit ``budget_s`` after one
    warm-up (at least one; the plan's batches in turn)."""
    batches, step = plan.source.batches, _train_step(plan)

    def one(i: int) -> float:
        t0 = time.perf_counter()
        step(plan.source.mark(batches[i % batches.steps].to_data()))()
        return time.perf_counter() - t0

    first = one(0)
    n = max(1, int(budget_s / max(first, 1e-9)))
    return statistics.fmean(one(i) for i in range(1, n + 1))


def _probe_dataset(cfg):
    """The dataset of a probe's flags (the profile's own, read again in a launched rank)."""

    d = cfg.data
    return load_dataset(d.dataset, d.data_root, d.scale, cfg.run.seed, cfg.strategy.timeout_s)


def _two_rank_rounds(
    flags: dict,
    ds,
    ctx,
    per_epoch: int,
    alone: Callable[[], float],
    asked: int,
    min_steps: int,
    step_s: float | None = None,
    after_round: Callable[[int], None] | None = None,
) -> list[float]:
    """Rounds (:func:`probe_rounds`, ``asked`` at most) of: ``alone()`` (a step's seconds
    alone, the same on both ranks), then the strategy of ``flags`` trained by the real loop on
    both ranks (:func:`_train_on_ranks`) for at least ``min_steps`` steps after a first epoch of ``per_epoch`` that warms up; each
    round's ratio is the mean of both ranks' step times over the steps alone, at least 1.
    ``step_s`` sizes the rounds (default: the first round's steps alone); ``after_round(epochs)``
    runs after each round's training (another probe of the same length)."""
    solo = alone()
    rounds = probe_rounds(per_epoch * (step_s or solo), asked)
    epochs = _probe_epochs(min_steps, per_epoch, step_s or solo)
    ratios = []
    for i in range(rounds):
        if i:
            solo = alone()
        ranks = _train_on_ranks(flags, ds, ctx, epochs).ranks  # every rank's, gathered
        if after_round is not None:
            after_round(epochs)
        busy = [t for r in ranks for t in r.step_times[per_epoch:]]
        if solo > 0 and busy:
            ratios.append(max(1.0, statistics.fmean(busy) / solo))
    return ratios or [1.0]


def _train_on_ranks(flags: dict, ds, ctx, epochs: int):
    """The strategy of ``flags`` built on this process group and trained by the real loop
    (:func:`gnnpar.training.loop.train`) for ``epochs``, without its final evaluation, writing
    into a temporary folder: its :class:`~gnnpar.training.loop.Outcome` (the same on every rank)."""

    with tempfile.TemporaryDirectory(prefix="gnnpar-advise-ranks-") as tmp:
        cfg = build_config(None, {**flags, "epochs": epochs, "out": tmp})
        spec = registry.get(cfg.strategy.name)
        plan = spec.build(cfg, ds, ctx, spec.parallel_dims(cfg, ctx.world_size))
        return train(cfg, _no_final(plan))


def _sampled_steps(cfg, ds, world: int) -> int:
    """sampled's steps per epoch on ``world`` ranks (as SampledSource counts them)."""

    train = int(ds.data.train_mask.sum())
    steps = shard_plan(train, world, cfg.strategy.batch_size)[1]
    return min(steps, cfg.run.max_steps or steps)
