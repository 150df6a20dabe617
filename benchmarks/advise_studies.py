"""The studies' tables simulated by ``gnnpar advise`` at their size, beside the studies' figures.

Each table is simulated from a profile that ``gnnpar advise`` took here (the ``profile`` of its
advice.json, passed with ``--reddit``), with gnnpar's own simulation
(:func:`gnnpar.advise.predict.predict`); nothing is trained. The studies' figures are quoted
from /work/shared/seeds (study 003, tables 3.10, 3.11, 4.6, 4.7) for comparison only.

    # the profile: the Reddit stand-in at study 003's size and settings (table 3.3)
    gnnpar advise --dataset synthetic-reddit --scale 1 --model gcn --hidden 128 --layers 2 \\
        --dropout 0.2 --partitions 40 --epochs 30 --sync-every 1 --hosts 8 --ranks-per-host 1 \\
        --network 100gbit,5us --threads 2 --strategies allreduce,gossip --out runs/reddit
    python benchmarks/advise_studies.py --reddit runs/reddit/advice.json [--network 100gbit,5us]

Study 003 ran one V100 per rank on one 8-GPU node (NCCL). The simulation puts each rank on a
host of its own like the profiling machine (its cores, its measured step times), joined by
``--network`` (default 100 Gbit/s, 5 us: an NVLink/PCIe-class link); ``--jitter`` adds the
study's "non-dedicated cluster" as gnnpar's emulation defines it (a pause of up to X times the
step, with probability 0.1 per step).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

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


def load_profile(path: str) -> Profile:
    return Profile(**json.loads(Path(path).read_text())["profile"])


def study_003(prof: Profile, network: sim.Link, jitters: list[float], parts: int) -> list[str]:
    rows = [
        f"Simulated from a profile taken on {prof.machine} ({prof.cores} cores, "
        f"{prof.threads} thread(s) per rank): {prof.dataset} {prof.model}, "
        f"--partitions {parts}, {prof.epochs} epochs, one rank per host, "
        f"{network.bandwidth_Bps * 8 / 1e9:g} Gbit/s {network.latency_s * 1e6:g} us between "
        f"hosts. One-rank epoch: {sum(prof.parts_step_s[str(parts)]):.2f} s.",
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
                    f"| {strategy} | {world} | {k} | {STUDY_003_REDDIT[(strategy, world, k)]:.2f} | "
                    + " | ".join(f"{p.speedup:.2f}" for p in preds)
                    + f" | {p0.epoch_s:.3f} | {p0.bytes_on_network / prof.epochs / 1e6:.1f} MB |"
                )
    return rows


def study_002(profs: list[Profile]) -> list[str]:
    """Study 002's table 2 (GraphSAGE, PyG): 1, 2, 4 ranks on one host, each with its own
    loader workers (8, 8, 1 as the study), the batch size per rank. A profile taken without
    gloo (one rank) borrows the gloo costs of one that has them (same machine)."""
    comm = next((p.comm for p in profs if p.comm), {})
    rows = [
        "| ranks | loader workers | batch | study 002 s (PyG, 50 epochs) | simulated s | "
        "simulated speed-up over 1 rank | waiting | profile threads/rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for prof in profs:
        prof.comm = prof.comm or comm
        for b in sorted(prof.sampled, key=int):
            one = None
            for world, workers in ((1, 8), (2, 8), (4, 1)):
                c = Candidate("sampled", {"batch_size": int(b), "loader_workers": workers}, world)
                p = predict(c, prof, ClusterSpec(1, world), sim.NONE, prof.epochs)
                one = one or p.train_time_s
                rows.append(
                    f"| {world} | {workers} | {b} | {STUDY_002_SAGE[(world, workers, int(b))]} | "
                    f"{p.train_time_s:.0f} | {one / p.train_time_s:.2f} | {p.wait_share:.0%} | "
                    f"{prof.threads} |"
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reddit", help="advice.json of the Reddit stand-in (Cluster-GCN)")
    ap.add_argument("--sampled", nargs="*", default=[], help="advice.json files (study 002)")
    ap.add_argument("--network", default="100gbit,5us")
    ap.add_argument("--jitter", default="0,0.5,2", help="comma-separated --jitter values")
    ap.add_argument("--partitions", type=int, default=40)
    ap.add_argument(
        "--cores",
        type=int,
        help="study 002: cores of the simulated host, each as fast as one here "
        "(default: this machine's); the study does not say its N1's",
    )
    args = ap.parse_args()
    if args.reddit:
        prof = load_profile(args.reddit)
        jitters = [float(j) for j in args.jitter.split(",")]
        rows = study_003(prof, parse_network(args.network), jitters, args.partitions)
        print("\n".join(rows))
        part = prof.parts_step_s[str(args.partitions)]
        print(
            f"\nper-part step (s): median {statistics.median(part):.4f}, min {min(part):.4f}, "
            f"max {max(part):.4f}; parameters {prof.param_bytes / 1e3:.0f} kB\n"
        )
    if args.sampled:
        profs = [load_profile(p) for p in args.sampled]
        for prof in profs:
            prof.cores = args.cores or prof.cores
        print(f"host of {profs[0].cores} cores")
        print("\n".join(study_002(profs)))


if __name__ == "__main__":
    main()
