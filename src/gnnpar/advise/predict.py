"""The grid of configurations ``gnnpar advise`` considers, and each one simulated from a profile.

A :class:`Candidate` is one ``gnnpar train`` run on the described cluster: a strategy and its
settings (``gnnpar train``'s flag names, as advice.json's contract says). :func:`build_grid`
makes the default grid (every strategy that applies, over a small grid of its settings; a
setting the user gave is kept fixed). :func:`predict` turns a candidate and a
:class:`~gnnpar.advise.profile.Profile` into the inputs of the strategy's simulation
(:mod:`gnnpar.advise.simulate`) with gnnpar's own assignment of batches to ranks: the static
deal of :func:`~gnnpar.training.sources.assign_parts` and :func:`~gnnpar.training.sources.epoch_order`
(allreduce), the pool's order of :meth:`~gnnpar.parallel.gossip.pool.WorkPool.order` (gossip),
:func:`~gnnpar.data.sampling.loader.shard_plan` (sampled).

ViG (images): a sequential epoch is ``ceil(images / B)`` steps, a pipeline or hybrid epoch
``floor(images / (R B))`` pipeline steps (:func:`image_steps`, as gnnpar's image sources make
them); their speed-up is over one rank training the same images (images per second).

Cores. The hosts are taken to be like this machine (its core count). Where the ranks of a
host ask for more cores than it has (``ranks x (threads + busy loader workers)``), every step
on that host is slowed by the ratio (time-sharing); a loader worker counts as busy for the
share of a step it spends making a batch and handing it over (its CPU per batch, measured with
the batch moved into shared memory and sent; the rank's CPU to receive one counts in its step:
:func:`gnnpar.advise.profile._loader_costs`). Where a host runs several ranks, their steps are
slowed further by the factor measured in a real two-rank run here (``comm["corun_factor"]``,
:func:`gnnpar.advise.profile._corun_factor`: 1.0-2.9 on this 2-vCPU machine, the two vCPUs
sharing one core's resources), whatever the number of ranks per host. Hosts that are not
machines of their own (``ClusterSpec.hosts_per_machine``: the namespace hosts of ``advise
--validate --hosts 2`` share this machine) share their cores the same way.

Strategies. Which strategies advise considers, and how, is read from the registry: a strategy
whose :class:`~gnnpar.strategies.spec.StrategySpec` declares ``advice``
(:class:`~gnnpar.strategies.spec.Advice`) is simulated by the simulation it names
(:data:`SIMULATE`), over the settings grid its ``reads`` call for (:data:`GRIDS`); it takes the
grid's stragglers where it reads ``--slowdown``/``--jitter``. No strategy name is written here.

From disk (a prepared folder): a sampled batch's maker also waits for the feature reads that
the run's feature cache and the page cache miss (:func:`gnnpar.advise.profile.disk.io_per_step`:
the bytes a profiled batch read from the folder, the share of them the memory the run may use
leaves to the disk, the folder's measured read rate); with loader workers that wait overlaps the
rank's compute as the making does. advice.json's sampled predictions then carry ``disk``.

The batch made on a thread. Where a sampled run makes its batches in the training process
(no loader workers) from a prepared folder whose rows the feature cache does not all hold, or
across shards (where it always makes them so), gnnpar makes batch i+1 on a thread while the
model trains on batch i (:func:`gnnpar.training.sources.made_ahead`, the shards'
``exchange_ahead``): simulated as one loader worker that holds one batch ahead and starts as the
rank's first batch does, its making (and the exchanges, the reads) overlapping the rank's
compute, its CPU sharing the host's cores as a worker's does (the batch taken to fit in the
memory the run may use). ``GNNPAR_BATCH_AHEAD=0`` in advise's environment predicts the run that
makes every batch in line, as it does in training.

Memory per rank: the bare rank measured here plus :func:`gnnpar.models.memory.estimate_bytes`
for the run (a lower bound: see there), a pipeline stage holding its share of the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from gnnpar.advise import shard_exchange
from gnnpar.advise import simulate as sim
from gnnpar.advise.fit import default_partitions
from gnnpar.advise.profile import (
    Need,
    Profile,
    flags_for,
    image_step_s,
    sampled_batch_costs,
    sampled_key,
)
from gnnpar.advise.profile.disk import io_per_step
from gnnpar.data.sampling.loader import shard_plan
from gnnpar.parallel.gossip.pool import WorkPool
from gnnpar.strategies import registry
from gnnpar.strategies.spec import (
    SIM_GOSSIP,
    SIM_LOCKSTEP,
    SIM_ONE_RANK,
    SIM_PIPELINE,
    SIM_SAMPLED,
    Advice,
    StrategySpec,
)
from gnnpar.training.sources import PREFETCH, assign_parts, batch_ahead_allowed, epoch_order

# The default grid (issue 22): the settings the studies vary
SYNC_EVERY = (1, 20)
CHUNKS = (2, 4)
IMAGE_CHUNKS = (2, 4, 5, 10)  # ViG: study 000's 5 and 10 too (those that divide --batch-size)
BATCH_SIZES = (512, 1024)
LOADER_WORKERS = (0, 2)
SEED_DEALS = shard_exchange.SEED_DEALS  # --seeds, where the strategy reads it, across shards


def advised() -> tuple[str, ...]:
    """Every registered strategy that advise can consider (its spec declares ``advice``), in
    the registry's order."""
    return tuple(s.name for s in registry.specs() if s.advice is not None)


