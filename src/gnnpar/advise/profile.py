"""The short profile ``gnnpar advise`` simulates from, taken here with gnnpar's own code paths.

Every batch is the one the strategy would train, built by the strategy's own parts: the full
graph and the Cluster-GCN subgraphs through ``sequential``'s plan (``SPEC.build``: the real
model, loss, optimizer and partitions), neighbour-sampled batches through ``sampled``'s plan
(its :class:`~gnnpar.data.sampling.loader.SampledBatches` over the shared graph file), pipeline
micro-batches through :class:`~gnnpar.training.pipeline_batches.GraphMicroBatches` and the
stage split of :func:`~gnnpar.parallel.pipeline.stages.choose_balance`. What is measured:

* one training step (forward, backward, optimizer step) of each batch kind at ``--threads``:
  the full graph, every subgraph of each ``--partitions`` in the grid, a few sampled batches per
  ``--batch-size``, and each pipeline stage's forward and backward per micro-batch;
* making a sampled batch (sampling and feature gather) in one thread, as a loader worker does;
* bytes per exchange: the gradients or parameters (all-reduce, gossip), each stage's
  activations (pipeline);
* gloo on this machine between two ranks started by gnnpar's launcher: all-reduce and a
  point-to-point exchange against size (the median of calls made in turns,
  :func:`interleaved_calls`), and a store round trip (the gossip pool and pairing); fitted to
  ``latency + bytes / bandwidth``;
* how late a rank that waited at an all-reduce resumes (:func:`wake_s`): blocked in gloo's
  wait it slept, and is woken late (1.3-2.1 ms on a 2-vCPU VM, against ~0.2 ms for the fitted
  exchange), from allreduce trained with K = 1 by the real loop on two ranks;
* with ``--slowdown`` or ``--jitter``: how much longer a straggler's step (a subgraph's, a
  sampled batch's making and training) takes right after its emulated sleep, in a real two-rank
  run with the stragglers, than alone (:func:`_straggled_step_ratio`), and gossip's rank beside
  the straggler (:func:`_beside_straggler_ratio`);
* memory: the bare rank's resident memory here, and this process's peak.

ViG on images (study 000) is profiled per block instead (:func:`profile_images`): each block's
forward and backward on a few images, scaled per image, compose the sequential step and every
pipeline stage per micro-batch; gloo's costs as above.

Each timing is the mean of several repetitions after one warm-up, the repetitions of a set of
batches taken round-robin: an epoch's time is a sum of step times, whose expectation is the sum
of their means, and on a shared machine a step's time has a long tail (another process takes
the core for a while) that a median or a minimum would leave out; measured on Cora's 8
subgraphs, the median step was 1.6-1.9 ms both here and in ``gnnpar train``, whose epochs
nevertheless averaged 2.7-2.9 ms per step.

Where one round of them takes at most 10 s, every batch kind's timings are taken in 3 rounds
(``--profile-rounds``, ``Profile.rounds``) and each is the median of its rounds
(:func:`_measure_in_rounds`). The two ratios the profile takes (a step in the real loop against
alone, :func:`real_loop_factor`; a step with two ranks training at once against alone,
:func:`_corun_factor`) are taken in as many rounds, each timing both sides back to back, and the
median of the rounds' ratios is kept (their values are in ``Profile.probe_rounds``). Timed once
each, minutes
apart, on a VM whose speed drifts (a fixed 11 ms piece of work took 11-79 ms within one minute
on the model-207 Xeon, 2026-11-27), one slow moment on one side made a co-run factor of 2.06
where the runs themselves showed 1.1-1.35, and a grid's predictions 65-99% too slow.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from gnnpar.advise.speed import reference_s
from gnnpar.configure import build_config
from gnnpar.data.sampling.loader import SampledBatches

REPEATS = 5
ROUNDS = 15  # round-robin repetitions of a set of batches (fewer when a round is long)
SAMPLED_BATCHES = 4  # sampled batches timed per batch size
COMM_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)  # bytes
COMM_REPEATS = 9
# rounds of a ratio probe (both sides timed back to back in each; the median ratio is kept),
# where a round's two epochs fit PROBE_ROUND_BUDGET_S; else 1 (a large graph's long steps vary
# less, and every round costs whole epochs). The default of --profile-rounds, which also sets
# the rounds of every timing (_measure_in_rounds)
PROBE_ROUNDS = 3
PROBE_ROUND_BUDGET_S = 5.0
# each side of a round is timed for at least this long where steps are short: a VM's slow
# moments come every second or two and last ~50 ms, so a window of 0.2 s (60 Cora steps) was
# hit or missed by one, and a real loop factor's rounds spread 0.8-1.7
PROBE_SIDE_S = 1.0


@dataclass(frozen=True)
class Need:
    """One thing to measure: ``kind`` full | parts | sampled | pipeline, with its settings."""

    kind: str
    partitions: int = 0
    batch_size: int = 0
    replicas: int = 1
    stages: int = 1
    chunks: int = 1
    world: int = 1  # sampled: the ranks that share the training nodes (see seed_batch_sizes)


@dataclass
class Profile:
    machine: str
    cores: int
    threads: int
    dataset: str
    model: str
    epochs: int
    seed: int
    num_nodes: int
    num_train: int
    param_bytes: int
    base_rss_bytes: int  # a bare rank here (python, torch, gnnpar, the dataset)
    peak_rss_bytes: int = 0  # this process at the end of the profile
    full_step_s: float | None = None
    # what the first step on the full graph costs beyond the others (what the model derives
    # from the graph and keeps, as parts_first_s); 0 in profiles from before it was measured
    full_first_s: float = 0.0
    loop_step_s: float = 0.0  # what the training loop adds to every step
    loop_factor: float = 1.0  # a step in the real loop / profiled alone (real_loop_factor)
    # the share of a graph model's training step (the step times above) that is its forward
    # and backward: the loop draws a straggler's pause on that share alone, not on the optimizer
    # step; 1 in profiles from before it was measured
    slowed_share: float = 1.0
    loader_start_s: float = 0.0  # a loader worker process's start, to its first batch
    parts_step_s: dict[str, list[float]] = field(default_factory=dict)  # str(P) -> per part
    # str(P) -> per part: what the first step on a subgraph costs beyond the others (what the
    # model derives from a subgraph and keeps: the GCN adjacency, the sparse input's CSR plan)
    parts_first_s: dict[str, list[float]] = field(default_factory=dict)
    sampled: dict[str, dict[str, Any]] = field(default_factory=dict)  # str(B) -> ...
    pipeline: dict[str, dict[str, Any]] = field(default_factory=dict)  # "RxSxM" -> ...
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # need key -> estimate
    comm: dict[str, Any] = field(default_factory=dict)
    profile_s: float = 0.0
    kind: str = "graph"  # "image": ViG (num_nodes: pixels per image; num_train: images)
    batch_size: int = 0  # images: --batch-size (per copy of the model)
    max_steps: int | None = None  # images: --max-steps (steps per epoch at most)
    images: dict[str, Any] = field(default_factory=dict)  # images: per-block costs per image
    # each ratio probe's rounds ("loop_factor", "corun_factor", "sampled_corun_factor"): the
    # profile keeps their median; how far apart they are says how steady this machine was; and
    # "step_drift": the loop factor's subgraph steps timed again in each round, over the first
    # timing of them (1.0 first)
    probe_rounds: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = PROBE_ROUNDS  # --profile-rounds: rounds asked of every timing and probe
    # the reference work (advise/speed.py) timed at the profile's start and end: --validate
    # times it around each run to tell the machine's drift from the model's error
    speed_ref_s: list[float] = field(default_factory=list)
    # "sampled70" (the batches a rank trains), "parts8" -> a straggler's step right after its
    # pause, in a real run, over the step alone (:func:`_straggled_step_ratio`); taken only for
    # grids with stragglers and a straggled strategy on several ranks (empty: none asked, or a
    # profile from before: as any other step)
    after_pause: dict[str, float] = field(default_factory=dict)
    # "parts8" -> gossip's rank beside a straggler on its machine: its steps in a real run of
    # gossip with the stragglers over alone (:func:`_beside_straggler_ratio`); as after_pause
    beside_straggler: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def mean_time(fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    fn()  # warm-up: allocator, autograd graph, lazy initialisation
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.fmean(times)


def interleaved_calls(fns: dict[Any, Callable[[], Any]], rounds: int) -> dict[Any, float]:
    """The median seconds of a call of each of ``fns``, each call timed alone, in ``rounds``
    rounds that call every function once in turn (after one round that warms up; every rank
    calls the same sequence, so collectives stay matched). For gloo's costs between two ranks
    on a shared VM: calls there come in spells of ~0.1-0.4 ms and of ~3-4 ms (a rank woken late)
    that last longer than a function's calls in a row, so a mean of 9 calls in a row, or even
    their median, gave one size 3 ms and the next 0.1 ms (an exchange of 1 KB: 0.14-2.7 ms from
    one profile to the next on a 2-vCPU AMD EPYC); in turns, every size sees every spell. What
    training pays beyond that is measured in training (:func:`wake_s`)."""
    times: dict[Any, list[float]] = {key: [] for key in fns}
    for i in range(rounds + 1):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i:
                times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(t) for key, t in times.items()}


def interleaved_times(
    fns: list[Callable[[], Any]], rounds: int = ROUNDS, budget_s: float = 10.0
) -> list[float]:
    """Mean seconds of each of ``fns``, timed round-robin after one warm-up round: a burst
    of load from another process then slows one round of every batch a little instead of every
    repetition of one batch (which would make that batch look slow for good). Fewer rounds
    when one round takes more than ``budget_s / rounds``."""
    times: list[list[float]] = [[] for _ in fns]
    t0 = time.perf_counter()
    for fn in fns:
        fn()
    first = time.perf_counter() - t0
    rounds = max(1, min(rounds, int(budget_s / max(first, 1e-9))))
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t)
    return [statistics.fmean(t) for t in times]


def flags_for(base: dict[str, Any], strategy: str, **settings: Any) -> dict[str, Any]:
    """``gnnpar train`` flags of ``strategy`` with ``settings``: ``base`` without the strategy
    settings this strategy does not read (``gnnpar train`` would refuse them)."""
    from gnnpar.configure import NEEDS, STRATEGY_KEYS
    from gnnpar.strategies import registry

    reads = registry.get(strategy).reads
    flags = {k: v for k, v in base.items() if k not in STRATEGY_KEYS or k in reads}
    flags.update({"strategy": strategy, "quiet": True, "eval-every": 0})
    flags.update({k.replace("_", "-"): v for k, v in settings.items() if v is not None})
    for key, needed in NEEDS.items():
        if needed not in flags:
            flags.pop(key, None)
    return flags


def _plan(flags: dict[str, Any], ds):
    """The strategy's own plan, built in this process as rank 0 of ``--workers``."""
    from gnnpar.runtime.dist import DistContext
    from gnnpar.strategies import registry

    cfg = build_config(None, flags)
    spec = registry.get(cfg.strategy.name)
    dims = spec.parallel_dims(cfg, 1)
    return cfg, spec.build(cfg, ds, DistContext(), dims)


