"""What a profile is (:class:`Need`, :class:`Profile`) and how it times: the mean of
repetitions, calls taken in turns, the median of rounds, and a strategy's plan built from flags."""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gnnpar.configure import NEEDS, STRATEGY_KEYS, build_config
from gnnpar.runtime.dist import DistContext
from gnnpar.strategies import registry
from gnnpar.strategies.spec import SIM_ONE_RANK, SIM_PIPELINE, SIM_SAMPLED

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
    """One thing to measure: ``kind`` full | parts | sampled | pipeline, with its settings;
    ``plan``: the strategy whose plan measures it (``Advice.own_plan``; "": the kind's
    :func:`reference`). Two needs that differ in ``plan`` only are one measurement (the first
    one's plan measures it)."""

    kind: str
    partitions: int = 0
    batch_size: int = 0
    replicas: int = 1
    stages: int = 1
    chunks: int = 1
    world: int = 1  # sampled: the ranks that share the training nodes (see seed_batch_sizes)
    plan: str = field(default="", compare=False)


# what each kind of need measures: a step of this simulation's
MEASURES = {"full": SIM_ONE_RANK, "parts": SIM_ONE_RANK, "sampled": SIM_SAMPLED}
MEASURES["pipeline"] = SIM_PIPELINE


def reference_of(simulation: str, replicas: bool = False) -> str:
    """The first registered strategy of ``simulation`` advised by default, with (``replicas``)
    or without data-parallel copies of a pipeline (it reads --replicas): the built-in ones
    sequential, allreduce, gossip, pipeline (hybrid), sampled. The two-rank probes train these
    (ranks know the built-in strategies only)."""
    return next(
        s.name
        for s in registry.specs()
        if s.advice is not None
        and s.advice.default
        and s.advice.simulation == simulation
        and ("replicas" in s.reads) == replicas
    )


def reference(kind: str, replicas: int = 1) -> str:
    """The strategy whose plan measures a need of ``kind`` where its strategy does not declare
    its own (``Advice.own_plan``); for ``full`` also the config of the settings every
    configuration shares."""
    return reference_of(MEASURES[kind], replicas > 1)


def plan_of(needs, kind: str) -> str:
    """The plan that measures the needs of ``kind`` (the first one's, else the reference)."""
    return next((n.plan for n in needs if n.kind == kind and n.plan), "") or reference(kind)


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
    # a sharded folder's (each host holding its shard, sampled): the shards it was prepared
    # with ("hosts"), its edge cut's share ("edge_cut_share") and a feature row as exchanged
    # ("row_bytes", float32); empty for an unsharded graph (gnnpar.advise.shard_exchange)
    shards: dict[str, Any] = field(default_factory=dict)
    # training from a prepared folder (advise/profile/disk.py): its features' and the feature
    # cache's bytes, the memory the run may use, the folder's read rate; empty: from memory
    disk: dict[str, Any] = field(default_factory=dict)

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
MEASURED += ("loader_start_s", "disk")
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