def default_strategies() -> tuple[str, ...]:
    """The strategies advise considers when ``--strategies`` is not given."""
    return tuple(s.name for s in registry.specs() if s.advice is not None and s.advice.default)


def __getattr__(name: str) -> tuple[str, ...]:
    """``ALL``, ``DEFAULT``, ``STRAGGLING``: the registry's advised, default and straggled
    strategies at the time they are read (a strategy registered later counts too)."""
    if name == "ALL":
        return advised()
    if name == "DEFAULT":
        return default_strategies()
    if name == "STRAGGLING":
        return tuple(s for s in advised() if straggles(s))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def advice_of(name: str) -> Advice:
    """The advise facts of ``--strategy name`` (a ValueError where it declares none)."""
    advice = registry.get(name).advice
    if advice is None:
        raise ValueError(f"gnnpar advise cannot simulate --strategy {name}")
    return advice


def simulation_of(name: str) -> str:
    return advice_of(name).simulation


def straggles(name: str) -> bool:
    """Whether the strategy takes the grid's stragglers (it reads --slowdown or --jitter)."""
    r = registry.get(name).reads
    return "slowdown" in r or "jitter" in r


def replicated(name: str) -> bool:
    """A pipeline strategy with data-parallel copies of the pipeline (it reads --replicas)."""
    return "replicas" in registry.get(name).reads


def one_rank_reference() -> str:
    """The registered one-rank strategy that speed-ups are measured against (the first)."""
    return next(
        s.name for s in registry.specs() if s.advice and s.advice.simulation == SIM_ONE_RANK
    )


@dataclass(frozen=True)
class ClusterSpec:
    hosts: int
    ranks_per_host: int
    network: sim.Link | None = None  # between hosts
    # hosts that share one machine's cores: 1 on a real cluster; 2 for the two network-namespace
    # hosts of ``advise --validate --hosts 2``, whose ranks time-share this machine's cores
    hosts_per_machine: int = 1

    @property
    def world(self) -> int:
        return self.hosts * self.ranks_per_host


@dataclass
class Candidate:
    strategy: str
    settings: dict[str, Any]
    world: int

    def key(self) -> tuple:
        return (self.strategy, tuple(sorted(self.settings.items())), self.world)

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.settings.items()]
        return f"{self.strategy}({', '.join(parts)})" if parts else self.strategy

    def need(self) -> Need:
        """What the profile measures for it, through its own plan where its spec says so."""
        s, advice = self.settings, advice_of(self.strategy)
        simulation, plan = advice.simulation, self.strategy if advice.own_plan else ""
        if simulation == SIM_ONE_RANK:
            if "partitions" in s:
                return Need("parts", partitions=s["partitions"], plan=plan)
            return Need("full", plan=plan)
        if simulation in (SIM_LOCKSTEP, SIM_GOSSIP):
            return Need("parts", partitions=s["partitions"], plan=plan)
        if simulation == SIM_SAMPLED:
            return Need("sampled", batch_size=s["batch_size"], world=self.world, plan=plan)
        replicas = s.get("replicas", 1)
        shape = {"replicas": replicas, "stages": s["stages"], "chunks": s["chunks"]}
        return Need("pipeline", **shape, plan=plan)


@dataclass
class Prediction:
    candidate: Candidate
    epoch_s: float
    train_time_s: float
    speedup: float
    peak_bytes_per_rank: int
    bytes_on_network: float  # between hosts (one host: between ranks), whole run
    wait_share: float  # of the ranks' time, blocked on others or on data
    result: sim.SimResult = field(repr=False)
    # training from a prepared folder: a step's reads (advise/profile/disk.io_per_step)
    disk: dict[str, float] | None = None
    # across shards: a step's exchange with the other hosts (:func:`exchange_of`)
    exchange: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return (
            {
                "strategy": c.strategy,
                "settings": dict(c.settings),
                "epoch_s": self.epoch_s,
                "train_time_s": self.train_time_s,
                "speedup": self.speedup,
                "peak_bytes_per_rank": self.peak_bytes_per_rank,
                "workers": c.world,
                "bytes_on_network": self.bytes_on_network,
                "wait_share": self.wait_share,
            }
            | ({"disk": dict(self.disk)} if self.disk else {})
            | ({"exchange": dict(self.exchange)} if self.exchange else {})
        )


def build_grid(
    strategies: tuple[str, ...],
    world: int,
    layers: int,
    fixed: dict[str, Any],
    images: int = 0,
    hosts: int = 1,
) -> list[Candidate]:
    """Every configuration of ``strategies`` on ``world`` ranks of ``hosts`` hosts; ``fixed``:
    settings the user gave (flag names with underscores), which replace that setting's grid.
    ``images``: ViG's ``--batch-size`` (0: a graph), whose chunks must divide it (equal
    micro-batches). Each strategy's grid is its simulation's (:data:`GRIDS`) over the settings
    it reads."""
    g = GridAxes(world, layers, images, fixed, hosts)
    out: list[Candidate] = []
    for name in strategies:
        spec = registry.get(name)
        out += GRIDS[advice_of(name).simulation](spec, g)
    unique: dict[tuple, Candidate] = {}
    for c in out:
        unique.setdefault(c.key(), c)
    return list(unique.values())