def _train_step(plan, split: list[tuple[float, float]] | None = None):
    """``one(batch)``: a function that trains ``batch`` for a step, as the loop does; with
    ``split``, each call appends (its forward and backward, the whole step) in seconds."""

    def one(batch):
        def run() -> None:
            t0 = time.perf_counter()
            plan.optimizer.zero_grad(set_to_none=True)
            loss = plan.step(batch)
            t1 = time.perf_counter()
            plan.optimizer.step()
            if loss is not None:  # a subgraph without a training node has no loss (the loop's
                float(loss)  # rule too): its step is the forward and the optimizer's step
            if split is not None:
                split.append((t1 - t0, time.perf_counter() - t0))

        return run

    return one


def _share(split: list[tuple[float, float]]) -> float:
    """The forward and backward's share of the steps in ``split`` (1 where nothing was timed)."""
    whole = sum(w for _, w in split)
    return sum(f for f, _ in split) / whole if whole > 0 else 1.0


def profile_graph_batches(base: dict, ds, partitions: Iterable[int], full: bool, prof: Profile):
    """The full graph and every subgraph of each partition count, through sequential's plan."""
    if full:
        cfg, plan = _plan(flags_for(base, "sequential"), ds)
        (batch,) = plan.source.batches
        split: list[tuple[float, float]] = []
        (prof.full_step_s,) = interleaved_times([_train_step(plan, split)(batch)])
        prof.slowed_share = _share(split)
        (prof.full_first_s,) = _first_step_extra(_train_step(plan), [batch], [prof.full_step_s])
        prof.memory["full"] = _estimate(cfg, ds)
    for p in sorted(set(partitions)):
        cfg, plan = _plan(flags_for(base, "sequential", partitions=p), ds)
        split = []
        batches = plan.source.batches
        prof.parts_step_s[str(p)] = interleaved_times(
            [_train_step(plan, split)(b) for b in batches]
        )
        if p == min(partitions):  # the subgraphs' share where a grid has some (the last word)
            prof.slowed_share = _share(split)
        step = _train_step(plan)
        prof.parts_first_s[str(p)] = _first_step_extra(step, batches, prof.parts_step_s[str(p)])
        prof.memory[f"parts{p}"] = _estimate(cfg, ds)


