"""Neighbour-sampled batches (the I/O side of a step): making a batch in a loader worker,
the worker's start, and a step on each batch size's batches."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from typing import Any

import torch

from gnnpar.advise.profile.core import (
    SAMPLED_BATCHES,
    Need,
    Profile,
    _plan,
    _share,
    _train_step,
    flags_for,
    reference,
)
from gnnpar.advise.profile.disk import batch_io, disk_record
from gnnpar.advise.profile.memory import rank_estimate
from gnnpar.advise.profile.steps import _fresh_batch_time
from gnnpar.data.sampling.loader import SampledBatches, build_loader, shard_plan


def _worker_start_s(batches, sample_s: float) -> float:
    """Seconds from starting a loader with one worker process (gnnpar's build_loader) to its
    first batch, less the batch's own making: the worker's start-up. Timed on a second loader:
    the first also starts multiprocessing's fork server (once per process; in a run that
    happens while the rank builds its model), which would count ~1 s too many here."""

    start = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        loader = build_loader(batches, 1, 1, timeout_s=120)
        it = iter(loader)
        next(it)
        start = time.perf_counter() - t0 - sample_s
        del it, loader
    return max(0.0, start)


class _CPUStampedBatches(SampledBatches):
    """The run's batches, each stamped with its maker's CPU time (all of the process's threads)
    when it was made: between two batches a loader worker makes one and hands it over (the
    tensors moved into shared memory, pickled, their file descriptors sent), so the difference
    is a worker's whole CPU cost per batch."""

    def __getitem__(self, i: int):
        b = super().__getitem__(i)
        b.maker_cpu_s = time.process_time()
        return b


def _loader_costs(plan, batches, n: int, sample_s: float) -> dict[str, float]:
    """What a batch costs when a loader worker makes it, as a run trains it: the worker's CPU
    per batch (``worker_s``: making it, moving it into shared memory and sending it, often 2-4x
    the making alone: Cora's 1,353 x 1,433 features 6 -> 12 ms), the training process's CPU to
    receive it (``recv_s``: unpickling, mapping the shared memory, the batch as ``Data``, marked
    as the loop does) and the training step on it (``compute_recv_s``: its features are pages
    of shared memory touched for the first time, timed with the worker idle: ``sample_s``, its
    making, sets the wait). ``n`` batches of one loader with one worker, after one that warms
    up; CPU time, so waiting for the worker does not count."""

    stamped = _CPUStampedBatches.__new__(_CPUStampedBatches)
    stamped.__dict__.update(batches.__getstate__())
    epochs = math.ceil((n + 1) / batches.steps)
    it = iter(build_loader(stamped, epochs, 1, timeout_s=120))
    step = _train_step(plan)
    step(plan.source.mark(next(it).to_data()))()  # warm-up
    recv, compute, worker, last = [], [], [], None
    try:
        for _ in range(n):
            t0 = time.thread_time()
            b = next(it)
            data = plan.source.mark(b.to_data())
            recv.append(time.thread_time() - t0)
            if last is not None:
                worker.append(b.maker_cpu_s - last)
            last = b.maker_cpu_s
            # the worker makes the next batch now: let it finish first, so that the step is
            # timed alone (the simulation adds the worker's share of the cores itself; timed
            # beside it, a step on a 24K-node graph came out 40% slower, counted twice)
            time.sleep(3 * sample_s + 0.02)
            t0 = time.perf_counter()
            step(data)()
            compute.append(time.perf_counter() - t0)
    finally:
        del it
    return {
        "worker_s": statistics.fmean(worker) if worker else 0.0,
        "recv_s": statistics.fmean(recv),
        "compute_recv_s": statistics.fmean(compute),
    }


def seed_batch_sizes(needs: Iterable[Need], num_train: int) -> list[int]:
    """The batch sizes to profile for sampled configurations: each ``--batch-size``, and where
    a rank's share of the training nodes is smaller than it (a small graph on several ranks:
    Cora's 140 on 2 ranks), that share, the size of the batches the rank really makes. Their
    cost is not proportional to the seeds (neighbourhoods overlap, every step has fixed costs),
    so it is measured rather than scaled."""

    sizes = set()
    for n in needs:
        sizes.add(n.batch_size)
        per_rank = shard_plan(num_train, n.world, n.batch_size)[0]
        if 0 < per_rank < min(n.batch_size, num_train):
            sizes.add(per_rank)
    return sorted(sizes)


def sampled_batch_costs(prof: Profile, batch_size: int, world: int) -> tuple[dict, float]:
    """The profiled costs of a rank's batch with ``--batch-size`` on ``world`` ranks, and the
    factor they still need: where the rank's share of the training nodes is smaller than the
    batch, the share's own costs (:func:`seed_batch_sizes`), 1; in a profile from before, the
    asked size's, scaled by the seeds (an upper bound: neighbourhoods of more seeds overlap
    more)."""

    per_rank = shard_plan(prof.num_train, world, batch_size)[0]
    key = sampled_key(prof, batch_size, world)
    if key != str(batch_size):
        return prof.sampled[key], 1.0
    seeds = min(batch_size, per_rank) / max(min(batch_size, prof.num_train), 1)
    return prof.sampled[key], min(1.0, seeds)


def sampled_key(prof: Profile, batch_size: int, world: int) -> str:
    """The profiled batch size that stands for a rank's batches with ``--batch-size`` on
    ``world`` ranks (see :func:`sampled_batch_costs`)."""

    per_rank = shard_plan(prof.num_train, world, batch_size)[0]
    own = str(per_rank) in prof.sampled and per_rank < batch_size
    return str(per_rank) if own else str(batch_size)


def profile_sampled(
    base: dict,
    ds,
    batch_sizes: Iterable[int],
    prof: Profile,
    workers: bool = False,
    plan: str | None = None,
) -> None:
    """A few of the sampled plan's own batches per batch size (``plan``'s; None: the
    reference's, sampled's): making each in one thread (a loader worker) and training it at the
    run's threads."""
    strategy = plan or reference("sampled")
    for bs in sorted(set(batch_sizes)):
        cfg, plan = _plan(flags_for(base, strategy, batch_size=bs), ds)
        try:
            batches = plan.source.batches
            n = min(SAMPLED_BATCHES, batches.steps)
            sample, compute, first, split = [], [], 0.0, []
            nodes, edges = [], []  # per batch: new nodes per hop (seeds first), sampled edges
            for i in range(n):
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                t0 = time.perf_counter()
                batches[i]  # warm; the first maps the graph file and builds the sampler
                first = first or time.perf_counter() - t0
                t0 = time.perf_counter()
                b = batches[i]
                nodes.append([float(n) for n in b.num_sampled_nodes])
                edges.append([float(e) for e in b.num_sampled_edges])
                data = plan.source.mark(b.to_data())
                sample.append(time.perf_counter() - t0)
                torch.set_num_threads(threads)
                compute.append(_fresh_batch_time(plan, data, split=split))
            made = []  # the rank making a batch itself (W = 0) at its threads
            for i in range(n):
                t0 = time.perf_counter()
                plan.source.mark(batches[i].to_data())
                made.append(time.perf_counter() - t0)
            main = statistics.fmean(made)
            sample_s = statistics.fmean(sample)
            loader: dict[str, Any] = {}
            if ds.info.get("prepared"):  # from disk: what the cache served, what was read
                loader["io"] = batch_io(batches, n)
                if not prof.disk:  # the folder's read rate, on batches not made yet
                    prof.disk = disk_record(ds, plan.source, batches, n)
            if workers:  # loader workers are processes, so only where processes may start
                prof.loader_start_s = _worker_start_s(batches, sample_s)
                loader |= _loader_costs(plan, batches, SAMPLED_BATCHES + 1, sample_s)
        finally:
            plan.source.close()
        prof.sampled[str(bs)] = {
            "sample_s": sample_s,
            "main_sample_s": main,
            "compute_s": statistics.fmean(compute),
            "first_batch_s": max(0.0, first - sample_s),
            "slowed_share": _share(split),  # forward and backward (see Profile.slowed_share)
            "fanouts": list(cfg.strategy.fanouts),
            # the frontier's sizes, for the exchange across shards (advise/shard_exchange.py)
            "nodes_per_hop": [statistics.fmean(h) for h in zip(*nodes, strict=True)],
            "edges_per_hop": [statistics.fmean(h) for h in zip(*edges, strict=True)],
            **loader,
        }
        prof.memory[f"sampled{bs}"] = rank_estimate(cfg, ds)