@dataclass(frozen=True)
class GridAxes:
    """What a strategy's grid is made from: the cluster's ranks, the model's layers, ViG's
    ``--batch-size`` (0: a graph), the settings the user gave (``fixed``) and the hosts."""

    world: int
    layers: int
    images: int
    fixed: dict[str, Any]
    hosts: int = 1

    def axis(self, name: str, default) -> tuple:
        """The user's value of setting ``name`` alone, or the default grid."""
        f = self.fixed
        return (f[name],) if f.get(name) is not None else tuple(default)

    @property
    def partitions(self) -> tuple:
        return self.axis("partitions", (default_partitions(self.world),))

    @property
    def chunks(self) -> tuple:
        n = self.images
        if n:
            return self.axis("chunks", (m for m in IMAGE_CHUNKS if m <= n and n % m == 0))
        return self.axis("chunks", CHUNKS)


def _one_rank_grid(spec: StrategySpec, g: GridAxes) -> list[Candidate]:
    """The whole graph on one rank; and each --partitions where the strategy reads it (not
    for images: --partitions cuts graphs only)."""
    out = [Candidate(spec.name, {}, 1)]
    if not g.images and "partitions" in spec.reads:
        out += [Candidate(spec.name, {"partitions": p}, 1) for p in g.partitions]
    return out


def _subgraph_grid(spec: StrategySpec, g: GridAxes) -> list[Candidate]:
    """Data parallel on subgraphs (2 ranks or more): --partitions x --sync-every, and
    --average where the user gave it."""
    out: list[Candidate] = []
    if g.world < 2:
        return out
    for p in g.partitions:
        for k in g.axis("sync_every", SYNC_EVERY):
            settings = {"partitions": p, "sync_every": k}
            if g.images:  # no subgraphs of images: train's own check says why not
                settings.pop("partitions")
            if g.fixed.get("average") and "average" in spec.reads:
                settings["average"] = g.fixed["average"]
            out.append(Candidate(spec.name, settings, g.world))
    return out