def loop_overhead_s(base: dict, ds, out: str, steps: int = 100) -> float:
    """What the one training loop adds to each step (source, progress, metrics line, step
    bookkeeping): the real loop (:func:`gnnpar.training.loop.train`) over sequential's plan
    with its step replaced by nothing, writing its metrics to ``out`` as a run does. The plan's
    final evaluation is replaced by nothing too: it is no part of a step, and it is a forward
    pass over the whole graph (synthetic-amazon at scale 1: the profile's 19 GiB peak)."""
    from gnnpar.training.loop import train
    from gnnpar.training.sources import ShuffledBatches

    flags = flags_for(base, "sequential")
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
    from gnnpar.training.loop import Final

    return replace(plan, finish=lambda: Final({"val": None, "test": None}, []))


def _probe_epochs(min_steps: int, per_epoch: int, step_s: float, budget_s: float = 5.0) -> int:
    """Epochs of a real-loop probe: a first one that warms up, then at least ``min_steps``
    steps and :data:`PROBE_SIDE_S` seconds, but not much over ``budget_s`` of training (a big
    graph's few slow steps say enough)."""
    min_steps = max(min_steps, math.ceil(PROBE_SIDE_S / max(step_s, 1e-6)))
    epochs = 1 + math.ceil(min_steps / per_epoch)
    return max(2, min(epochs, 1 + int(budget_s / max(step_s * per_epoch, 1e-9))))


def probe_rounds(epoch_s: float, asked: int = PROBE_ROUNDS) -> int:
    """How many rounds a ratio probe takes (``asked``: ``--profile-rounds``), given one epoch's
    seconds."""
    return asked if 2 * epoch_s <= PROBE_ROUND_BUDGET_S else 1


