"""``gnnpar advise``: check the request, profile here, simulate the grid, report (and validate).

    gnnpar advise --dataset cora --model gcn --workers 2 --out runs/advise-cora
    gnnpar advise --dataset synthetic-reddit --scale 0.05 --model sage --hosts 4 \\
        --ranks-per-host 2 --network 10gbit,50us --slowdown 3=3 --out runs/advise-reddit
    gnnpar advise --dataset cora --model gcn --workers 2 --strategies allreduce,gossip \\
        --validate --out runs/advise-check
    gnnpar advise --dataset synthetic-cifar10 --scale 0.05 --model vig --batch-size 1000 \\
        --hosts 4 --ranks-per-host 1 --network 100gbit,5us --out runs/advise-vig

ViG (images): ``--batch-size`` is the run's, not an axis of the grid; sequential, pipeline and
hybrid apply (the graph strategies are left out with ``gnnpar train``'s reasons).

Everything that can be wrong with the request (a flag, a value, a strategy's own checks on the
grid, an output folder that cannot be written) is found before the profile starts, and ends
with one message and exit status 2.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnnpar.advise import NOT_TAKEN
from gnnpar.advise import simulate as sim
from gnnpar.advise.predict import (
    IMAGE_CHUNKS,
    Candidate,
    ClusterSpec,
    advised,
    build_grid,
    candidate_flags,
    default_strategies,
    image_steps,
    replicated,
    simulation_of,
    straggles,
)
from gnnpar.advise.profile import PROBE_ROUNDS, flags_for, reference
from gnnpar.errors import UsageError
from gnnpar.strategies.spec import SIM_GOSSIP, SIM_LOCKSTEP, SIM_PIPELINE

# train flags that advise does not take: it chooses the strategy, and runs nothing to resume
# train flags that fix one axis of the grid (else the grid varies them)
AXES = ("partitions", "sync-every", "average", "stages", "chunks", "schedule")
AXES += ("batch-size", "loader-workers", "seeds")

_BANDWIDTH = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_LATENCY = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_network(text: str) -> sim.Link:
    """``10gbit,50us`` (tc's units: bit, kbit, mbit, gbit, tbit; s, ms, us, ns) -> a Link."""
    m = re.fullmatch(
        r"\s*([0-9]*\.?[0-9]+)\s*([a-z]+)\s*,\s*([0-9]*\.?[0-9]+)\s*([a-z]+)\s*", text.lower()
    )
    if not m or m.group(2) not in _BANDWIDTH or m.group(4) not in _LATENCY:
        raise UsageError(
            f"--network {text!r} is not BANDWIDTH,LATENCY; write it as tc does, e.g. "
            "--network 10gbit,50us or 1gbit,1ms (bandwidth: bit, kbit, mbit, gbit, tbit; "
            "one-way latency: s, ms, us, ns)."
        )
    bw = float(m.group(1)) * _BANDWIDTH[m.group(2)] / 8  # bytes per second
    if bw <= 0:
        raise UsageError(f"--network {text!r}: the bandwidth must be more than 0.")
    return sim.Link(float(m.group(3)) * _LATENCY[m.group(4)], bw)


def _positive(flags: dict, key: str) -> int | None:
    raw = flags.get(key)
    if raw is None:
        return None
    try:
        n = int(str(raw))
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--{key} must be a whole number >= 1, got {raw!r}.")
    return n


@dataclass
class Request:
    base: dict[str, Any]  # flags every profiled configuration takes
    fixed: dict[str, Any]  # grid axes the user fixed (underscored names)
    cluster: ClusterSpec
    strategies: tuple[str, ...]
    threads: int
    stragglers: sim.Stragglers
    epochs: int
    layers: int
    out: Path
    validate: bool
    profile: str | None = None  # --profile: an earlier advice.json to simulate from
    dataset: str = ""
    model: str = ""
    images: int = 0  # ViG: --batch-size (images per step and copy); 0: a graph
    grid: list[Candidate] = field(default_factory=list)
    repeats: int = 1  # --validate trains each configuration this many times
    rounds: int = PROBE_ROUNDS  # --profile-rounds: of every timing and ratio probe of the profile
    # a requested strategy with no configuration on this cluster -> why, in one line
    omitted: dict[str, str] = field(default_factory=dict)
    # advise's own choices it changed for this machine or graph, a phrase each (said in a line)
    changes: list[str] = field(default_factory=list)


def parse_request(flags: dict[str, Any]) -> Request:
    """The advise flags (dashed names, None where not given) as a checked :class:`Request`."""
    from gnnpar.configure import build_config

    flags = {k.replace("_", "-"): v for k, v in flags.items() if v is not None}
    cluster = _cluster(flags)
    strategies = _strategies(flags)
    threads, changes = _threads(flags, cluster)
    fixed = _fixed_axes(flags)
    slowdown, jitter = _stragglers(flags, cluster)
    repeats, rounds = _repeats_and_rounds(flags)
    base, out = _base_flags(flags, threads)
    cfg = build_config(None, flags_for(base, reference("full")))  # the common settings, checked
    images = 0
    if cfg.model.name == "vig":  # images: --batch-size is the run's, not an axis of the grid
        if "batch_size" in fixed:
            base["batch-size"] = fixed.pop("batch_size")
            cfg = build_config(None, flags_for(base, reference("full")))
        images = cfg.strategy.batch_size
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = Path(cfg.data.dataset.rstrip("/")).stem.replace(":", "-") or "data"
        out = f"runs/{stamp}-advise-{name}-{cfg.model.name}"
    req = Request(
        base,
        fixed,
        cluster,
        strategies,
        threads,
        sim.Stragglers(slowdown, jitter, cfg.run.seed),
        cfg.run.epochs,
        cfg.model.layers,
        Path(out),
        bool(flags.get("validate")),
        flags.get("profile"),
        cfg.data.dataset,
        cfg.model.name,
        images,
    )
    req.repeats = repeats
    req.rounds = rounds
    req.changes = changes
    req.grid = checked_grid(req)
    return req


def _cluster(flags: dict[str, Any]) -> ClusterSpec:
    """--hosts, --ranks-per-host (or --workers: one host) and --network as the cluster."""
    hosts = _positive(flags, "hosts")
    per_host = _positive(flags, "ranks-per-host")
    workers = _positive(flags, "workers")
    if hosts is None:
        if per_host is not None:
            raise UsageError("--ranks-per-host describes a cluster: pass --hosts H with it.")
        hosts, per_host = 1, workers or 1
    else:
        if workers is not None:
            raise UsageError(
                "--workers is the ranks on this one host; with --hosts give --ranks-per-host "
                "instead (the cluster has hosts x ranks-per-host ranks)."
            )
        per_host = per_host or 1
    network = None
    if "network" in flags:
        network = parse_network(flags["network"])
    elif hosts > 1:
        raise UsageError(
            f"--hosts {hosts}: say what joins the hosts with --network BANDWIDTH,LATENCY, "
            "e.g. --network 10gbit,50us."
        )
    return ClusterSpec(hosts, per_host, network)


def _strategies(flags: dict[str, Any]) -> tuple[str, ...]:
    """--strategies, each one advise can simulate (default: :func:`default_strategies`)."""
    if "strategies" not in flags:
        return default_strategies()
    known = advised()  # the registered strategies that declare how advise simulates them
    asked = tuple(s.strip() for s in str(flags["strategies"]).split(",") if s.strip())
    bad = [s for s in asked if s not in known]
    if bad or not asked:
        raise UsageError(
            f"--strategies {flags['strategies']!r}: unknown {', '.join(bad) or 'list'}; "
            f"give a comma-separated list of {', '.join(known)}."
        )
    return asked


def _threads(flags: dict[str, Any], cluster: ClusterSpec) -> tuple[int, list[str]]:
    """--threads per rank (default: this machine's cores shared by a host's ranks), and the
    change advise made to its own default, if any, in words."""
    cores = os.cpu_count() or 1
    hosts, per_host = cluster.hosts, cluster.ranks_per_host
    threads = _positive(flags, "threads")
    changes = []
    if threads is None:
        threads = max(1, cores // per_host)
        if flags.get("validate") and hosts == 2:
            # --validate makes the two hosts of network namespaces on this machine: both hosts'
            # ranks share its cores, so each gets its share (at cores // ranks-per-host, two
            # such hosts' ranks time-share the cores, and the steps vary by tens of percent)
            shared = max(1, cores // (2 * per_host))
            if shared != threads:
                changes.append(
                    f"--threads {shared} per rank, not {threads} (--validate runs the 2 hosts "
                    f"on this machine: their {2 * per_host} ranks share its {cores} cores; "
                    "give --threads to choose)"
                )
            threads = shared
    return threads, changes


def _fixed_axes(flags: dict[str, Any]) -> dict[str, Any]:
    """The grid axes the user fixed, as parsed values under underscored names."""
    from gnnpar.config.parse import coerce

    return {key.replace("-", "_"): coerce(key, flags[key]) for key in AXES if key in flags}


def _stragglers(flags: dict[str, Any], cluster: ClusterSpec) -> tuple[dict, float]:
    """--slowdown (ranks of the cluster, factors >= 1) and --jitter (>= 0)."""
    from gnnpar.config.parse import coerce

    slowdown = coerce("slowdown", flags["slowdown"]) if "slowdown" in flags else {}
    jitter = coerce("jitter", flags["jitter"]) if "jitter" in flags else 0.0
    if jitter < 0:
        raise UsageError(f"--jitter must be >= 0, got {jitter}.")
    bad_ranks = sorted(r for r in slowdown if r >= cluster.world)
    if bad_ranks:
        raise UsageError(
            f"--slowdown names rank {bad_ranks[0]}, but the cluster has ranks "
            f"0..{cluster.world - 1} ({cluster.hosts} hosts x {cluster.ranks_per_host} ranks)."
        )
    for f, v in slowdown.items():
        if v < 1:
            raise UsageError(f"--slowdown {f}={v}: a straggler's factor must be >= 1.")
    return slowdown, jitter


def _repeats_and_rounds(flags: dict[str, Any]) -> tuple[int, int]:
    """--repeats (with --validate, at most 20) and --profile-rounds (not with --profile, at
    most 9)."""
    repeats = _positive(flags, "repeats") or 1
    if "repeats" in flags and not flags.get("validate"):
        raise UsageError(
            "--repeats says how often --validate trains each configuration: add --validate."
        )
    if repeats > 20:
        raise UsageError(
            f"--repeats {repeats}: at most 20 (each repetition trains the whole grid)."
        )
    rounds = _positive(flags, "profile-rounds") or PROBE_ROUNDS
    if "profile-rounds" in flags and "profile" in flags:
        raise UsageError(
            "--profile-rounds says how a new profile is taken; --profile reuses one: give one "
            "of the two."
        )
    if rounds > 9:
        raise UsageError(
            f"--profile-rounds {rounds}: at most 9 (each round times every batch kind again)."
        )
    return repeats, rounds


# advise's own flags: no profiled configuration takes them
_ADVISE_ONLY = ("profile-rounds", "hosts", "ranks-per-host", "network", "strategies")
_ADVISE_ONLY += ("validate", "workers", "repeats", "profile")


def _base_flags(flags: dict[str, Any], threads: int) -> tuple[dict[str, Any], Any]:
    """The train flags every profiled configuration takes (``--threads`` set), and --out."""
    taken = {k: v for k, v in flags.items() if k not in NOT_TAKEN and k not in _ADVISE_ONLY}
    base = {k: v for k, v in taken.items() if k not in AXES and k not in ("slowdown", "jitter")}
    base["threads"] = threads
    out = base.pop("out", None)
    return base, out


def checked_grid(req: Request) -> list[Candidate]:
    """The grid, every configuration checked as ``gnnpar train`` would check it."""
    from gnnpar.configure import build_config
    from gnnpar.strategies import registry

    cl = req.cluster
    grid = build_grid(req.strategies, cl.world, req.layers, req.fixed, req.images, cl.hosts)
    kept = []
    refused: dict[str, str] = {}
    for c in grid:
        flags = candidate_flags(req, c)
        try:
            cfg = build_config(None, flags)
            spec = registry.get(c.strategy)
            spec.check(cfg, spec.parallel_dims(cfg))
        except UsageError as e:
            if c.strategy in req.strategies and req.strategies != default_strategies():
                raise UsageError(f"--strategies {c.strategy} on this cluster: {e}") from None
            refused.setdefault(c.strategy, str(e))
            continue  # a default strategy that does not apply here
        kept.append(c)
    present = {c.strategy for c in kept}
    req.omitted = {
        s: refused.get(s) or why_no_configuration(s, req)
        for s in req.strategies
        if s not in present
    }
    if not kept:
        raise UsageError(
            f"No configuration of {', '.join(req.strategies)} applies to "
            f"{req.cluster.world} rank(s) ("
            + "; ".join(f"{n}: {w}" for n, w in req.omitted.items())
            + "); use more ranks or other --strategies."
        )
    return kept


def why_no_configuration(strategy: str, req: Request) -> str:
    """Why :func:`~gnnpar.advise.predict.build_grid` made no configuration of ``strategy``
    for this request (its rules, in words)."""
    world, layers = req.cluster.world, req.layers
    ranks = f"the cluster has {world} rank(s)"
    simulation = simulation_of(strategy)
    pipelined, copies = simulation == SIM_PIPELINE, replicated(strategy)
    if (simulation in (SIM_LOCKSTEP, SIM_GOSSIP) or pipelined and copies) and world < 2:
        return f"needs 2 or more ranks; {ranks}"
    if pipelined and req.images and req.fixed.get("chunks") is None:
        if not any(req.images % m == 0 and m <= req.images for m in IMAGE_CHUNKS):
            return (
                f"no micro-batch count of {', '.join(map(str, IMAGE_CHUNKS))} divides "
                f"--batch-size {req.images} into equal micro-batches; give --chunks"
            )
    if pipelined and not copies:
        if not 2 <= world <= layers:
            return (
                f"one stage per rank needs 2..{layers} ranks (the model has {layers} layers, "
                f"--layers), {ranks}; hybrid runs stages x replicas"
            )
        return f"--schedule 1f1b needs --chunks >= {world} (the stages); got --chunks {req.fixed.get('chunks')}"
    if pipelined:
        stages = req.fixed.get("stages")
        if stages is not None:
            return (
                f"--stages {stages} must divide the {world} ranks into 2 or more replicas "
                f"and be at most the model's {layers} layers"
            )
        return (
            f"no stage count 2..{layers} (the model's layers) divides {world} ranks into "
            "2 or more replicas"
        )
    return "no configuration applies"


def run_advise(flags: dict[str, Any]) -> dict[str, Any]:
    """The whole command; returns advice.json's content. Its ``--out`` is checked before
    anything is profiled, but made only when there is something to write: a request that ends
    early (exit 2, a failure, Ctrl-C) leaves no empty folder behind."""
    req = parse_request(flags)
    made = check_writable(req.out)
    try:
        return _advise(req)
    except BaseException:
        if made is not None:
            remove_empty_folders(made)
        raise


def fit_request(req: Request, facts=None) -> list:
    """``req``'s grid fitted to the graph's ``facts`` (:mod:`gnnpar.advise.fit`; None: ViG's
    images, fitted once profiled), what changed and what was left out said, one line each;
    exit 2 (a UsageError) where nothing is left. Returns what the profile must measure."""
    from gnnpar.advise.fit import check_not_empty, fit_grid

    if facts is not None:
        req.changes += fit_grid(req, facts)
    if req.changes:
        print(f"gnnpar advise: changed its own choices: {'; '.join(req.changes)}.", flush=True)
    for name, why in req.omitted.items():
        print(f"gnnpar advise: left out {name}: {why.rstrip('.')}.", flush=True)
    check_not_empty(req)
    return sorted({c.need() for c in req.grid} | {c.need() for c in _references(req)}, key=str)


def _advise(req: Request) -> dict[str, Any]:
    """Fit the grid, profile (or check ``--profile``), simulate, report, write advice.json."""
    from gnnpar.advise import report
    from gnnpar.advise.fit import graph_facts, profile_facts
    from gnnpar.advise.predict import predict, recommend

    saved = read_profile(req) if req.profile is not None else None
    ds, facts = None, None
    if not req.images:  # a graph: the grid fitted to it (ViG's images: drop_empty_epochs)
        if saved is not None:
            facts = profile_facts(req.base, saved)
        else:
            ds = _load_dataset(req)
            facts = graph_facts(req.base, ds)
    needs = fit_request(req, facts)
    prof = _profile(req, saved, needs, ds, facts)
    del ds, facts  # the graph (and the partitions' check, which holds it): not needed again
    if prof.kind == "image":
        drop_empty_epochs(req, prof)
    preds = [predict(c, prof, req.cluster, req.stragglers, req.epochs) for c in req.grid]
    rec = recommend(preds)
    title = _title(req, prof)
    note = report.steadiness_note(prof.probe_rounds, prof.rounds, prof.speed_ref_s)
    report.print_table(preds, title, rec, note)
    content = report.advice(prof.profile_s, preds, rec, _cluster_json(req), prof.to_dict())
    if req.omitted:
        content["omitted"] = dict(req.omitted)
    if req.changes:
        content["changed"] = list(req.changes)
    if req.validate:
        from gnnpar.advise.validate import validate

        content["validation"] = validate(req, preds, prof)
    req.out.mkdir(parents=True, exist_ok=True)
    report.plot(preds, req.out / "advice.png", title)
    report.write_json_atomic(content, req.out / "advice.json")
    print(f"gnnpar: advice.json and advice.png in {req.out}")
    return content


def _profile(req: Request, saved, needs: list, ds, facts):
    """The profile the grid is simulated from: ``saved`` (``--profile``) checked against what
    the grid needs, or a new one taken here; running out of memory is exit 2 with advice."""
    from gnnpar.advise.profile import take_profile

    comm = any(c.world > 1 for c in req.grid)
    timeout = float(req.base.get("timeout", 120))
    print(
        f"gnnpar advise: {'checking' if saved else 'profiling'} {len(needs)} batch "
        f"kind{'s' if len(needs) != 1 else ''}{' and gloo between 2 ranks' if comm else ''} "
        f"at {req.threads} thread(s)...",
        flush=True,
    )
    workers = any(c.settings.get("loader_workers") for c in req.grid)
    if saved is not None:
        return check_profile(req, saved, needs, comm)
    try:
        return take_profile(
            req.base,
            needs,
            req.threads,
            comm,
            timeout,
            workers,
            req.rounds,
            _straggle(req),
            ds=ds,
            corun_partitions=_corun_partitions(needs, comm, facts),
        )
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        raise UsageError(
            "gnnpar advise ran out of memory profiling a batch here "
            f"({str(e).strip().splitlines()[0][:160]}); the full graph is the largest: "
            "leave sequential out of --strategies, or profile a smaller --scale."
        ) from None


def _title(req: Request, prof) -> str:
    """The table's and the picture's title: the workload, the cluster, where it was profiled."""
    c = req.cluster
    net = (
        f", {c.network.bandwidth_Bps * 8 / 1e9:g} Gbit/s {c.network.latency_s * 1e6:g} us"
        if c.network
        else ""
    )
    return (
        f"{prof.dataset} {prof.model}, {c.hosts} host(s) x {c.ranks_per_host} rank(s){net}, "
        f"{req.epochs} epochs; simulated from a profile taken on {prof.machine} "
        f"({prof.cores} cores, {req.threads} thread(s) per rank) "
        + (f"in {prof.profile_s:.1f} s" if req.profile is None else f"(--profile {req.profile})")
    )


def _cluster_json(req: Request) -> dict[str, Any]:
    """advice.json's ``cluster``: the cluster, threads, stragglers and epochs simulated."""
    c = req.cluster
    return {
        "hosts": c.hosts,
        "ranks_per_host": c.ranks_per_host,
        "network": None
        if c.network is None
        else {"bandwidth_Bps": c.network.bandwidth_Bps, "latency_s": c.network.latency_s},
        "threads": req.threads,
        "slowdown": {str(k): v for k, v in req.stragglers.slowdown.items()},
        "jitter": req.stragglers.jitter,
        "epochs": req.epochs,
    }


def check_writable(out: Path) -> Path | None:
    """Exit 2 unless ``out`` can be made and written, making nothing: a folder is made in its
    nearest existing ancestor and removed again. Returns the highest folder of ``out`` that
    does not exist yet (None: ``out`` exists), for :func:`remove_empty_folders`."""
    import tempfile

    path = out.absolute()
    top = None
    while not path.exists():
        top, path = path, path.parent
    if not path.is_dir():
        where = "is a file" if path == out.absolute() else f"is inside {path}, a file"
        raise UsageError(f"--out {out} {where}; give a folder (it will hold advice.json).")
    try:
        probe = tempfile.mkdtemp(dir=path, prefix=".gnnpar-write-test-")
        with tempfile.NamedTemporaryFile(dir=probe):
            pass
        os.rmdir(probe)
    except OSError as e:
        raise UsageError(
            f"--out {out} cannot be written ({e.strerror or e}); choose a writable folder."
        ) from None
    return top


def remove_empty_folders(top: Path) -> None:
    """``top`` and the folders under it, where empty (what advise made and wrote nothing into)."""
    if not top.is_dir():
        return
    for folder, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
        try:
            os.rmdir(folder)
        except OSError:  # not empty: something was written there
            pass


def _load_dataset(req: Request):
    """The dataset of the request, loaded as the profile loads it (and handed to it)."""
    from gnnpar.configure import build_config
    from gnnpar.data.datasets import load_dataset

    cfg = build_config(None, flags_for(req.base, reference("full")))
    d = cfg.data
    return load_dataset(d.dataset, d.data_root, d.scale, cfg.run.seed, cfg.strategy.timeout_s)


def _corun_partitions(needs: list, comm: bool, facts) -> int | None:
    """The subgraphs of the profile's co-run probe (allreduce on its two ranks), where the grid
    has no subgraph count of 2 or more: advise's own count for 2 ranks, as this graph allows."""
    from gnnpar.advise.fit import choose_partitions, default_partitions

    if not comm or any(n.kind == "parts" and n.partitions >= 2 for n in needs):
        return None
    if not any(n.kind in ("parts", "pipeline") for n in needs):  # no co-run probe
        return None
    if facts is None:  # images: no subgraphs
        return None
    return choose_partitions(default_partitions(2), 2, facts, 2)


def drop_empty_epochs(req: Request, prof) -> None:
    """ViG: a pipeline or hybrid configuration whose global batch (copies x --batch-size) is
    more than the training images has no step (``gnnpar train`` would refuse it, once the
    dataset is loaded); it is left out with that reason."""
    kept = []
    for c in req.grid:
        replicas = c.settings.get("replicas", 1)
        pipelined = simulation_of(c.strategy) == SIM_PIPELINE
        if pipelined and not image_steps(prof, replicas, True):
            req.omitted.setdefault(
                c.strategy,
                f"--batch-size {req.images} x {replicas} copies is more than the "
                f"{prof.num_train} training images; use a smaller --batch-size",
            )
            print(f"gnnpar advise: left out {c.label()}: {req.omitted[c.strategy]}.", flush=True)
            continue
        kept.append(c)
    if not kept:
        raise UsageError(
            f"--batch-size {req.images} leaves no configuration a step: it is more than the "
            f"{prof.num_train} training images; use a smaller --batch-size."
        )
    req.grid = kept


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed (torch raises RuntimeError on CPU)."""
    text = str(e).lower()
    return isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text


def _straggle(req: Request) -> dict[str, Any] | None:
    """The grid's stragglers on the profile's two ranks, for its after-pause probes: the
    slowest ``--slowdown`` factor on rank 1, and ``--jitter``; None where there are none or no
    configuration of several ranks reads them."""
    s = req.stragglers
    slowest = max(s.slowdown.values(), default=1.0)
    if slowest <= 1.0 and s.jitter <= 0:
        return None
    if not any(straggles(c.strategy) and c.world > 1 for c in req.grid):
        return None
    return {"slowdown": {1: slowest} if slowest > 1.0 else {}, "jitter": s.jitter}


def read_profile(req: Request):
    """``--profile FILE``: the profile of an earlier ``gnnpar advise`` (its advice.json), taken
    with the same dataset, model and threads (what it must hold: :func:`check_profile`)."""
    import json

    from gnnpar.advise.profile import Profile

    path = req.profile
    try:
        raw = json.loads(Path(path).read_text())["profile"]
        prof = Profile(**raw)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(
            f"--profile {path}: not the advice.json of gnnpar advise ({type(e).__name__}: "
            f"{str(e)[:120]}); give such a file, or leave --profile out to profile here."
        ) from None
    again = _AGAIN
    other_shards = prof.model == req.model and same_graph_sharded(prof.dataset, req.dataset)
    if (prof.dataset, prof.model) != (req.dataset, req.model) and not other_shards:
        raise UsageError(
            f"--profile {path} was taken for --dataset {prof.dataset} --model {prof.model}, "
            f"not {req.dataset} {req.model}: {again}."
        )
    if prof.threads != req.threads:
        raise UsageError(
            f"--profile {path} was taken at {prof.threads} thread(s) per rank, this request "
            f"asks for {req.threads}: pass --threads {prof.threads}, or {again}."
        )
    if prof.kind == "image" and prof.batch_size != req.images:
        raise UsageError(
            f"--profile {path} was taken at --batch-size {prof.batch_size}, this request "
            f"asks for {req.images}: pass --batch-size {prof.batch_size}, or {again}."
        )
    if prof.kind != "image" and not (
        isinstance(prof.num_nodes, int) and isinstance(prof.num_train, int)
    ):
        raise UsageError(f"--profile {path}: its num_nodes and num_train are not counts: {again}.")
    from gnnpar.advise.profile.seed_deals import lacks_shard_record

    if other_shards or lacks_shard_record(prof):
        _measure_shards(prof, req.dataset, other_shards)
    return prof


def same_graph_sharded(profiled: str, asked: str) -> bool:
    """Are ``profiled`` and ``asked`` two sharded folders of the same graph (the same counts
    and origin, in any partition or shard count)? The profile's timings hold for either; its
    shard record is measured again (:func:`_measure_shards`)."""
    from gnnpar.data import prepared, shards

    try:
        a, b = (prepared.read_manifest(Path(f).expanduser()) for f in (profiled, asked))
    except Exception:  # noqa: BLE001 (not a folder, or not one gnnpar reads: not the same)
        return False
    if not (shards.is_sharded(a) and shards.is_sharded(b)):
        return False
    keys = ("name", "num_nodes", "num_edges", "num_features", "num_classes", "splits")
    made = [{k: v for k, v in m.get("made", {}).items() if k != "created"} for m in (a, b)]
    return made[0] == made[1] and all(a.get(k) == b.get(k) for k in keys)


def _measure_shards(prof, folder: str, other: bool) -> None:
    """A saved profile used for the sharded ``folder``: its shard record (the shards, the cut,
    each host's own seeds' batches) measured from ``folder``'s shards, bounded memory."""
    from gnnpar.advise.profile.seed_deals import add_shard_record, shards_of_folder

    if other:
        print(
            f"gnnpar advise: the profile of {prof.dataset} for --dataset {folder} (the same "
            "graph, other shards): its timings, and this folder's shards measured here",
            flush=True,
        )
        prof.shards = shards_of_folder(folder)
        prof.dataset = folder
    add_shard_record(prof, folder)


_AGAIN = "run gnnpar advise without --profile (it profiles again)"


def check_profile(req: Request, prof, needs: list, comm: bool):
    """The saved profile ``prof``, if it measured everything this request ``needs``."""
    path = req.profile
    if prof.kind == "image":
        from gnnpar.advise.profile import image_pipeline

        for n in needs:  # any pipeline shape is composed from the per-block costs
            key = f"{n.replicas}x{n.stages}x{n.chunks}"
            if n.kind == "pipeline" and key not in prof.pipeline and n.stages <= req.layers:
                image_pipeline(prof, n.replicas, n.stages, n.chunks)
                prof.memory.setdefault(f"pipeline{key}", prof.memory.get("full", {}))
    missing = [n for n in needs if not _has(prof, n)]
    if comm and not prof.comm:
        missing.append("gloo between two ranks")
    if missing:
        raise UsageError(
            f"--profile {path} lacks what this grid needs ({', '.join(map(str, missing[:3]))}"
            f"{' ...' if len(missing) > 3 else ''}): {_AGAIN}, or narrow --strategies."
        )
    from gnnpar.advise.speed import clean

    prof.speed_ref_s = clean(prof.speed_ref_s)  # a number of any other kind: not kept
    prof.profile_s = 0.0  # nothing was profiled for this request
    return prof


def _has(prof, n) -> bool:
    if n.kind == "full":
        return prof.full_step_s is not None
    if n.kind == "parts":
        return str(n.partitions) in prof.parts_step_s
    if n.kind == "sampled":
        return str(n.batch_size) in prof.sampled
    return f"{n.replicas}x{n.stages}x{n.chunks}" in prof.pipeline


def _references(req: Request) -> list[Candidate]:
    """What the speed-ups are measured against: the same batches on one rank."""
    from gnnpar.advise.predict import _one_rank

    return [_one_rank(c) for c in req.grid]