def _pipeline_grid(spec: StrategySpec, g: GridAxes) -> list[Candidate]:
    """One stage per rank (2..layers ranks) x --chunks; with --replicas (the strategy reads
    it): every stage count 2..layers that leaves 2 or more copies, x --chunks."""
    out: list[Candidate] = []
    if not replicated(spec.name):
        if 2 <= g.world <= g.layers:
            for m in g.chunks:
                if g.fixed.get("schedule") == "1f1b" and m < g.world:
                    continue
                out.append(Candidate(spec.name, _pipe(g.world, m, 1, g.fixed), g.world))
        return out
    for stages in g.axis("stages", range(2, g.layers + 1)):
        if g.world % stages or g.world // stages < 2:
            continue
        for m in g.chunks:
            settings = _pipe(stages, m, g.world // stages, g.fixed)
            out.append(Candidate(spec.name, settings, g.world))
    return out


def _sampled_grid(spec: StrategySpec, g: GridAxes) -> list[Candidate]:
    """--batch-size x --loader-workers; x --seeds (each deal) on several hosts where the
    strategy reads it (the graph must be sharded: :func:`gnnpar.advise.fit.fit_grid` keeps
    the setting only then)."""
    deals = g.axis("seeds", SEED_DEALS) if g.hosts > 1 and "seeds" in spec.reads else (None,)
    return [
        Candidate(
            spec.name,
            {"batch_size": bs, "loader_workers": w} | ({"seeds": d} if d else {}),
            g.world,
        )
        for bs in g.axis("batch_size", BATCH_SIZES)
        for w in g.axis("loader_workers", LOADER_WORKERS)
        for d in deals
    ]


GRIDS = {
    SIM_ONE_RANK: _one_rank_grid,
    SIM_LOCKSTEP: _subgraph_grid,
    SIM_GOSSIP: _subgraph_grid,
    SIM_PIPELINE: _pipeline_grid,
    SIM_SAMPLED: _sampled_grid,
}


def _pipe(stages: int, chunks: int, replicas: int, fixed: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {"stages": stages, "chunks": chunks}
    if replicas > 1:
        s["replicas"] = replicas
    if fixed.get("schedule"):
        s["schedule"] = fixed["schedule"]
    return s


def make_cluster(spec: ClusterSpec, prof: Profile, world: int) -> sim.Cluster:
    """The cluster for a run of ``world`` ranks: one rank is one host; else the spec's."""
    comm = prof.comm
    ring = sim.Link(*comm["ring_step"]) if comm else sim.Link(0.0, math.inf)
    p2p = sim.Link(*comm["p2p_link"]) if comm else sim.Link(0.0, math.inf)
    if world == 1:
        return sim.Cluster(1, 1, ring, p2p)
    wake = comm.get("wake_s", 0.0)  # profiles from before: the links alone
    return sim.Cluster(spec.hosts, spec.ranks_per_host, ring, p2p, spec.network, wake)


def predict(
    c: Candidate,
    prof: Profile,
    spec: ClusterSpec,
    stragglers: sim.Stragglers,
    epochs: int,
) -> Prediction:
    res = simulate(c, prof, spec, stragglers, epochs)
    if prof.kind == "image" and simulation_of(c.strategy) == SIM_PIPELINE:
        one = _same_images_on_one_rank(c, prof, epochs)
    else:
        one = simulate(_one_rank(c), prof, spec, sim.NONE, epochs)
    busy, wait = sum(res.busy_s), sum(res.wait_s)
    cluster = make_cluster(spec, prof, c.world)
    moved = res.bytes_between_hosts if cluster.hosts > 1 else res.bytes_moved
    moved += _shard_bytes(c, prof, cluster, epochs)
    exchange = exchange_of(c, prof, cluster)
    return Prediction(
        c,
        res.mean_epoch_s,
        res.train_time_s,
        one.train_time_s / res.train_time_s if res.train_time_s > 0 else math.inf,
        memory_per_rank(c, prof),
        moved,
        wait / (busy + wait) if busy + wait > 0 else 0.0,
        res,
        _disk_of(c, prof),
        exchange,
    )


def _across(c: Candidate, prof: Profile, cluster: sim.Cluster) -> bool:
    """A sampled run across the shards of several hosts (the spec says it trains so)."""
    return bool(
        advice_of(c.strategy).across_shards
        and prof.shards
        and cluster.hosts > 1
        and simulation_of(c.strategy) == SIM_SAMPLED
    )


def _step_traffic(c: Candidate, prof: Profile, cluster: sim.Cluster) -> shard_exchange.Traffic:
    """A step's exchange across shards, its seeds dealt as the candidate's ``--seeds``."""
    key = sampled_key(prof, c.settings["batch_size"], c.world)
    seeds = c.settings.get("seeds", "global")
    return shard_exchange.step_traffic(prof, key, cluster, seeds)


def exchange_of(c: Candidate, prof: Profile, cluster: sim.Cluster) -> dict[str, Any] | None:
    """advice.json's ``exchange`` of a sampled run across shards (None otherwise): the deal of
    seeds, each hop's share of new nodes owned by another host, the bytes one rank sends per
    step (what result.json's ``exchange_bytes_per_step`` measures) and the seconds a step
    spends in the exchanges on the cluster's link."""
    if not _across(c, prof, cluster):
        return None
    t = _step_traffic(c, prof, cluster)
    return {
        "seeds": c.settings.get("seeds", "global"),
        "remote_share_per_hop": list(t.remote_shares),
        "bytes_per_step": t.bytes_sent,
        "seconds_per_step": shard_exchange.exchange_s(cluster, t),
    }


def _shard_bytes(c: Candidate, prof: Profile, cluster: sim.Cluster, epochs: int) -> float:
    """A sampled run across shards: its frontiers' and rows' exchange over the whole run (the
    simulation's bytes are the gradients' alone)."""
    if not _across(c, prof, cluster):
        return 0.0
    steps = shard_plan(prof.num_train, c.world, c.settings["batch_size"])[1]
    return shard_exchange.run_bytes(_step_traffic(c, prof, cluster), steps, epochs, c.world)


def _disk_of(c: Candidate, prof: Profile) -> dict[str, float] | None:
    """A sampled candidate's reads from a prepared folder per step (None: from memory)."""
    if simulation_of(c.strategy) != SIM_SAMPLED or not prof.disk:
        return None
    key = sampled_key(prof, c.settings["batch_size"], c.world)
    return io_per_step(prof, key)


def _one_rank(c: Candidate) -> Candidate:
    """The same batches on one rank: the speed-up's reference."""
    s, simulation = c.settings, simulation_of(c.strategy)
    if simulation in (SIM_LOCKSTEP, SIM_GOSSIP):
        return Candidate(one_rank_reference(), {"partitions": s["partitions"]}, 1)
    if simulation == SIM_PIPELINE:
        return Candidate(one_rank_reference(), {}, 1)
    if simulation == SIM_SAMPLED:
        return Candidate(c.strategy, dict(s), 1)
    return c


def _same_images_on_one_rank(c: Candidate, prof: Profile, epochs: int) -> sim.SimResult:
    """ViG: sequential training of the images a pipeline or hybrid epoch trains (whole global
    batches only, each copy's ``--batch-size`` images one sequential step), so that the
    speed-up counts images per second; a sequential epoch also trains the short last batch."""
    replicas = c.settings.get("replicas", 1)
    steps = [
        image_step_s(prof, n) * _slowdown(prof, 1) + prof.loop_step_s
        for n in image_steps(prof, replicas, True)
        for _ in range(replicas)
    ]
    return sim.lockstep(make_cluster(ClusterSpec(1, 1), prof, 1), [[steps] * epochs], 1, 0)


def memory_per_rank(c: Candidate, prof: Profile) -> int:
    n = c.need()
    key = {
        "full": "full",
        "parts": f"parts{n.partitions}",
        "sampled": f"sampled{n.batch_size}",
        "pipeline": f"pipeline{n.replicas}x{n.stages}x{n.chunks}",
    }[n.kind]
    est = prof.memory.get(key, {})
    need = sum(est.values())
    if n.kind == "pipeline":
        need = math.ceil(need / n.stages)
    return int(prof.base_rss_bytes + need)


def _graph_loop_s(prof: Profile) -> float:
    """What the training loop adds to a subgraph's or the full graph's step beyond the
    profile's factors: nothing where the profile timed the real loop on these batches (the
    loop factor, and the co-run factor, are the real loop's whole step over the step alone,
    the loop's own work included: adding its cost, ``loop_step_s``, again counted it twice),
    else ``loop_step_s``."""
    return 0.0 if "loop_factor" in prof.probe_rounds else prof.loop_step_s


def _time_share(prof: Profile, ranks_per_host: int, busy_workers: float = 0.0) -> float:
    """How much longer a step takes when a host's ranks (and their busy loader workers) ask for
    more cores than there are: their threads time-share them."""
    return max(1.0, ranks_per_host * (prof.threads + busy_workers) / max(prof.cores, 1))


def _slowdown(
    prof: Profile, ranks_per_host: int, busy_workers: float = 0.0, kind: str = "corun_factor"
) -> float:
    """Steps of a host with ``ranks_per_host`` busy ranks against the profile's lone process:
    time-sharing where they ask for more cores than there are, times the slowdown measured
    with two ranks training at once (shared cores, SMT siblings, memory bandwidth)."""
    cores = max(prof.cores, 1)
    share = _time_share(prof, ranks_per_host, busy_workers)
    if ranks_per_host == 1:
        return share * prof.loop_factor
    # the co-run factor was measured with two ranks of prof.threads each on this machine: the
    # part of it that time-sharing explains is already in ``share``; the rest (SMT siblings,
    # memory bandwidth, gloo's threads, the real loop's slow steps) comes on top. It is never
    # less than the real loop's factor of one rank alone (both measured, in separate probes: a
    # profile whose co-run factor came out under its loop factor predicted two hosts sharing
    # this machine faster than two hosts of their own)
    measured = prof.comm.get(kind) or prof.comm.get("corun_factor", 1.0)
    shared_then = max(1.0, 2 * prof.threads / cores)
    return share * max(prof.loop_factor, measured / shared_then)


def _corun_by_overlap(
    run, world: int, per_host: int, full: float, alone: float, passes: int = 4
) -> sim.SimResult:
    """Ranks that do not compute in step: gossip's (a rank far from the store, across a link,
    spends most of its time on store round trips, and the rank beside it then computes nearly
    alone) and sampled's (a straggler pauses after DDP's all-reduce, while the others make and
    train their next batch).
    ``full`` slows a step as if every rank sharing its machine computed all the time (the
    co-run factor is measured so), ``alone`` as a rank alone on it. ``run(speed)`` simulates with
    each rank's steps ``speed`` times ``full``'s; each pass gives a rank the factor
    ``alone + (full - alone) * u``, ``u`` the mean share of the run that the other ranks of its
    machine spent computing in the pass before, until the factors settle (1%) or ``passes``
    more runs. allreduce keeps ``full``: weighting it so too was tried (BENCHMARKS.md,
    2026-11-27) and made one validation grid better and another worse."""
    speed = [1.0] * world
    result = run(speed)
    if per_host < 2 or full <= alone:
        return result
    for _ in range(passes):
        total = result.train_time_s or 1.0
        share = [x / total for x in result.compute_s]
        new = []
        for r in range(world):
            first = r // per_host * per_host
            others = [share[o] for o in range(first, min(first + per_host, world)) if o != r]
            u = min(1.0, sum(others) / len(others)) if others else 0.0
            new.append((alone + (full - alone) * u) / full)
        if max(abs(a - b) for a, b in zip(new, speed, strict=True)) < 0.01:
            break
        speed = new
        result = run(speed)
    return result


def _resumed(strag: sim.Stragglers, prof: Profile, key: str, f: float) -> sim.Stragglers:
    """``strag`` with the profile's after-pause factor of the batches ``key``: a straggler's
    step right after its pause, measured in a real straggled run against alone (co-running
    included), so it stands for the co-run factor ``f`` that the simulated steps carry (the
    simulation takes it instead of the rank's speed). None where not profiled."""
    after = prof.after_pause.get(key)
    return replace(strag, after_pause=None if after is None else after / f)


def _pause_per_step(stragglers: sim.Stragglers, slowed_s: float) -> float:
    """The slowest rank's mean pause per step whose slowed share is ``slowed_s`` seconds
    (:class:`~gnnpar.training.straggler.Straggler`: ``F - 1`` times it, and with ``--jitter``
    X a pause of up to X times it in one step of ten)."""
    slowest = max(stragglers.slowdown.values(), default=1.0)
    return ((slowest - 1.0) + 0.1 * stragglers.jitter / 2) * slowed_s


def _first_extra(prof: Profile, partitions: int) -> list[float]:
    """Per subgraph, what a rank's first step on it costs beyond the others (0 in profiles
    from before it was measured)."""
    steps = prof.parts_step_s[str(partitions)]
    return prof.parts_first_s.get(str(partitions)) or [0.0] * len(steps)


def simulate(
    c: Candidate, prof: Profile, spec: ClusterSpec, stragglers: sim.Stragglers, epochs: int
) -> sim.SimResult:
    """Simulate ``c``'s training with the simulation its strategy declares (:data:`SIMULATE`):
    the phases common to all (the cluster, the ranks sharing a machine, the stragglers it
    takes) here, the rest in each simulation's function."""
    cluster = make_cluster(spec, prof, c.world)
    # the ranks that share one machine's cores (a host's, or several hosts' on one machine)
    per_host = cluster.ranks_per_host * (spec.hosts_per_machine if c.world > 1 else 1)
    strag = stragglers if straggles(c.strategy) else sim.NONE
    loop = prof.loop_step_s  # the training loop's own share of every step
    # a pause is drawn on the forward and backward's share of a step (not the optimizer's)
    strag = replace(strag, slowed_share=prof.slowed_share)
    return SIMULATE[simulation_of(c.strategy)](
        _Run(c, prof, cluster, per_host, strag, epochs, loop)
    )


@dataclass(frozen=True)
class _Run:
    """What every simulation of a candidate starts from (:func:`simulate`)."""

    c: Candidate
    prof: Profile
    cluster: sim.Cluster
    per_host: int  # the ranks that share one machine's cores
    strag: sim.Stragglers  # the grid's stragglers where the strategy takes them, else none
    epochs: int
    loop: float  # the training loop's own share of every step


def _simulate_one_rank(r: _Run) -> sim.SimResult:
    """One rank trains every batch in turn: the full graph, each subgraph, or ViG's images."""
    c, prof, cluster = r.c, r.prof, r.cluster
    s, epochs, loop = c.settings, r.epochs, r.loop
    f = _slowdown(prof, 1)
    if prof.kind == "image":
        steps = [image_step_s(prof, n) * f + loop for n in image_steps(prof, 1, False)]
        return sim.lockstep(cluster, [[steps] * epochs], 1, 0)
    loop = _graph_loop_s(prof)
    if "partitions" in s:
        steps = [t * f + loop for t in prof.parts_step_s[str(s["partitions"])]]
        extra = _first_extra(prof, s["partitions"])
    else:
        steps, extra = [prof.full_step_s * f + loop], [prof.full_first_s]
    # a first step on a graph: also what the model derives from it and keeps
    first = [t + x * f for t, x in zip(steps, extra)]
    return sim.lockstep(cluster, [[first] + [steps] * (epochs - 1)], 1, 0)


def _simulate_lockstep(r: _Run) -> sim.SimResult:
    """Data parallel on subgraphs dealt to the ranks, averaging every ``sync_every`` steps
    (:func:`gnnpar.advise.simulate.lockstep`)."""
    c, prof, cluster, per_host, strag = r.c, r.prof, r.cluster, r.per_host, r.strag
    s, seed, world, epochs = c.settings, prof.seed, c.world, r.epochs
    loop = _graph_loop_s(prof)
    f = _slowdown(prof, per_host)
    strag = _resumed(strag, prof, f"parts{s['partitions']}", f)
    part_s = [t * f + loop for t in prof.parts_step_s[str(s["partitions"])]]
    extra = [x * f for x in _first_extra(prof, s["partitions"])]
    n = len(part_s)
    deal = assign_parts(n, world, seed)
    steps = math.ceil(n / world)
    compute = []
    for r in range(world):
        epochs_r = []
        for e in range(epochs):
            order = epoch_order(deal[r], seed, e, r)
            # a rank's first epoch is the first step on each of its subgraphs
            times: list[float | None] = [part_s[p] + extra[p] * (e == 0) for p in order]
            epochs_r.append(times + [None] * (steps - len(times)))
        compute.append(epochs_r)
    grads = s.get("average", "grads" if s["sync_every"] == 1 else "params") == "grads"
    return sim.lockstep(cluster, compute, s["sync_every"], prof.param_bytes, strag, pairs=grads)


def _simulate_gossip(r: _Run) -> sim.SimResult:
    """A shared pool of subgraphs, ranks averaging in pairs
    (:func:`gnnpar.advise.simulate.gossip`); where ranks share a machine, each rank's speed from
    how much the others computed (:func:`_corun_by_overlap`) or the profile's rank beside a
    straggler."""
    c, prof, cluster, per_host, strag = r.c, r.prof, r.cluster, r.per_host, r.strag
    s, seed, world, epochs = c.settings, prof.seed, c.world, r.epochs
    loop = _graph_loop_s(prof)
    f = _slowdown(prof, per_host)  # every rank of the machine computing all the time
    strag = _resumed(strag, prof, f"parts{s['partitions']}", f)
    part_s = [t * f + loop for t in prof.parts_step_s[str(s["partitions"])]]
    pool = WorkPool(None, "", len(part_s), epochs, seed)
    parts = [i for e in range(epochs) for i in pool.order(e)]
    positions = [part_s[i] for i in parts]
    rtt = prof.comm.get("store_rtt_s", 0.0)
    lat = cluster.network.latency_s if cluster.network else 0.0
    # the store lives with rank 0: a round trip from another host crosses the link twice
    store_rtt = [rtt + 2 * lat * (cluster.host(r) != 0) for r in range(world)]
    # per step: one take from the pool (an add: a round trip); publishing its speed is a set,
    # which waits for no answer (the pairing's store calls are simulated call by call)
    overhead = list(store_rtt)

    def run(speed: list[float]) -> sim.SimResult:
        return sim.gossip(
            cluster,
            positions,
            epochs,
            s["sync_every"],
            prof.param_bytes,
            seed,
            strag,
            bipartite=advice_of(c.strategy).bipartite,
            step_overhead_s=overhead,
            store_rtt_s=store_rtt,
            position_part=parts,
            first_extra_s=[x * f for x in _first_extra(prof, s["partitions"])],
            speed=speed,
        )

    beside = prof.beside_straggler.get(f"parts{s['partitions']}")
    slow = {r for r, x in strag.slowdown.items() if x > 1.0 and r < world}
    if beside is not None and slow:
        # the profile measured the pool's main worker beside a sleeping straggler in a real
        # run: that for the ranks sharing a machine with one, the co-run factor elsewhere
        # (the stragglers' own steps after a pause: after_pause)
        mates = {r for r in range(world) if any(r // per_host == q // per_host for q in slow)}
        return run([beside / f if r in mates - slow else 1.0 for r in range(world)])
    # a rank whose machine-mates idle: a lone rank's step in the real loop, as one rank's
    # (below 1 where the real loop ran faster than the profile's steps alone: a clamp at 1
    # here made gossip's near-lone rank across a link slower than sequential's one rank)
    alone = _time_share(prof, 1) * prof.loop_factor
    return _corun_by_overlap(run, world, per_host, f, min(f, alone))


def _simulate_pipeline(r: _Run) -> sim.SimResult:
    """Stages over ranks, with replicas where the settings have them
    (:func:`gnnpar.advise.simulate.pipeline`)."""
    c, prof, cluster, per_host = r.c, r.prof, r.cluster, r.per_host
    s, epochs, loop = c.settings, r.epochs, r.loop
    replicas = s.get("replicas", 1)
    p = prof.pipeline[f"{replicas}x{s['stages']}x{s['chunks']}"]
    f = _slowdown(prof, per_host)
    o = pipeline_op_overhead_s(prof, s["chunks"])
    firsts = prof.comm.get("pipeline_first_s") or {}
    key = _closest_chunks(firsts, s["chunks"])
    first = firsts[key] if key else 0.0
    per_epoch = len(image_steps(prof, replicas, True)) if prof.kind == "image" else 1
    if per_epoch < 1:
        raise ValueError(f"{c.label()}: no step in an epoch")  # omitted by run_advise
    return sim.pipeline(
        cluster,
        [[t * f + o for t in row] for row in p["fwd_s"]],
        [[t * f + o for t in row] for row in p["bwd_s"]],
        p["act_bytes"],
        epochs * per_epoch,
        s.get("schedule", "gpipe"),
        [t * f + loop for t in p["opt_s"]],
        replicas,
        p["grad_bytes"],
        per_epoch,
        first_step_extra_s=first,  # measured on two ranks here, as o
    )


def _simulate_sampled(r: _Run) -> sim.SimResult:
    """Neighbour-sampled batches under DDP, made in the rank or by loader workers
    (:func:`gnnpar.advise.simulate.sampled`)."""
    c, prof, cluster, per_host, strag = r.c, r.prof, r.cluster, r.per_host, r.strag
    s, world, epochs, loop = c.settings, c.world, r.epochs, r.loop
    w = s["loader_workers"]
    exchange = 0.0  # across shards: the frontier's and the rows' exchange, every step
    across = _across(c, prof, cluster)
    if across:
        w = 0  # made in the rank: its exchanges are collectives of the group
        exchange = shard_exchange.exchange_s(cluster, _step_traffic(c, prof, cluster))
    steps = shard_plan(prof.num_train, world, s["batch_size"])[1]
    # a rank whose share of the training nodes is smaller than the batch (a small graph on
    # several ranks) makes and trains smaller ones: their own costs, or scaled ones
    b, seeds = sampled_batch_costs(prof, s["batch_size"], world)
    compute, sample = b["compute_s"], b["main_sample_s"]
    if w:  # a worker makes and sends the batch; the rank receives it and trains on it
        sample = b.get("worker_s") or b["sample_s"]  # profiles from before: making alone
        compute = b.get("compute_recv_s", compute) + b.get("recv_s", 0.0)
    share = b.get("slowed_share", prof.slowed_share)
    if w:  # receiving a worker's batch comes before the step's clock: never slowed
        share *= b.get("compute_recv_s", compute) / max(compute, 1e-12)
    # from disk: the batch's maker (a worker or the thread, overlapped with the rank's compute;
    # else the rank) also waits for the reads the cache and the page cache miss (no core)
    disk = io_per_step(prof, sampled_key(prof, s["batch_size"], world))
    io = disk["io_s"] * seeds if disk else 0.0
    ahead = made_on_thread(w, across, disk)
    makers = w or int(ahead)  # the thread shares the rank's cores as a busy worker would
    # loader workers make batches on the cores the ranks leave idle first: every rank idles
    # while the slowest one pauses (DDP's all-reduce holds the others), so a worker's
    # batch time-shares a step only as far as it does not fit in that pause
    idle = _pause_per_step(strag, compute * share) * prof.threads
    busy = min(makers, max(0.0, sample - idle) / max(compute, 1e-9)) if makers else 0.0
    corun = _slowdown(prof, per_host, busy, "sampled_corun_factor")
    f = corun * seeds
    key = f"sampled{sampled_key(prof, s['batch_size'], world)}"
    strag = _resumed(replace(strag, slowed_share=share), prof, key, corun)
    # across shards the exchange is the batch's making where the thread makes it (batch i+1
    # while the rank trains on i, one batch ahead), the rank's step where it is made in line
    in_step, in_making = (0.0, exchange) if ahead else (exchange, 0.0)

    def run_sampled(speed: list[float]) -> sim.SimResult:
        return sim.sampled(
            cluster,
            steps,
            epochs,
            compute * f + loop + in_step,
            sample * f + io + in_making,
            makers,
            prof.param_bytes,
            strag,
            prefetch=1 if ahead else PREFETCH,
            start_s=prof.loader_start_s if w else b.get("first_batch_s", 0.0),
            speed=speed,
        )

    # a straggler's pause comes after DDP's all-reduce, and the other ranks make and train
    # their next batch meanwhile, alone on the machine: slowed as far as they overlap
    alone = _time_share(prof, 1, busy) * max(1.0, prof.loop_factor) * seeds
    return _corun_by_overlap(run_sampled, world, per_host, f, min(f, alone))


def made_on_thread(workers: int, across: bool, disk: dict[str, float] | None) -> bool:
    """Whether a sampled run makes its next batch on a thread of the training process while
    the model trains (see the module's "The batch made on a thread"): without loader workers,
    across shards, or from a prepared folder whose rows the feature cache does not all hold
    (``disk``'s hit rate below 1; where it holds them all, only the sampling runs ahead and the
    rows' copy waits, as in line), and ``GNNPAR_BATCH_AHEAD`` not 0."""
    if workers or not batch_ahead_allowed():
        return False
    return across or (disk is not None and disk["hit_rate"] < 1.0)


SIMULATE = {
    SIM_ONE_RANK: _simulate_one_rank,
    SIM_LOCKSTEP: _simulate_lockstep,
    SIM_GOSSIP: _simulate_gossip,
    SIM_PIPELINE: _simulate_pipeline,
    SIM_SAMPLED: _simulate_sampled,
}


def image_steps(prof: Profile, replicas: int, pipelined: bool) -> list[int]:
    """The images of each step of a ViG epoch, per copy of the model, as gnnpar's sources
    make them: sequential (:class:`~gnnpar.training.sources.ImageBatches`) ``--batch-size``
    images a step, the last step the rest; pipeline and hybrid
    (:class:`~gnnpar.training.pipeline_batches.ImageMicroBatches`) only whole global batches
    of ``replicas x --batch-size``; at most ``--max-steps`` steps."""
    n, b = prof.num_train, prof.batch_size
    if pipelined:
        steps = [b] * (n // (replicas * b))
    else:
        steps = [b] * (n // b) + ([n % b] if n % b else [])
    return steps[: prof.max_steps] if prof.max_steps else steps


def _closest_chunks(measured: dict[str, float], chunks: int) -> str | None:
    """The two-stage shape ("1x2xM") measured with the closest micro-batch count; None where
    none was measured."""
    if not measured:
        return None
    return min(measured, key=lambda k: abs(int(k.split("x")[2]) - chunks))


def pipeline_op_overhead_s(prof: Profile, chunks: int) -> float:
    """What torch.distributed.pipelining adds to each forward or backward of a micro-batch
    (the stage's bookkeeping, the schedule, autograd across the cut), calibrated once: a real
    two-stage step measured here (``comm["pipeline_step_s"]``, the closest micro-batch count)
    against its simulation from the bare per-block times; the difference, spread over the
    ``2 (M + S - 1)`` operations on the critical path. 0 where none was measured."""
    measured = prof.comm.get("pipeline_step_s") or {}
    key = _closest_chunks(measured, chunks)
    if key is None:
        return 0.0
    p, m = prof.pipeline[key], int(key.split("x")[2])
    comm = prof.comm
    two = sim.Cluster(1, 2, sim.Link(*comm["ring_step"]), sim.Link(*comm["p2p_link"]))
    # the real step ran on two ranks of this machine: its blocks were slowed as such a host's
    # are (simulate applies the same factor to every pipeline's blocks; leaving it out here
    # counted the co-run slowdown twice: Cora's 2 x 2 predicted +33..+38% on one host)
    f = _slowdown(prof, 2)
    fwd, bwd = ([[t * f for t in row] for row in p[k]] for k in ("fwd_s", "bwd_s"))
    opt = [t * f for t in p["opt_s"]]
    bare = sim.pipeline(two, fwd, bwd, p["act_bytes"], 1, "gpipe", opt)
    return max(0.0, (measured[key] - bare.train_time_s) / (2 * (m + 1)))


def recommend(preds: list[Prediction]) -> dict[str, Any]:
    ranked = sorted(preds, key=lambda p: p.train_time_s)
    best = ranked[0]
    why = (
        f"shortest predicted training time: {best.train_time_s:.3g} s "
        f"({best.epoch_s:.3g} s per epoch, {best.speedup:.2f}x over the same batches on one "
        f"rank); {best.wait_share:.0%} of the ranks' time is spent waiting on others or data"
    )
    if len(ranked) > 1:
        nxt = ranked[1]
        gap = nxt.train_time_s / best.train_time_s - 1
        why += f"; next: {nxt.candidate.label()}, {gap:.0%} slower"
    slow = [p for p in ranked if p.wait_share > 0.5]
    if slow:
        why += f"; {len(slow)} configuration(s) wait more than half the time (communication)"
    return {
        "strategy": best.candidate.strategy,
        "settings": dict(best.candidate.settings),
        "why": why,
    }


def candidate_flags(req, c: Candidate) -> dict[str, Any]:
    """The ``gnnpar train`` flags of one configuration (what --validate runs); ``req`` is
    advise's request (``command.Request``: the base flags and the stragglers)."""
    settings = {k.replace("_", "-"): v for k, v in c.settings.items()}
    flags = flags_for(req.base, c.strategy, **settings)
    flags["workers"] = c.world
    reads, s = registry.get(c.strategy).reads, req.stragglers
    if s.slowdown and "slowdown" in reads:
        flags["slowdown"] = ",".join(f"{r}={f:g}" for r, f in sorted(s.slowdown.items()))
    if s.jitter and "jitter" in reads:
        flags["jitter"] = s.jitter
    return flags
