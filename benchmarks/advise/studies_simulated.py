"""The studies' tables simulated by ``gnnpar advise`` at their size, beside the studies' figures.

Each table is simulated from a profile that ``gnnpar advise`` took here (the ``profile`` of its
advice.json, passed with ``--reddit``, ``--amazon`` or ``--sampled``), with gnnpar's own
simulation (:func:`gnnpar.advise.predict.predict`); nothing is trained. The studies' figures are
quoted from the studies (003: Y. Zhang, "Efficient Asynchronous GCN Training on a GPU Cluster",
tables 3.10, 3.11, 4.6, 4.7; 002: A. Boca, "An analysis of multi-GPU training performance in GNN
libraries", table 2; docs/CONTRACTS.md cites all four) for comparison only.

    # the profile: the Reddit stand-in at study 003's size and settings (table 3.3)
    gnnpar advise --dataset synthetic-reddit --scale 1 --model gcn --hidden 128 --layers 2 \\
        --dropout 0.2 --partitions 40 --epochs 30 --sync-every 1 --hosts 8 --ranks-per-host 1 \\
        --network 100gbit,5us --threads 2 --strategies allreduce,gossip --out runs/reddit
    python -m benchmarks.advise.studies_simulated --reddit runs/reddit/advice.json [--network 100gbit,5us]
    # the Amazon stand-in (table 3.3: 640 subgraphs, 2 hidden layers of 512 = 3 convolutions as
    # gnnpar's presets read it, dropout 0.1, lr 1e-2, 30 epochs); S = 1, P = 640 at full size
    gnnpar advise --dataset synthetic-amazon --scale S --model gcn --hidden 512 --layers 3 \\
        --dropout 0.1 --lr 0.01 --weight-decay 0 --partitions P --epochs 30 --sync-every 1 \\
        --hosts 8 --ranks-per-host 1 --network 100gbit,5us --threads 2 \\
        --strategies allreduce,gossip --out runs/amazon
    python -m benchmarks.advise.studies_simulated --amazon runs/amazon/advice.json
    # study 002: one profile per batch size (each an advice.json), the 3 x 3 table of table 2
    python -m benchmarks.advise.studies_simulated --sampled runs/s002-{512,1024,2048}/advice.json \\
        [--cores 16]
    # study 000: ViG (8 blocks of C = 107) at the study's batch of 1000 images; the dataset's
    # scale only has to hold two global batches of the hybrid (2 x 1000 training images)
    gnnpar advise --dataset synthetic-cifar10 --scale 0.05 --model vig --batch-size 1000 \\
        --epochs 1 --threads 2 --hosts 4 --ranks-per-host 1 --network 100gbit,5us \\
        --strategies sequential,pipeline,hybrid --out runs/vig000
    python -m benchmarks.advise.studies_simulated --vig runs/vig000/advice.json

Study 003 ran one V100 per rank on one 8-GPU node (NCCL). The simulation puts each rank on a
host of its own like the profiling machine (its cores, its measured step times), joined by
``--network`` (default 100 Gbit/s, 5 us: an NVLink/PCIe-class link); ``--jitter`` adds the
study's "non-dedicated cluster" as gnnpar's emulation defines it (a pause of up to X times the
step, with probability 0.1 per step).

Amazon below scale 1: the study's 640 subgraphs have 1,598,960 / 640 = 2,498 nodes each. A
profile of the stand-in at ``--scale S`` with ``--partitions P = 640 S`` measures subgraphs of
that many nodes; the study's epoch is then simulated as 640 such subgraphs, the P measured step
times each standing for 640 / P of them (:func:`at_study_parts`), so each rank has the study's
number of steps per epoch (and the averaging interval K means what it meant there).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks import harness
from gnnpar.advise import simulate as sim
from gnnpar.advise.command import parse_network
from gnnpar.advise.predict import Candidate, ClusterSpec, predict
from gnnpar.advise.profile import Profile

# study 003: speed-up over one GPU (Cluster-GCN, same subgraphs), by (strategy, workers, K)
STUDY_003_REDDIT = {
    ("allreduce", 4, 1): 1.87,
    ("allreduce", 4, 20): 2.13,
    ("allreduce", 4, 100): 2.19,
    ("allreduce", 8, 1): 2.93,
    ("allreduce", 8, 20): 2.96,
    ("allreduce", 8, 100): 2.97,
    ("gossip", 4, 1): 2.40,
    ("gossip", 4, 20): 2.55,
    ("gossip", 4, 100): 2.82,
    ("gossip", 8, 1): 3.11,
    ("gossip", 8, 20): 4.02,
    ("gossip", 8, 100): 5.27,
}

# study 003, table 4.7 (its allreduce rows are table 3.11): Amazon, speed-up over one GPU
STUDY_003_AMAZON = {
    ("allreduce", 4, 1): 1.74,
    ("allreduce", 4, 20): 2.07,
    ("allreduce", 4, 100): 2.27,
    ("allreduce", 8, 1): 2.81,
    ("allreduce", 8, 20): 3.05,
    ("allreduce", 8, 100): 3.39,
    ("gossip", 4, 1): 2.44,
    ("gossip", 4, 20): 3.17,
    ("gossip", 4, 100): 3.47,
    ("gossip", 8, 1): 2.93,
    ("gossip", 8, 20): 4.36,
    ("gossip", 8, 100): 6.13,
}
STUDY_003_AMAZON_PARTS = 640  # table 3.3 ("Subgraph number"); Reddit: 40

# study 002, table 2: PyG GraphSAGE, seconds for 50 epochs (longest rank), by (GPUs, workers, B)
STUDY_002_SAGE = {
    (1, 8, 512): 4758,
    (1, 8, 1024): 3168,
    (1, 8, 2048): 2138,
    (2, 8, 512): 2818,
    (2, 8, 1024): 2119,
    (2, 8, 2048): 1593,
    (4, 1, 512): 4306,
    (4, 1, 1024): 3221,
    (4, 1, 2048): 2407,
}


RANKS_002 = ((1, 8), (2, 8), (4, 1))  # (GPUs, data workers) of table 2's rows

# study 000 (ViG on CIFAR-10, mini-batches of 1000 images, 100 of them timed): mean training
# seconds per mini-batch, tables 1 and 4-9, by (copies, stages, micro-batches); the study's
# stage splits (section 3: 4 + 4 blocks, and 2 blocks per stage)
STUDY_000_VIG = {
    (1, 1, 1): (37.44, "table 1"),
    (1, 2, 10): (25.69, "table 4"),
    (1, 2, 5): (19.02, "table 5"),
    (1, 4, 10): (29.36, "table 6"),
    (1, 4, 5): (28.12, "table 7"),
    (2, 2, 10): (25.70, "table 8"),
    (2, 2, 5): (19.19, "table 9"),
}
STUDY_000_BALANCE = {2: [4, 4], 4: [2, 2, 2, 2]}
STUDY_000_BATCHES = 100  # mini-batches per table


def load_profile(path: str) -> Profile:
    return Profile(**json.loads(Path(path).read_text())["profile"])


def at_study_parts(prof: Profile, parts: int) -> tuple[Profile, int]:
    """``prof`` with ``parts`` subgraphs per epoch, and the partition count it measured. A
    profile that measured ``parts`` is returned as it is; one that measured a single other
    count P (a scaled-down stand-in cut so that its subgraphs have the study's nodes each)
    gets ``parts`` subgraphs whose step times are its P measured ones, each used ``parts / P``
    times (subgraph i takes measured step ``i mod P``)."""
    if str(parts) in prof.parts_step_s:
        return prof, parts
    if len(prof.parts_step_s) != 1:
        raise SystemExit(
            f"the profile measured --partitions {', '.join(prof.parts_step_s) or 'none'}: "
            f"give one profile with a single partition count to stand for {parts} subgraphs"
        )
    ((measured, steps),) = prof.parts_step_s.items()
    tiled = [steps[i % len(steps)] for i in range(parts)]
    return replace(prof, parts_step_s={**prof.parts_step_s, str(parts): tiled}), int(measured)


def study_003(
    prof: Profile,
    network: sim.Link,
    jitters: list[float],
    parts: int,
    study: dict[tuple[str, int, int], float],
) -> list[str]:
    """Study 003's speed-up table (allreduce and gossip, 4 and 8 workers, K = 1, 20, 100) of
    the figures ``study``, simulated from ``prof`` with ``parts`` subgraphs per epoch."""
    prof, measured = at_study_parts(prof, parts)
    epoch_1 = sum(prof.parts_step_s[str(parts)])
    stand_in = ""
    if measured != parts:
        stand_in = (
            f" Each of the {parts} subgraphs takes the step time of one of the {measured} "
            f"measured subgraphs ({prof.num_nodes:,} nodes / {measured} = "
            f"{prof.num_nodes / measured:,.0f} nodes each), each measured one standing for "
            f"{parts / measured:g}."
        )
    rows = [
        f"Simulated from a profile taken on {prof.machine} ({prof.cores} cores, "
        f"{prof.threads} thread(s) per rank): {prof.dataset} ({prof.num_nodes:,} nodes) "
        f"{prof.model}, {parts} subgraphs per epoch, {prof.epochs} epochs, one rank per host, "
        f"{network.bandwidth_Bps * 8 / 1e9:g} Gbit/s {network.latency_s * 1e6:g} us between "
        f"hosts. One-rank epoch: {epoch_1:.2f} s.{stand_in}",
        "",
        "| strategy | workers | K | study 003 speed-up | "
        + " | ".join(f"simulated, jitter {j:g}" for j in jitters)
        + " | simulated epoch s (jitter 0) | bytes on network / epoch |",
        "|---|---|---|---|" + "---|" * len(jitters) + "---|---|",
    ]
    for strategy in ("allreduce", "gossip"):
        for world in (4, 8):
            for k in (1, 20, 100):
                spec = ClusterSpec(world, 1, network)
                c = Candidate(strategy, {"partitions": parts, "sync_every": k}, world)
                preds = [
                    predict(c, prof, spec, sim.Stragglers({}, j, prof.seed), prof.epochs)
                    for j in jitters
                ]
                p0 = preds[0]
                rows.append(
                    f"| {strategy} | {world} | {k} | {study[(strategy, world, k)]:.2f} | "
                    + " | ".join(f"{p.speedup:.2f}" for p in preds)
                    + f" | {p0.epoch_s:.3f} | {p0.bytes_on_network / prof.epochs / 1e6:.1f} MB |"
                )
    steps = prof.parts_step_s[str(measured)]
    rows += [
        "",
        f"per-part step (s, {measured} measured): median {statistics.median(steps):.4f}, "
        f"min {min(steps):.4f}, max {max(steps):.4f}; parameters {prof.param_bytes / 1e3:.0f} kB; "
        f"profile {prof.profile_s:.1f} s",
    ]
    return rows


def sampled_by_batch(profs: list[Profile]) -> dict[int, Profile]:
    """Each batch size the profiles measured, with its profile. They must be of one dataset,
    model and epoch count; a profile taken without gloo (one rank) borrows the gloo costs of
    one that has them."""
    kinds = {(p.dataset, p.model, p.epochs) for p in profs}
    if len(kinds) > 1:
        raise SystemExit(
            "--sampled: the profiles are of different runs (dataset, model, epochs): "
            + "; ".join(" ".join(map(str, k)) for k in sorted(kinds))
        )
    comm = next((p.comm for p in profs if p.comm), {})
    out: dict[int, Profile] = {}
    for prof in profs:
        for b in prof.sampled:
            if int(b) in out:
                raise SystemExit(f"--sampled: batch size {b} is in more than one profile")
            out[int(b)] = replace(prof, comm=prof.comm or comm)
    return dict(sorted(out.items()))


def study_002(profs: list[Profile]) -> list[str]:
    """Study 002's table 2 (GraphSAGE, PyG): 1, 2, 4 ranks on one host, each with its own
    loader workers (8, 8, 1 as the study), by the batch size per rank, one column pair per
    batch size the profiles measured: the study's seconds for 50 epochs beside the simulated
    ones, then the speed-ups over one rank beside each other."""
    by_batch = sampled_by_batch(profs)
    sims: dict[tuple[int, int], object] = {}
    for b, prof in by_batch.items():
        for world, workers in RANKS_002:
            c = Candidate("sampled", {"batch_size": b, "loader_workers": workers}, world)
            sims[world, b] = predict(c, prof, ClusterSpec(1, world), sim.NONE, prof.epochs)

    def study(world: int, workers: int, b: int) -> str:
        s = STUDY_002_SAGE.get((world, workers, b))
        return "-" if s is None else f"{s}"

    batches = list(by_batch)
    rows = [
        "Seconds for all epochs (study: 50 epochs, longest rank):",
        "",
        "| ranks | loader workers | "
        + " | ".join(f"B={b}: study 002 s | B={b}: simulated s" for b in batches)
        + " |",
        "|---|---|" + "---|---|" * len(batches),
    ]
    for world, workers in RANKS_002:
        cells = [f"{study(world, workers, b)} | {sims[world, b].train_time_s:.0f}" for b in batches]
        rows.append(f"| {world} | {workers} | " + " | ".join(cells) + " |")
    rows += [
        "",
        "Speed-up over 1 rank (simulated: share of the ranks' time spent waiting on data or "
        "others):",
        "",
        "| ranks | loader workers | "
        + " | ".join(f"B={b}: study 002 | B={b}: simulated" for b in batches)
        + " |",
        "|---|---|" + "---|---|" * len(batches),
    ]
    for world, workers in RANKS_002:
        cells = []
        for b in batches:
            one_study = STUDY_002_SAGE.get((1, 8, b))
            here = STUDY_002_SAGE.get((world, workers, b))
            st = "-" if one_study is None or here is None else f"{one_study / here:.2f}"
            p = sims[world, b]
            cells.append(
                f"{st} | {sims[1, b].train_time_s / p.train_time_s:.2f} ({p.wait_share:.0%})"
            )
        rows.append(f"| {world} | {workers} | " + " | ".join(cells) + " |")
    rows.append("")
    for b, prof in by_batch.items():
        s = prof.sampled[str(b)]
        rows.append(
            f"B={b}: profile of {prof.dataset} {prof.model} on {prof.machine} "
            f"({prof.cores} cores, {prof.threads} thread(s) per rank) in {prof.profile_s:.1f} s; "
            f"per batch: sampling + gathering {s['sample_s']:.3f} s in a loader worker "
            f"({s['main_sample_s']:.3f} s in the main process), forward + backward "
            f"{s['compute_s']:.3f} s; gloo costs {'measured' if prof.comm else 'none (free)'}"
        )
    return rows


def simulate_000(prof: Profile, network: sim.Link) -> dict[tuple[int, int, int], dict]:
    """Every configuration of study 000's tables from the one ViG profile ``prof``
    (:func:`gnnpar.advise.profile.image_pipeline` composes each shape from the per-block
    costs, with the study's stage splits), each rank a host like the profiling machine joined
    by ``network``, over the study's 100 mini-batches per copy of the model: seconds per
    mini-batch, speed-up over sequential on the same images (images per second, as the study's
    3.8 for the hybrid), the share of the ranks' time spent waiting."""
    from gnnpar.advise.profile import image_pipeline

    if prof.kind != "image":
        raise SystemExit(f"--vig: the profile is of {prof.dataset} {prof.model}, not ViG images")
    b = prof.batch_size
    prof = replace(prof, num_train=2 * STUDY_000_BATCHES * b, max_steps=None)
    prof.pipeline = dict(prof.pipeline)
    out = {}
    for replicas, stages, chunks in STUDY_000_VIG:
        if stages == 1:
            c = Candidate("sequential", {}, 1)
        else:
            image_pipeline(prof, replicas, stages, chunks, STUDY_000_BALANCE[stages])
            settings = {"stages": stages, "chunks": chunks}
            if replicas > 1:
                settings["replicas"] = replicas
            c = Candidate("hybrid" if replicas > 1 else "pipeline", settings, replicas * stages)
        p = predict(c, prof, ClusterSpec(c.world, 1, network), sim.NONE, 1)
        shape = prof.pipeline.get(f"{replicas}x{stages}x{chunks}")
        out[replicas, stages, chunks] = {
            "step_s": p.train_time_s / (prof.num_train // (replicas * b)),
            "speedup": p.speedup,
            "wait": p.wait_share,
            "act_bytes": shape["act_bytes"][0] if shape else None,
        }
    return out


def study_000(profs: list[Profile], network: sim.Link) -> list[str]:
    """Study 000's tables 4-9 (and table 1, the sequential baseline): seconds per mini-batch of
    1000 images and the speed-up over sequential, the study's beside the simulation's
    (:func:`simulate_000`); with several profiles, the median of their simulations and the
    range."""
    sims = [simulate_000(p, network) for p in profs]
    first = profs[0]

    def cell(key, what: str, fmt: str) -> str:
        values = [s[key][what] for s in sims]
        mid = format(statistics.median(values), fmt)
        if len(values) == 1:
            return mid
        return f"{mid} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    rows = [
        f"Simulated from {len(profs)} profile(s) taken on {first.machine} ({first.cores} cores, "
        f"{first.threads} thread(s) per rank) in "
        + ", ".join(f"{p.profile_s:.1f}" for p in profs)
        + f" s: {first.model} ({first.param_bytes // 4:,} parameters), {first.batch_size} images "
        f"per mini-batch (per copy), each block timed on "
        f"{max(map(int, first.images['probes']))} images and scaled per image; one rank per "
        f"host, {network.bandwidth_Bps * 8 / 1e9:g} Gbit/s {network.latency_s * 1e6:g} us "
        "between hosts"
        + ("; median of the profiles' simulations (range)." if len(profs) > 1 else "."),
        "",
        "| configuration | study 000 | study s / mini-batch | study speed-up | "
        "simulated s / mini-batch | simulated speed-up | GPipe bound | waiting | "
        "activations / micro-batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    seq_study = STUDY_000_VIG[1, 1, 1][0]
    for key, (study_s, table) in STUDY_000_VIG.items():
        replicas, stages, chunks = key
        name = "sequential"
        if stages > 1:
            name = f"{replicas} x {stages} hybrid" if replicas > 1 else f"{stages} stages"
            name += f", {chunks} micro-batches"
        bound = replicas * stages * chunks / (chunks + stages - 1)
        act = sims[0][key]["act_bytes"]
        rows.append(
            f"| {name} | {table} | {study_s:.2f} | {replicas * seq_study / study_s:.2f} | "
            f"{cell(key, 'step_s', '.1f')} | {cell(key, 'speedup', '.2f')} | {bound:.2f} | "
            f"{cell(key, 'wait', '.0%')} | {'-' if act is None else f'{act / 1e6:.1f} MB'} |"
        )
    rows.append("")
    for prof in profs:
        im = prof.images
        probe = im["probes"][max(im["probes"], key=int)]
        per_image = [f + b for f, b in zip(probe["fwd_s"], probe["bwd_s"])]
        rows.append(
            "Per image (forward + backward, s), blocks 1-8 (the stem in the first, the readout "
            "in the last): " + ", ".join(f"{t:.4f}" for t in per_image) + f"; optimizer step "
            f"{im['opt_s']:.4f} s; one {prof.batch_size}-image step sequential: "
            f"{prof.full_step_s:.1f} s"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--reddit", help="advice.json of the Reddit stand-in (Cluster-GCN)")
    ap.add_argument("--amazon", help="advice.json of the Amazon stand-in (Cluster-GCN)")
    ap.add_argument("--sampled", nargs="*", default=[], help="advice.json files (study 002)")
    ap.add_argument(
        "--vig", nargs="*", default=[], help="advice.json files of ViG at study 000's size"
    )
    ap.add_argument("--network", default="100gbit,5us")
    ap.add_argument("--jitter", default="0,0.5,2", help="comma-separated --jitter values")
    ap.add_argument("--partitions", type=int, default=40, help="Reddit's subgraphs per epoch")
    ap.add_argument(
        "--amazon-partitions",
        type=int,
        default=STUDY_003_AMAZON_PARTS,
        help="Amazon's subgraphs per epoch (the study's 640); a profile that measured another "
        "count stands for this many (see the module's docstring)",
    )
    ap.add_argument(
        "--cores",
        type=int,
        help="study 002: cores of the simulated host, each as fast as one here "
        "(default: this machine's); the study does not say its N1's",
    )
    args = ap.parse_args(argv)
    if args.smoke:  # stored profiles: study 003's table on a Cluster-GCN one, study 000's
        stored = harness.RESULTS
        args.reddit = str(stored / "advise_scale_2026-11-24" / "s0.01-cluster.advice.json")
        args.vig = [str(stored / "advise_vig000_2026-11-26" / "rep1.advice.json")]
        args.sampled = [str(stored / "advise_scale_2026-11-24" / "s0.01-sampled.advice.json")]
        args.jitter = "0"
    harness.print_header()
    network = parse_network(args.network)
    jitters = [float(j) for j in args.jitter.split(",")]
    for name, path, parts, study in (
        ("Reddit", args.reddit, args.partitions, STUDY_003_REDDIT),
        ("Amazon", args.amazon, args.amazon_partitions, STUDY_003_AMAZON),
    ):
        if path:
            print(f"Study 003, {name}:\n")
            print("\n".join(study_003(load_profile(path), network, jitters, parts, study)))
            print()
    if args.vig:
        print("Study 000, tables 1 and 4-9 (ViG, CIFAR-10):\n")
        print("\n".join(study_000([load_profile(p) for p in args.vig], network)))
        print()
    if args.sampled:
        profs = [load_profile(p) for p in args.sampled]
        for prof in profs:
            prof.cores = args.cores or prof.cores
        print(f"Study 002, table 2 (GraphSAGE): a host of {profs[0].cores} cores\n")
        print("\n".join(study_002(profs)))


if __name__ == "__main__":
    main()