def real_loop_factor(
    base: dict,
    ds,
    out: str,
    partitions: int | None,
    profiled_s: float,
    min_steps: int = 60,
    asked: int = PROBE_ROUNDS,
) -> tuple[list[float], list[float]]:
    """How much longer a step takes in the real training loop than profiled alone, per round
    (:func:`probe_rounds`): sequential's plan (its ``partitions`` subgraphs, else the full
    graph) has its batches' steps timed alone (:func:`interleaved_times`), then is trained by
    :func:`gnnpar.training.loop.train` for a few epochs (at least ``min_steps`` steps after the
    first epoch, which warms up); the round's ratio is the mean of the loop's own step times
    over the mean of the steps alone (with one round, ``profiled_s``: the profile's mean step of
    these batches, which also sizes the rounds). What it covers and the profile does not: the
    slow steps between the quick ones (the loop's bookkeeping and Python's garbage collector
    disturbing the caches; on Cora-sized steps of ~1 ms the mean is 20-25% above the median).
    Also returns each round's steps alone over ``profiled_s``: the same steps timed again later,
    which says how far the machine's speed drifted while it was profiled (none: one round)."""
    from gnnpar.training.loop import train

    per_epoch = partitions or 1
    flags = flags_for(base, "sequential", **({"partitions": partitions} if partitions else {}))
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


def _worker_start_s(batches, sample_s: float) -> float:
    """Seconds from starting a loader with one worker process (gnnpar's build_loader) to its
    first batch, less the batch's own making: the worker's start-up. Timed on a second loader:
    the first also starts multiprocessing's fork server (once per process; in a run that
    happens while the rank builds its model), which would count ~1 s too many here."""
    from gnnpar.data.sampling.loader import build_loader

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
    from gnnpar.data.sampling.loader import build_loader

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
    from gnnpar.data.sampling.loader import shard_plan

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
    from gnnpar.data.sampling.loader import shard_plan

    per_rank = shard_plan(prof.num_train, world, batch_size)[0]
    key = sampled_key(prof, batch_size, world)
    if key != str(batch_size):
        return prof.sampled[key], 1.0
    seeds = min(batch_size, per_rank) / max(min(batch_size, prof.num_train), 1)
    return prof.sampled[key], min(1.0, seeds)


def sampled_key(prof: Profile, batch_size: int, world: int) -> str:
    """The profiled batch size that stands for a rank's batches with ``--batch-size`` on
    ``world`` ranks (see :func:`sampled_batch_costs`)."""
    from gnnpar.data.sampling.loader import shard_plan

    per_rank = shard_plan(prof.num_train, world, batch_size)[0]
    own = str(per_rank) in prof.sampled and per_rank < batch_size
    return str(per_rank) if own else str(batch_size)


def profile_sampled(
    base: dict, ds, batch_sizes: Iterable[int], prof: Profile, workers: bool = False
) -> None:
    """A few of sampled's own batches per batch size: making each in one thread (a loader
    worker) and training it at the run's threads."""
    for bs in sorted(set(batch_sizes)):
        cfg, plan = _plan(flags_for(base, "sampled", batch_size=bs), ds)
        try:
            batches = plan.source.batches
            n = min(SAMPLED_BATCHES, batches.steps)
            sample, compute, first, split = [], [], 0.0, []
            for i in range(n):
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                t0 = time.perf_counter()
                batches[i]  # warm; the first maps the graph file and builds the sampler
                first = first or time.perf_counter() - t0
                t0 = time.perf_counter()
                b = batches[i]
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
            loader: dict[str, float] = {}
            if workers:  # loader workers are processes, so only where processes may start
                prof.loader_start_s = _worker_start_s(batches, sample_s)
                loader = _loader_costs(plan, batches, SAMPLED_BATCHES + 1, sample_s)
        finally:
            plan.source.close()
        prof.sampled[str(bs)] = {
            "sample_s": sample_s,
            "main_sample_s": main,
            "compute_s": statistics.fmean(compute),
            "first_batch_s": max(0.0, first - sample_s),
            "slowed_share": _share(split),  # forward and backward (see Profile.slowed_share)
            "fanouts": list(cfg.strategy.fanouts),
            **loader,
        }
        prof.memory[f"sampled{bs}"] = _estimate(cfg, ds)


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
    t0 = time.perf_counter()
    _train_step(plan)(data)()  # warm-up: allocator, autograd graph, lazy initialisation
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


def profile_pipeline(base: dict, ds, shapes: Iterable[tuple[int, int, int]], prof: Profile):
    """Each stage's forward and backward per micro-batch (every stage on this process, one at
    a time), the activation bytes at each cut, the optimizer step per stage."""
    from gnnpar.models import build_model
    from gnnpar.parallel.pipeline.stages import bounds, profile_blocks, split_by_cost
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.pipeline_batches import GraphMicroBatches, StagePlace
    from gnnpar.training.seeding import seed_everything

    for replicas, stages, chunks in sorted(set(shapes)):
        strategy = "hybrid" if replicas > 1 else "pipeline"
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
        prof.memory[f"pipeline{replicas}x{stages}x{chunks}"] = _estimate(cfg, ds)


def profile_images(base: dict, ds, shapes: Iterable[tuple[int, int, int]], prof: Profile):
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
    from gnnpar.models import build_model
    from gnnpar.parallel.pipeline.stages import PROFILE_IMAGES
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.seeding import seed_everything

    cfg = build_config(None, flags_for(base, "sequential"))
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
    prof.memory["full"] = _estimate(cfg, ds)
    for replicas, stages, chunks in shapes:
        strategy = "hybrid" if replicas > 1 else "pipeline"
        extra = {"replicas": replicas} if replicas > 1 else {}
        flags = flags_for(base, strategy, stages=stages, chunks=chunks, **extra)
        flags["workers"] = replicas * stages
        scfg = build_config(None, flags)
        image_pipeline(prof, replicas, stages, chunks, scfg.strategy.balance)
        prof.memory[f"pipeline{replicas}x{stages}x{chunks}"] = _estimate(scfg, ds)


