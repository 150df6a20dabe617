"""papers100M-sized predictions (issue 22): sampled and Cluster-GCN training of a graph of
ogbn-papers100M's size on 4, 16 and 64 hosts, simulated from a profile of a scaled-down
stand-in, with the memory each host needs.

The stand-in is ``synthetic-papers100m`` (gnnpar.data.synthetic: papers100M's 128 features,
172 classes, mean degree of 14.5 edge_index columns per node, 1.087% of the nodes training) at
``--scale 0.01`` (1.1M nodes). ``gnnpar advise`` profiles it; this script maps the profile onto
papers100M (:mod:`gnnpar.advise.scale`) and simulates it with gnnpar's own simulation
(:func:`gnnpar.advise.predict.predict`); nothing is trained at papers100M's size.

    D=/tmp/scale-data   # the generated stand-ins and their partitions
    for S in 0.01 0.02; do P=$(python -c "print(round($S * 10000))")
      gnnpar advise --dataset synthetic-papers100m --scale $S --data-root $D --hidden 256 \\
          --layers 3 --hosts 4 --ranks-per-host 1 --network 25gbit,10us --threads 2 \\
          --epochs 1 --model sage --fanouts 15,10,5 --batch-size 1024 --strategies sampled \\
          --out runs/s$S-sampled
      gnnpar advise ... (as above, without the sampled flags) --model gcn --partitions $P \\
          --partitioner metis --strategies allreduce,gossip --out runs/s$S-cluster
    done
    python -m benchmarks.advise.papers100m_scale --data-root $D --sampled runs/s0.01-sampled/advice.json \\
        --cluster runs/s0.01-cluster/advice.json --check-sampled runs/s0.02-sampled/advice.json \\
        --check-cluster runs/s0.02-cluster/advice.json --work-scales 0.01,0.02,0.05,0.1 \\
        --gather-gb 0.57,1.14,4,8 --again 3

(The stand-ins of ``--work-scales`` are generated on first use: 0.1, 11M nodes, took 12 minutes
at ``nice -n 19`` on a busy machine and 9 GB here.) Steps: (0) ``--again N``: each stand-in's batch kind profiled again N times
with advise's own ``take_profile``, the four alternating, and the medians used (a profile
disturbed by load from outside the lock is otherwise taken as it is); (1) the stand-ins' facts:
each Cluster-GCN part's nodes and intra-part edges (from the partition cache the profile made),
a sampled batch's nodes and edges per hop (gnnpar's sampler,
:func:`~gnnpar.advise.scale.measure_work`) at each of ``--work-scales``, extrapolated to
papers100M (:func:`~gnnpar.advise.scale.extrapolate_work`, fitted on the first three); (2) how
making a batch splits into sampling and feature gather at each of those sizes (seconds per edge
drawn and per node gathered, extrapolated in log size), and random-row gather throughput from
tables of ``--gather-gb``; (3) the check: the 0.01 profile's per-step costs mapped to the 0.02
stand-in against the 0.02 profile's; (4) the table: papers100M on 4, 16, 64 hosts (one rank
each, hosts like this machine) for every ``--network``, and the memory per host. (0) and (2)
are timed: run the script under ``flock /tmp/gnnpar-bench.lock``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import torch

from benchmarks import harness
from gnnpar.advise import simulate as sim
from gnnpar.advise.command import parse_network
from gnnpar.advise.predict import Candidate, ClusterSpec, predict
from gnnpar.advise.profile import Profile
from gnnpar.advise.scale import (
    PAPERS100M,
    GraphShape,
    HopWork,
    evaluation_bytes,
    extrapolate_work,
    host_memory,
    measure_work,
    model_memory,
    scale_profile,
    target_partitions,
)

DATASET = "synthetic-papers100m"
GB = 1e9


def load(path: str) -> tuple[Profile, dict]:
    raw = json.loads(Path(path).read_text())
    return Profile(**raw["profile"]), raw


def dataset(root: str, scale: float):
    from gnnpar.data.datasets import load_dataset

    return load_dataset(DATASET, root, scale, 0)


def part_sizes(root: str, scale: float, parts: int) -> tuple[list[int], list[int]]:
    """Nodes and intra-part edges of each METIS part (the partition cache the profile made)."""
    from gnnpar.configure import build_config
    from gnnpar.data.partition import load_partitions

    ds = dataset(root, scale)
    flags = {"dataset": DATASET, "scale": scale, "data-root": root, "model": "gcn"}
    flags.update({"partitions": parts, "partitioner": "metis", "quiet": True})
    graph, _, _ = load_partitions(build_config(None, flags), ds)
    t = graph.tensors
    return torch.diff(t["node_ptr"]).tolist(), torch.diff(t["edge_ptr"]).tolist()


def work_at(root: str, scales: list[float], fanouts, batch) -> dict[float, tuple[int, HopWork]]:
    out = {}
    for s in scales:
        ds = dataset(root, s)
        out[s] = (ds.num_nodes, measure_work(ds, fanouts, batch, batches=8))
        del ds
    return out


def rows(w: HopWork) -> float:
    """Destination rows of a sampled batch's first layer (every hop but the last): what the
    trimmed layers of gnnpar's GraphSAGE compute on."""
    return sum(w.nodes[:-1])