def image_pipeline(
    prof: Profile, replicas: int, stages: int, chunks: int, balance: list[int] | None = None
) -> dict[str, Any]:
    """``prof.pipeline["RxSxM"]`` of ViG, composed from the per-block costs (see
    :func:`profile_images`): ``balance`` (blocks per stage), or the split ``gnnpar train``
    makes from the blocks' forward + backward times
    (:func:`~gnnpar.parallel.pipeline.stages.split_by_cost`)."""
    from gnnpar.parallel.pipeline.stages import bounds, split_by_cost

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


def _estimate(cfg, ds) -> dict[str, int]:
    from gnnpar.models.memory import estimate_bytes

    return estimate_bytes(cfg, ds, 1)


# ---------------------------------------------------------------- gloo between two ranks
def comm_rank(
    sizes: tuple[int, ...],
    repeats: int,
    timeout_s: float,
    pipelines: list[tuple[str, dict]],
    corun: tuple[dict, dict | None, dict | None] | None,
    sampled: tuple[dict, float, dict | None] | None,
    rounds: int,
    log_dir: str,
) -> dict | None:
    """One of two ranks started by gnnpar's launcher: all-reduce and pairwise exchange
    (``isend`` + ``irecv``, as gossip's) of each size, store round trips, and one real step of
    each two-stage pipeline in ``pipelines`` (``(key, train flags)``)."""
    import datetime

    import torch.distributed as dist

    from gnnpar.runtime import dist as gdist

    ctx = gdist.setup(timeout_s)
    timeout = datetime.timedelta(seconds=timeout_s)
    out: dict[str, list] = {"allreduce": [], "p2p": []}
    try:
        other = 1 - ctx.rank
        calls: dict[tuple[str, int], Callable[[], None]] = {}
        for n in sizes:
            t = torch.ones(max(1, n // 4))
            got = torch.empty_like(t)

            def allreduce(t=t):
                dist.all_reduce(t)

            def exchange(t=t, got=got):
                sent, recv = dist.isend(t, other), dist.irecv(got, other)
                recv.wait(timeout=timeout)
                sent.wait(timeout=timeout)

            calls[("allreduce", n)], calls[("p2p", n)] = allreduce, exchange
        times = interleaved_calls(calls, 3 * repeats)
        for (name, n), seconds in times.items():
            out[name].append([n, seconds])
        dist.barrier()
        key = "advise/rtt"
        # the median of many calls: a round trip is ~50 us here, and one descheduled call of
        # 10 ms in 36 made the mean 0.5 ms (gossip pays it several times a step)
        calls = []
        for _ in range(repeats * 16):
            t0 = time.perf_counter()
            ctx.store.add(key, 1)
            calls.append(time.perf_counter() - t0)
        rtt = statistics.median(calls)
        got = [None, None]
        dist.all_gather_object(got, rtt)
        out["store_rtt_s"] = max(got)
        steps = {key: _pipeline_step_s(flags, ctx) for key, flags in pipelines}
        out["pipeline_step_s"] = {key: t for key, (t, _) in steps.items()}
        out["pipeline_first_s"] = {key: first for key, (_, first) in steps.items()}
        if corun is not None:
            flags, straggle, gossip = corun
            corun_out = _corun_factor(flags, ctx, rounds, straggle=straggle, gossip=gossip)
            out["corun_factor"], out["sync_runs"] = corun_out[:2]
            out["after_pause_parts"], out["beside_straggler"] = corun_out[2:]
        if sampled is not None:
            flags, alone_s, straggle = sampled
            out["sampled_corun_factor"], out["after_pause"] = _sampled_corun_factor(
                flags, alone_s, ctx, rounds, straggle=straggle
            )
        return out if ctx.rank == 0 else None
    finally:
        gdist.teardown()


def _pipeline_step_s(flags: dict, ctx) -> tuple[float, float]:
    """Median seconds of a real step (schedule and optimizer) of pipeline's own plan, and what
    its first step took beyond that (torch.distributed.pipelining's set-up on first use: up
    to ~0.8 s on a 24K-node graph, which a 10-epoch run of one step an epoch pays once)."""
    import torch.distributed as dist

    from gnnpar.parallel import collectives
    from gnnpar.strategies import registry

    cfg = build_config(None, flags)
    ds = _probe_dataset(cfg)
    spec = registry.get(cfg.strategy.name)
    plan = spec.build(cfg, ds, ctx, spec.parallel_dims(cfg, ctx.world_size))
    batch = plan.source.batch

    def step() -> None:
        plan.optimizer.zero_grad(set_to_none=True)
        plan.step(batch)
        plan.optimizer.step()

    dist.barrier()
    t0 = time.perf_counter()
    step()  # warm-up
    # the median of up to 30 steps (~2 s): the step is mostly torch.distributed.pipelining's
    # own work per micro-batch (~5-10 ms a forward or backward on Cora against ~1 ms of
    # compute), which a descheduled moment stretches; a mean of 7 was off by up to 30%.
    # Every step is point-to-point between the ranks, so both take the same count.
    warm = max(collectives.gather_to_all(time.perf_counter() - t0))
    times = []
    for _ in range(max(REPEATS + 2, min(30, int(2.0 / max(warm, 1e-3))))):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    step_s = max(collectives.gather_to_all(statistics.median(times)))
    return step_s, max(0.0, warm - step_s)


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

    from gnnpar.parallel import collectives
    from gnnpar.strategies import registry

    cfg = build_config(None, flags)
    ds = _probe_dataset(cfg)
    spec = registry.get("allreduce")
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
    k1 = {**flags, "strategy": "allreduce", "sync-every": 1, "average": "grads"}
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
    from gnnpar.advise import simulate as sim
    from gnnpar.models.memory import FLOAT_BYTES

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

    from gnnpar.data.sampling.loader import shard_plan
    from gnnpar.parallel import collectives
    from gnnpar.runtime.dist import DistContext
    from gnnpar.strategies import registry

    cfg = build_config(None, flags)
    ds = _probe_dataset(cfg)
    per_epoch = _sampled_steps(cfg, ds, ctx.world_size)
    # batches of a rank's size, made and trained by a plan of one rank; built on both ranks,
    # as sharing the graph file gathers its path from every rank of the process group
    bs = cfg.strategy.batch_size
    size = min(bs, shard_plan(int(ds.data.train_mask.sum()), ctx.world_size, bs)[0])
    solo = build_config(None, {**flags, "batch-size": max(1, size)})
    spec = registry.get("sampled")
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
    from gnnpar.data.datasets import load_dataset

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
    from gnnpar.strategies import registry
    from gnnpar.training.loop import train

    with tempfile.TemporaryDirectory(prefix="gnnpar-advise-ranks-") as tmp:
        cfg = build_config(None, {**flags, "epochs": epochs, "out": tmp})
        spec = registry.get(cfg.strategy.name)
        plan = spec.build(cfg, ds, ctx, spec.parallel_dims(cfg, ctx.world_size))
        return train(cfg, _no_final(plan))


def _sampled_steps(cfg, ds, world: int) -> int:
    """sampled's steps per epoch on ``world`` ranks (as SampledSource counts them)."""
    from gnnpar.data.sampling.loader import shard_plan

    train = int(ds.data.train_mask.sum())
    steps = shard_plan(train, world, cfg.strategy.batch_size)[1]
    return min(steps, cfg.run.max_steps or steps)


def _sampled_probe(
    base: dict, needs: list[Need], prof: Profile, straggle: dict[str, Any] | None = None
) -> tuple[dict, float, dict | None] | None:
    """sampled's flags for the co-run probe on two ranks (the smallest batch size asked, made in
    the rank), what such a rank's batch costs alone (making and step, as profiled), and the
    stragglers' flags for its after-pause probe (None: no straggler), as given."""
    sizes = sorted(n.batch_size for n in needs if n.kind == "sampled")
    if not sizes:
        return None
    b, _ = sampled_batch_costs(prof, sizes[0], 2)
    flags = {**flags_for(base, "sampled", batch_size=sizes[0], loader_workers=0), "workers": 2}
    return flags, b["compute_s"] + b["main_sample_s"], straggle


def profile_comm(
    timeout_s: float,
    prof: Profile,
    threads: int,
    pipelines: list[tuple[str, dict]] = (),
    corun: tuple[dict, dict | None, dict | None] | None = None,
    sampled: tuple[dict, float, dict | None] | None = None,
) -> None:
    from gnnpar.runtime.launch import launch

    args = (COMM_SIZES, COMM_REPEATS, timeout_s, list(pipelines), corun, sampled, prof.rounds)
    out = launch(comm_rank, args, 2, timeout_s, threads=threads)[0]
    # a 2-rank ring all-reduce is 2 steps of bytes / 2: t = 2 a + bytes * b
    a, b = _line(out["allreduce"])
    ring = (a / 2, 1.0 / b)
    pa, pb = _line(out["p2p"])
    prof.comm = {
        "allreduce": out["allreduce"],
        "p2p": out["p2p"],
        "ring_step": ring,  # (latency s, bandwidth B/s) of one ring step
        "p2p_link": (pa, 1.0 / pb),
        "store_rtt_s": out["store_rtt_s"],
        "pipeline_step_s": out["pipeline_step_s"],  # "1x2xM" -> a real 2-rank step here
        "pipeline_first_s": out["pipeline_first_s"],  # "1x2xM" -> its first step's extra
        # a step in a real 2-rank run / alone (the median of the probe's rounds); absent where
        # the grid has no subgraph or pipeline configuration (predict then takes 1)
        **(
            {"corun_factor": statistics.median(out["corun_factor"])}
            if "corun_factor" in out
            else {}
        ),
        # the same for sampled's steps (DDP's hooks in the backward); absent: no sampled run
        **(
            {"sampled_corun_factor": statistics.median(out["sampled_corun_factor"])}
            if sampled
            else {}
        ),
    }

    def keep(into: dict[str, float], kind: str, key: str, rounds: list[float]) -> None:
        """A straggler probe's rounds, under the batches its ranks trained; the median kept."""
        into[key] = statistics.median(rounds)
        prof.probe_rounds[f"{kind}_{key}"] = rounds

    if out.get("after_pause"):  # sampled's: a rank's own batches (sampled_key)
        key = f"sampled{sampled_key(prof, sampled[0]['batch-size'], 2)}"
        keep(prof.after_pause, "after_pause", key, out["after_pause"])
    if out.get("after_pause_parts"):  # the subgraph strategies': the co-run probe's subgraphs
        key = f"parts{corun[0]['partitions']}"
        keep(prof.after_pause, "after_pause", key, out["after_pause_parts"])
    if out.get("beside_straggler"):
        key = f"parts{corun[0]['partitions']}"
        keep(prof.beside_straggler, "beside_straggler", key, out["beside_straggler"])
    if "corun_factor" in out:
        prof.probe_rounds["corun_factor"] = out["corun_factor"]
        wakes = [wake_s(run, prof.comm, prof.param_bytes) for run in out["sync_runs"]]
        prof.comm["wake_s"] = statistics.median(wakes)  # simulate.Cluster.wake_s
        prof.comm["wake_rounds_s"] = wakes
    if sampled:
        prof.probe_rounds["sampled_corun_factor"] = out["sampled_corun_factor"]


def _line(points: list[list[float]]) -> tuple[float, float]:
    """``t = a + b * bytes`` fitted to relative error (weights 1 / t^2): an ordinary least
    squares fit is ruled by the largest messages and leaves the latency, which rules the small
    ones (a GCN's gradients are ~100 KB), anywhere, even negative. Both kept positive."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    w = [1.0 / max(y, 1e-9) ** 2 for y in ys]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs)) / sw
    my = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx if sxx else 0.0
    b = max(b, 1e-12)
    return max(my - b * mx, 1e-7), b


# what one measuring round fills in (:func:`_measure_in_rounds`); its memory estimates, the same
# in every round, go straight into the profile's (``replace`` keeps that dict)
MEASURED = (
    "full_step_s",
    "full_first_s",
    "parts_step_s",
    "parts_first_s",
    "slowed_share",
    "sampled",
    "pipeline",
)
MEASURED += ("loader_start_s",)
MEASURE_ROUND_BUDGET_S = 10.0  # more rounds only where one takes at most this long


def _measure_in_rounds(measure: Callable[[Profile], Profile], prof: Profile) -> None:
    """Every batch kind's timings, taken in ``prof.rounds`` rounds where one round takes
    at most :data:`MEASURE_ROUND_BUDGET_S` (else one), each timing the median of its rounds:
    on a VM whose speed drifts by up to 2x within a minute, one round taken in a fast (or slow)
    moment moved every prediction with it (a Cora grid's all 30-45% too fast, while the same
    steps timed again later in the profile took 1.4-2.0x as long)."""

    def fresh() -> Profile:
        return replace(prof, parts_step_s={}, parts_first_s={}, sampled={}, pipeline={})

    t0 = time.perf_counter()
    rounds = [measure(fresh())]
    if time.perf_counter() - t0 <= MEASURE_ROUND_BUDGET_S:
        rounds += [measure(fresh()) for _ in range(prof.rounds - 1)]
    for name in MEASURED:
        setattr(prof, name, _median_of([getattr(r, name) for r in rounds]))


def _median_of(values: list[Any]) -> Any:
    """The median of each float over rounds of the same structure (dicts, lists, tuples);
    anything else (ints: sizes, counts; strings; None) as the first round has it."""
    first = values[0]
    if isinstance(first, float) and all(isinstance(v, int | float) for v in values):
        return statistics.median(values)
    if isinstance(first, dict) and all(
        isinstance(v, dict) and v.keys() == first.keys() for v in values
    ):
        return {k: _median_of([v[k] for v in values]) for k in first}
    if isinstance(first, list | tuple) and all(
        isinstance(v, list | tuple) and len(v) == len(first) for v in values
    ):
        return type(first)(_median_of([v[i] for v in values]) for i in range(len(first)))
    return first


def take_profile(
    base: dict[str, Any],
    needs: Iterable[Need],
    threads: int,
    comm: bool,
    timeout_s: float,
    loader_workers: bool = False,
    rounds: int = PROBE_ROUNDS,
    straggle: dict[str, Any] | None = None,
    ds=None,
    corun_partitions: int | None = 8,
) -> Profile:
    """Measure what ``needs`` lists; ``comm``: also gloo between two ranks (starts them);
    ``loader_workers``: also a loader worker's start-up (starts one); ``rounds``: of every
    timing and ratio probe (``--profile-rounds``), the median of each kept; ``straggle``: the
    ``--slowdown``/``--jitter`` flags of the grid's stragglers on the probe's two ranks (rank 1
    the slowest), for the after-pause probes (:func:`_straggled_step_ratio`,
    :func:`_beside_straggler_ratio`); ``ds``: the dataset, where the caller loaded it already;
    ``corun_partitions``: the subgraphs of the co-run probe where ``needs`` has no count of 2 or
    more (None: no co-run probe then).

    The reference work of :mod:`gnnpar.advise.speed` is timed at the profile's start, after its
    timings, after the real loop's probe and at its end (``speed_ref_s``): whether the
    machine's speed changed while it was profiled."""
    from gnnpar.data.datasets import load_dataset
    from gnnpar.models.memory import FLOAT_BYTES, parameter_count
    from gnnpar.runtime.launch import start_fork_server_for_ranks

    t_start = time.perf_counter()
    needs = list(needs)
    if comm:  # before the loader workers below start it for themselves (see there)
        start_fork_server_for_ranks(2, threads, (__name__,))
    cfg = build_config(None, flags_for(base, "sequential"))
    d = cfg.data
    if ds is None:
        ds = load_dataset(d.dataset, d.data_root, d.scale, cfg.run.seed, timeout_s)
    image = ds.kind == "image"
    shapes: list[tuple[int, int, int]] = []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        params = parameter_count(cfg, ds.num_features, ds.num_classes, ds.multilabel)
        prof = Profile(
            machine=cpu_model(),
            cores=os.cpu_count() or 1,
            threads=threads,
            dataset=d.dataset,
            model=cfg.model.name,
            epochs=cfg.run.epochs,
            seed=cfg.run.seed,
            num_nodes=int(ds.train_x[0, 0].numel()) if image else ds.num_nodes,
            num_train=int(ds.train_x.size(0)) if image else int(ds.data.train_mask.sum()),
            param_bytes=params * FLOAT_BYTES,
            base_rss_bytes=current_rss(),
            kind=ds.kind,
            batch_size=cfg.strategy.batch_size if image else 0,
            max_steps=cfg.run.max_steps,
            rounds=rounds,
        )
        prof.speed_ref_s.append(reference_s())
        with tempfile.TemporaryDirectory(prefix="gnnpar-advise-loop-") as tmp:
            prof.loop_step_s = loop_overhead_s(base, ds, tmp)
        if image:  # ViG: sequential and every pipeline shape, from one set of block timings
            shapes = [(n.replicas, n.stages, n.chunks) for n in needs if n.kind == "pipeline"]
            profile_images(base, ds, shapes, prof)
        else:
            full = any(n.kind == "full" for n in needs)
            parts = [n.partitions for n in needs if n.kind == "parts"]
            sizes = seed_batch_sizes([n for n in needs if n.kind == "sampled"], prof.num_train)
            shapes = [(n.replicas, n.stages, n.chunks) for n in needs if n.kind == "pipeline"]
            if comm:  # the two-stage shapes whose real step calibrates every pipeline's (below)
                shapes += [(1, 2, m) for _, _, m in shapes if cfg.model.layers >= 2]

            def measure(into: Profile) -> Profile:
                profile_graph_batches(base, ds, parts, full, into)
                if sizes:
                    profile_sampled(base, ds, sizes, into, workers=loader_workers)
                if shapes:
                    profile_pipeline(base, ds, shapes, into)
                return into

            _measure_in_rounds(measure, prof)
            prof.speed_ref_s.append(reference_s())
            if parts or full:
                p = min(parts) if parts else None
                step_s = statistics.fmean(prof.parts_step_s[str(p)]) if p else prof.full_step_s
                with tempfile.TemporaryDirectory(prefix="gnnpar-advise-loop-") as tmp:
                    rounds, drift = real_loop_factor(base, ds, tmp, p, step_s, asked=prof.rounds)
                prof.loop_factor = statistics.median(rounds)
                prof.probe_rounds["loop_factor"] = rounds
                if drift:  # the same steps timed again later, over the profile's timing (1)
                    prof.probe_rounds["step_drift"] = [1.0, *drift]
                prof.speed_ref_s.append(reference_s())
    finally:
        torch.set_num_threads(before)
    if comm and image:  # gloo's costs only: a real 1000-image pipeline step takes minutes
        profile_comm(timeout_s, prof, threads)
    elif comm:
        chunks = sorted({m for r, s, m in shapes if (r, s) == (1, 2)})
        pipelines = [
            (f"1x2x{m}", {**flags_for(base, "pipeline", stages=2, chunks=m), "workers": 2})
            for m in chunks
        ]
        # subgraph steps on two ranks at once: for the subgraph strategies and the pipelines'
        # blocks (predict's _slowdown); a sampled-only grid has its own factor and skips it
        parts = sorted(n.partitions for n in needs if n.kind == "parts" and n.partitions >= 2)
        parts = parts or ([corun_partitions] if corun_partitions else [])
        corun = None
        if parts and any(n.kind in ("parts", "pipeline") for n in needs):
            flags = flags_for(base, "allreduce", partitions=parts[0], sync_every=20)
            gossip = None
            if straggle:  # and gossip's fast rank beside the straggler (the pool's main worker)
                gossip = {
                    **flags_for(base, "gossip", partitions=parts[0], sync_every=20),
                    "workers": 2,
                }
            corun = ({**flags, "workers": 2}, straggle, gossip)
        sampled = _sampled_probe(base, needs, prof, straggle)
        profile_comm(timeout_s, prof, threads, pipelines, corun, sampled)
    from gnnpar.training.metrics import peak_memory

    prof.speed_ref_s.append(reference_s())
    prof.peak_rss_bytes = peak_memory(None)["peak_rss_bytes"]
    prof.profile_s = time.perf_counter() - t_start
    return prof