# ------------------------------------------------------------------ timed measurements
def making_split(root: str, scale: float, fanouts, batch, n: int = 8) -> dict[str, float]:
    """Sampling and feature gather of a batch, one thread (a loader worker), over ``n``
    batches after a warm-up: mean seconds of each, and per unit of work (seconds per edge
    drawn, per node gathered)."""
    from gnnpar.data.sampling.loader import epoch_seeds
    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler

    ds = dataset(root, scale)
    x = ds.data.x.clone()  # resident, as the run's /dev/shm copy is (the cache is mapped)
    sampler = NeighborSampler(CSRGraph.from_edge_index(ds.data.edge_index, ds.num_nodes), fanouts)
    train = ds.data.train_mask.nonzero().view(-1)
    seeds = epoch_seeds(train, 1, 0, 0, 1, batch)[: n + 1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ts, tg, edges, nodes = [], [], 0, 0
    try:
        for i, s in enumerate(seeds):
            t0 = time.perf_counter()
            b = sampler.sample(s, torch.Generator().manual_seed(i))
            t1 = time.perf_counter()
            torch.index_select(x, 0, b.n_id)
            t2 = time.perf_counter()
            if i:
                ts.append(t1 - t0)
                tg.append(t2 - t1)
                edges += sum(b.num_sampled_edges)
                nodes += b.num_nodes
    finally:
        torch.set_num_threads(threads)
    return {
        "sample_s": statistics.fmean(ts),
        "gather_s": statistics.fmean(tg),
        "per_edge_s": sum(ts) / edges,
        "per_node_s": sum(tg) / nodes,
    }


def gather_rate(gb: float, width: int = 128, rows_drawn: int = 400_000) -> float:
    """Seconds per row of ``torch.index_select`` of random rows (float32, ``width`` wide) from
    a table of ``gb`` GB, one thread; the median of 5 draws after a warm-up."""
    n = int(gb * GB / (width * 4))
    table = torch.empty(n, width)
    table.fill_(1.0)  # touch every page first
    g = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = []
    try:
        for i in range(6):
            idx = torch.randint(n, (rows_drawn,), generator=g)
            t0 = time.perf_counter()
            torch.index_select(table, 0, idx)
            if i:
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    del table
    return statistics.median(times) / rows_drawn


def profile_again(
    root: str, profs: dict[tuple[float, str], Profile], reps: int, fanouts, batch
) -> dict:
    """Each stand-in's batch kind (``(scale, "sampled" | "cluster")``) profiled again with
    ``gnnpar advise``'s own :func:`~gnnpar.advise.profile.take_profile` (no gloo), ``reps``
    times, the four alternating, so that a burst of load from outside the lock lands on each
    alike; each profile's step times are replaced by the medians (sampled: of each cost;
    Cluster-GCN: of each part's step). Returns every repetition's figures."""
    from gnnpar.advise.profile import Need, take_profile

    got: dict = {key: [] for key in profs}
    for _ in range(reps):
        for (scale, kind), prof in profs.items():
            base = {
                "dataset": DATASET,
                "scale": scale,
                "data-root": root,
                "hidden": 256,
                "layers": 3,
                "epochs": 1,
                "threads": prof.threads,
            }
            if kind == "sampled":
                base.update({"model": "sage", "fanouts": ",".join(map(str, fanouts))})
                need = Need("sampled", batch_size=batch)
            else:
                base.update({"model": "gcn", "partitioner": "metis"})
                need = Need("parts", partitions=int(next(iter(prof.parts_step_s))))
            again = take_profile(base, [need], prof.threads, False, 120)
            if kind == "sampled":
                got[scale, kind].append(again.sampled[str(batch)])
                figure = f"compute {again.sampled[str(batch)]['compute_s'] * 1e3:.0f} ms"
            else:
                got[scale, kind].append(again.parts_step_s[str(need.partitions)])
                figure = f"mean part {statistics.fmean(got[scale, kind][-1]) * 1e3:.1f} ms"
            print(f"  {kind} {scale:g}: {figure}", flush=True)
    for (scale, kind), prof in profs.items():
        runs = got[scale, kind]
        if kind == "sampled":
            b = prof.sampled[str(batch)]
            for k in ("sample_s", "main_sample_s", "compute_s"):
                b[k] = statistics.median(r[k] for r in runs)
        else:
            p = next(iter(prof.parts_step_s))
            prof.parts_step_s[p] = [statistics.median(r) for r in zip(*runs)]
    return {f"{kind} {scale:g}": runs for (scale, kind), runs in got.items()}


# ------------------------------------------------------------------ the mapping
def unit_costs(split: dict[int, dict], num_nodes: int) -> tuple[float, float]:
    """(seconds per edge drawn, per node gathered) on a graph of ``num_nodes``: measured at
    each stand-in size (``split``: nodes -> :func:`making_split`), interpolated linearly in
    log size between them, and beyond the largest extrapolated along the line through the two
    largest (never below the largest's: the graph outgrows the caches further)."""
    sizes = sorted(split)
    keys = ("per_edge_s", "per_node_s")
    if num_nodes in split:
        return tuple(split[num_nodes][k] for k in keys)
    if num_nodes < sizes[0]:
        return tuple(split[sizes[0]][k] for k in keys)
    a, b = next(
        ((x, y) for x, y in zip(sizes, sizes[1:]) if x <= num_nodes <= y), tuple(sizes[-2:])
    )
    f = math.log(num_nodes / a) / math.log(b / a)
    out = [split[a][k] + f * (split[b][k] - split[a][k]) for k in keys]
    if num_nodes > sizes[-1]:
        out = [max(v, split[sizes[-1]][k]) for v, k in zip(out, keys)]
    return out[0], out[1]


def making_cost(costs: tuple[float, float], w: HopWork) -> float:
    """Seconds to make a batch of work ``w``: each edge drawn, each node's row gathered."""
    return costs[0] * w.total_edges + costs[1] * w.total_nodes


SMOKE = harness.RESULTS / "advise_scale_2026-11-24"  # a finished run: profiles and --json


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--data-root")
    ap.add_argument("--sampled", help="advice.json, sampled, of the stand-in")
    ap.add_argument("--cluster", help="advice.json, Cluster-GCN, of the stand-in")
    ap.add_argument("--replay", help="a finished run's --json: step (4) alone from its factors")
    ap.add_argument("--check-sampled", help="advice.json, sampled, of a larger stand-in")
    ap.add_argument("--check-cluster", help="advice.json, Cluster-GCN, of a larger stand-in")
    ap.add_argument("--work-scales", default="0.01,0.02", help="stand-in scales to count work")
    ap.add_argument("--gather-gb", default="", help="table sizes (GB) to time gathers from")
    ap.add_argument("--hosts", default="4,16,64")
    ap.add_argument("--network", nargs="+", default=["25gbit,10us", "100gbit,5us"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument(
        "--again", type=int, default=0, help="profile the stand-ins' batches again this often"
    )
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args(argv)
    if args.smoke:  # the stored run's table again (nothing generated, nothing timed)
        args.sampled = str(SMOKE / "s0.01-sampled.advice.json")
        args.cluster = str(SMOKE / "s0.01-cluster.advice.json")
        args.replay, args.hosts, args.network = (
            str(SMOKE / "advise_scale.json"),
            "4",
            ["25gbit,10us"],
        )
    if not (args.sampled and args.cluster):
        ap.error("--sampled and --cluster are required")
    harness.print_header()
    if args.replay:
        replay(args)
        return
    if not args.data_root:
        ap.error("--data-root is required (or --replay)")
    root = args.data_root
    out: dict = {"target": PAPERS100M.__dict__}

    sp, _ = load(args.sampled)
    cp, _ = load(args.cluster)
    fanouts = sp.sampled[next(iter(sp.sampled))]["fanouts"]
    batch = int(next(iter(sp.sampled)))
    profs = {(0.01, "sampled"): sp, (0.01, "cluster"): cp}
    if args.check_sampled and args.check_cluster:
        sp2, _ = load(args.check_sampled)
        cp2, _ = load(args.check_cluster)
        profs.update({(0.02, "sampled"): sp2, (0.02, "cluster"): cp2})
    if args.again:

        def headline(kind: str, p: Profile) -> float:
            if kind == "cluster":
                return statistics.fmean(next(iter(p.parts_step_s.values())))
            return p.sampled[str(batch)]["compute_s"]

        before = {key: headline(key[1], p) for key, p in profs.items()}
        print(f"## the stand-ins' batch kinds profiled again, {args.again} times, alternating")
        out["again"] = profile_again(root, profs, args.again, fanouts, batch)
        for (scale, kind), p in profs.items():
            now = headline(kind, p)
            what = "mean part step" if kind == "cluster" else "sampled compute_s"
            print(
                f"  {kind} {scale:g}: {what} {now * 1e3:.1f} ms (median of the repetitions; "
                f"gnnpar advise's own profile: {before[scale, kind] * 1e3:.1f} ms)"
            )
    base_ds = dataset(root, 0.01)
    if base_ds.num_nodes != sp.num_nodes:
        raise SystemExit("--sampled was not profiled on synthetic-papers100m --scale 0.01")
    small_nodes = base_ds.num_nodes
    columns = base_ds.data.edge_index.size(1) / small_nodes
    del base_ds

    # (1) the stand-ins' facts
    parts = int(next(iter(cp.parts_step_s)))
    nodes_p, edges_p = part_sizes(root, 0.01, parts)
    print(
        f"## stand-in: {DATASET} --scale 0.01, {small_nodes:,} nodes, {sp.num_train:,} "
        f"training; {parts} METIS parts: {statistics.fmean(nodes_p):,.0f} nodes and "
        f"{statistics.fmean(edges_p):,.0f} intra-part edges per part (min {min(edges_p):,}, "
        f"max {max(edges_p):,}), {sum(edges_p) / cp.num_nodes:.2f} per node "
        f"(of {columns:.2f} edge_index columns per node in the graph)"
    )
    out["parts"] = {"0.01": {"nodes": nodes_p, "edges": edges_p}}
    scales = [float(s) for s in args.work_scales.split(",")]
    work = work_at(root, scales, fanouts, batch)
    out["work"] = {str(s): {"num_nodes": n, **w.__dict__} for s, (n, w) in work.items()}
    fitted = extrapolate_work([work[s] for s in scales[:3]])
    print("\n## sampled batch work (mean of 8 batches of 1024 seeds, fanouts " + str(fanouts))
    print("| graph | nodes | batch nodes per hop | batch nodes | edges | layer-1 rows | fitted |")
    print("|---|---|---|---|---|---|---|")
    for s, (n, w) in work.items():
        f = fitted(n)
        print(
            f"| scale {s:g} | {n:,} | {', '.join(f'{x:,.0f}' for x in w.nodes)} | "
            f"{w.total_nodes:,.0f} | {w.total_edges:,.0f} | {rows(w):,.0f} | "
            f"{f.total_nodes:,.0f} ({f.total_nodes / w.total_nodes - 1:+.1%}) |"
        )
    target_w = fitted(PAPERS100M.num_nodes)
    small_w = work[0.01][1]
    print(
        f"| papers100M (extrapolated, g = {fitted.exponent:.2f}, from scales "
        f"{', '.join(f'{s:g}' for s in scales[:3])}) | {PAPERS100M.num_nodes:,} | "
        f"{', '.join(f'{x:,.0f}' for x in target_w.nodes)} | {target_w.total_nodes:,.0f} | "
        f"{target_w.total_edges:,.0f} | {rows(target_w):,.0f} | |"
    )
    out["work_fit"] = {"exponent": fitted.exponent, "papers100M": target_w.__dict__}

    # (2) timed: making a batch at each stand-in size, gathers from big tables
    splits = {work[sc][0]: making_split(root, sc, fanouts, batch) for sc in scales}
    rates: dict[float, float] = {}
    for gb in [float(g) for g in args.gather_gb.split(",") if g]:
        rates[gb] = gather_rate(gb)
    out["making_split"] = {str(k): v for k, v in splits.items()}
    out["gather_s_per_row"] = {str(k): v for k, v in rates.items()}
    print("\n## making a batch (one thread, 8 batches): sampling and feature gather")
    print("| graph | x table | sampling ms | ns per edge drawn | gather ms | ns per node |")
    print("|---|---|---|---|---|---|")
    for sc in scales:
        n = work[sc][0]
        m = splits[n]
        print(
            f"| scale {sc:g} | {n * PAPERS100M.num_features * 4 / GB:.2f} GB | "
            f"{m['sample_s'] * 1e3:.1f} | {m['per_edge_s'] * 1e9:.0f} | "
            f"{m['gather_s'] * 1e3:.1f} | {m['per_node_s'] * 1e9:.0f} |"
        )
    big = unit_costs(splits, PAPERS100M.num_nodes)
    print(
        f"| papers100M (extrapolated) | {PAPERS100M.num_nodes * 512 / GB:.1f} GB | | "
        f"{big[0] * 1e9:.0f} | | {big[1] * 1e9:.0f} |"
    )
    for gb, r in rates.items():
        print(f"random 512-B rows from a {gb:g} GB anonymous table: {r * 1e9:.0f} ns per row")

    # (3) the check: 0.01's costs mapped to 0.02 against 0.02's
    if args.check_sampled and args.check_cluster:
        print("\n## check: the 0.01 profile mapped to the 0.02 stand-in, against its profile")
        check: dict = {}
        w2 = work[0.02][1]
        b1, b2 = sp.sampled[str(batch)], sp2.sampled[str(batch)]
        print("\n| what | predicted from 0.01 | measured on 0.02 | error |")
        print("|---|---|---|---|")
        for name, pred, meas in (
            ("sampled compute_s, same work", b1["compute_s"], b2["compute_s"]),
            (
                "sampled compute_s x layer-1 rows",
                b1["compute_s"] * rows(w2) / rows(small_w),
                b2["compute_s"],
            ),
            ("sampled sample_s, same work", b1["sample_s"], b2["sample_s"]),
            (
                "sampled sample_s x work (0.01's unit costs)",
                b1["sample_s"]
                * making_cost(unit_costs(splits, small_nodes), w2)
                / making_cost(unit_costs(splits, small_nodes), small_w),
                b2["sample_s"],
            ),
            (
                "sampled sample_s x work and unit costs (0.02's measured)",
                b1["sample_s"]
                * making_cost(unit_costs(splits, work[0.02][0]), w2)
                / making_cost(unit_costs(splits, small_nodes), small_w),
                b2["sample_s"],
            ),
        ):
            check[name] = (pred, meas)
            print(
                f"| {name} | {pred * 1e3:.1f} ms | {meas * 1e3:.1f} ms | {pred / meas - 1:+.1%} |"
            )
        p2 = int(next(iter(cp2.parts_step_s)))
        mine = scale_profile(
            cp, GraphShape("0.02", cp2.num_nodes, 0, 128, 172, cp2.num_train), {parts: p2}
        )
        steps1, steps2 = mine.parts_step_s[str(p2)], cp2.parts_step_s[str(p2)]
        for name, pred, meas in (
            ("Cluster-GCN mean part step", statistics.fmean(steps1), statistics.fmean(steps2)),
            ("Cluster-GCN one-rank epoch (sum of parts)", sum(steps1), sum(steps2)),
        ):
            check[name] = (pred, meas)
            print(f"| {name} | {pred:.4f} s | {meas:.4f} s | {pred / meas - 1:+.1%} |")
        nodes2, edges2 = part_sizes(root, 0.02, p2)
        print(
            f"\n0.02 stand-in: {p2} METIS parts of {statistics.fmean(nodes2):,.0f} nodes and "
            f"{statistics.fmean(edges2):,.0f} intra-part edges (0.01: "
            f"{statistics.fmean(nodes_p):,.0f} and {statistics.fmean(edges_p):,.0f})"
        )
        out["parts"]["0.02"] = {"nodes": nodes2, "edges": edges2}
        out["check"] = check

    # (4) papers100M
    q = target_partitions(cp.num_nodes, parts, PAPERS100M.num_nodes)
    step_f = rows(target_w) / rows(small_w)
    make_f = making_cost(big, target_w) / making_cost(unit_costs(splits, small_nodes), small_w)
    out["factors"] = {"step": step_f, "making": make_f, "partitions": q}
    papers100m(args, out, sp, cp, batch, fanouts, parts, target_w, edges_p)


def papers100m(args, out, sp, cp, batch, fanouts, parts, target_w, edges_p) -> None:
    """Step (4): the table of papers100M on ``--hosts`` x ``--network``, and its memory, from
    the stand-in's profiles mapped by ``out["factors"]`` (see the module's docstring)."""
    q, step_f, make_f = (out["factors"][k] for k in ("partitions", "step", "making"))
    big_s = scale_profile(sp, PAPERS100M, work_ratio={batch: (step_f, make_f)})
    big_c = scale_profile(cp, PAPERS100M, partitions={parts: q})
    intra = round(statistics.fmean(edges_p) * q)
    print(
        f"\n## papers100M: {q:,} parts of ~{PAPERS100M.num_nodes / q:,.0f} nodes, "
        f"{intra:,} intra-part edges assumed (the stand-in's per part); sampled per-step "
        f"factors: training x{step_f:.3f}, making x{make_f:.3f}; "
        f"{PAPERS100M.num_train:,} training nodes"
    )
    common = {"dataset": DATASET, "hidden": 256, "layers": 3, "epochs": 1}
    mem_s = model_memory(
        {
            **common,
            "model": "sage",
            "strategy": "sampled",
            "batch-size": batch,
            "fanouts": ",".join(map(str, fanouts)),
        },
        PAPERS100M,
    )
    mem_c = model_memory(
        {**common, "model": "gcn", "strategy": "sequential", "partitions": q}, PAPERS100M
    )
    # a batch's own tensors (features of its nodes, its edge_index) on top of footprint's
    batch_bytes = target_w.total_nodes * 128 * 4 + target_w.total_edges * 2 * 8
    candidates = [
        Candidate("sampled", {"batch_size": batch, "loader_workers": 0}, 0),
        Candidate("sampled", {"batch_size": batch, "loader_workers": 2}, 0),
        Candidate("allreduce", {"partitions": q, "sync_every": 1}, 0),
        Candidate("allreduce", {"partitions": q, "sync_every": 20}, 0),
        Candidate("gossip", {"partitions": q, "sync_every": 1}, 0),
        Candidate("gossip", {"partitions": q, "sync_every": 20}, 0),
    ]
    nets = [parse_network(n) for n in args.network]
    head = " | ".join(f"{n}: epoch s | speed-up | network GB/epoch" for n in args.network)
    print(f"\n| hosts | strategy | {head} | memory per host (GB) |")
    print("|---|---|" + "---|---|---|" * len(nets) + "---|")
    table = []
    one_rank: dict[str, float] = {}
    for hosts in [int(h) for h in args.hosts.split(",")]:
        for c0 in candidates:
            c = Candidate(c0.strategy, c0.settings, hosts)
            prof = big_s if c.strategy == "sampled" else big_c
            cells, row = [], {"hosts": hosts, "strategy": c.label()}
            for text, link in zip(args.network, nets):
                p = predict(c, prof, ClusterSpec(hosts, 1, link), sim.NONE, args.epochs)
                gb = p.bytes_on_network / args.epochs / GB
                cells.append(f"{p.epoch_s:,.1f} | {p.speedup:.1f}x | {gb:,.1f}")
                row[text] = {"epoch_s": p.epoch_s, "speedup": p.speedup, "bytes": gb * GB}
                one_rank[c.label()] = p.epoch_s * p.speedup
            if c.strategy == "sampled":
                w = c.settings["loader_workers"]
                extra = batch_bytes * (2 * w if w else 1)  # batches in flight (prefetch 2 W)
                rank = sp.base_rss_bytes + sum(mem_s.values()) + int(extra)
                mem = host_memory("sampled", PAPERS100M, 1, hosts, rank, w)
            else:
                rank = cp.base_rss_bytes + sum(mem_c.values())
                mem = host_memory(c.strategy, PAPERS100M, 1, hosts, rank, intra_part_edges=intra)
            steady = sum(v for k, v in mem.items() if k != "setup extra")
            row["memory"] = mem
            table.append(row)
            peak = (
                f" (set-up {(steady + mem['setup extra']) / GB:,.0f})"
                if "setup extra" in mem
                else ""
            )
            print(
                f"| {hosts} | {c.label()} | " + " | ".join(cells) + f" | {steady / GB:,.1f}{peak} |"
            )
    out["table"], out["one_rank_epoch_s"] = table, one_rank
    print(
        "\none rank (the speed-ups' reference, same batches): "
        + ", ".join(f"{k} {v:,.0f} s" for k, v in one_rank.items())
    )
    print(
        f"per rank: sampled {(sp.base_rss_bytes + sum(mem_s.values())) / GB:.2f} GB "
        f"(bare rank {sp.base_rss_bytes / GB:.2f}, state {mem_s['state'] / 1e6:.1f} MB, "
        f"activations {mem_s['activations'] / 1e6:.1f} MB) + batch tensors "
        f"{batch_bytes / 1e6:.0f} MB each; Cluster-GCN {(cp.base_rss_bytes + sum(mem_c.values())) / GB:.2f} GB "
        f"(state {mem_c['state'] / 1e6:.1f} MB, activations {mem_c['activations'] / 1e6:.1f} MB)"
    )
    sym = GraphShape(
        "papers100M, symmetrised",
        PAPERS100M.num_nodes,
        2 * PAPERS100M.num_edges,
        PAPERS100M.num_features,
        PAPERS100M.num_classes,
        PAPERS100M.num_train,
    )
    m = host_memory("sampled", sym, 1, 4, sp.base_rss_bytes + sum(mem_s.values()))
    steady = sum(v for k, v in m.items() if k != "setup extra")
    print(
        f"symmetrised papers100M ({sym.num_edges:,} columns), sampled W=0: shared graph "
        f"{m['shared graph'] / GB:.1f} GB, {steady / GB:.1f} GB per host, set-up "
        f"{(steady + m['setup extra']) / GB:.0f} GB (not simulated: a denser stand-in would be "
        "needed)"
    )
    out["symmetrised_sampled_memory"] = m
    ev = evaluation_bytes(PAPERS100M, 256)
    out["evaluation"] = ev
    print(
        "rank 0's final full-graph evaluation (not in the table), at least "
        f"{sum(ev.values()) / GB:.0f} GB: x {ev['x'] / GB:.1f}, CSR {ev['adjacency'] / GB:.1f}, "
        f"one block's input and output {ev['activations'] / GB:.1f}"
    )
    if args.json:
        harness.write_json(args.json, out)


def replay(args) -> None:
    """Step (4) alone, from a finished run's ``--json`` (``--replay``: its factors, the
    extrapolated batch and the stand-in's parts) and the profiles: no stand-in is loaded."""
    old = json.loads(Path(args.replay).read_text())
    sp, _ = load(args.sampled)
    cp, _ = load(args.cluster)
    fanouts = sp.sampled[next(iter(sp.sampled))]["fanouts"]
    batch = int(next(iter(sp.sampled)))
    parts = int(next(iter(cp.parts_step_s)))
    out = {"target": PAPERS100M.__dict__, "factors": old["factors"], "replayed": args.replay}
    target_w = HopWork(**old["work_fit"]["papers100M"])
    papers100m(args, out, sp, cp, batch, fanouts, parts, target_w, old["parts"]["0.01"]["edges"])


if __name__ == "__main__":
    main()
