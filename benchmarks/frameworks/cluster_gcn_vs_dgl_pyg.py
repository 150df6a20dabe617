"""gnnpar against plain PyG and plain DGL, end to end: study 003's Cluster-GCN with all-reduce.

The same graph (synthetic-reddit at ``--scale``, exported once by ``frameworks.export`` under
``--workdir``), the same model (study 003 table 3.3, Reddit: GCN with 2 hidden layers of 128,
dropout 0.2, Adam lr 1e-2, no weight decay), METIS into ``--parts`` parts on every side, one
part per step, gradients all-reduced every step (gnnpar: ``--sync-every 1``, its default; the
peers: ``DistributedDataParallel``), ``--ranks`` ranks of one thread each. gnnpar runs through
its CLI (``gnnpar train --strategy allreduce --partitioner metis``), PyG and DGL through
``benchmarks/frameworks/_cluster_gcn_sides.py`` in ``/work/peers/pyg`` and ``/work/peers/dgl`` (a peer whose
interpreter is missing is skipped with a message). Per repetition the sides run in turn, the
order rotated each repetition; with ``--lock`` each run holds that flock(1) lock.

Reported per side: epoch time (the slowest rank's training wall time / epochs, partitioning
excluded; the first epoch's warm-up included on every side), partitioning time (every side
partitions afresh every run: gnnpar's cache file for this setting is removed before its run),
test accuracy (full-graph forward). Medians over repetitions and the median of per-repetition ratios gnnpar / peer.

``--sides`` may also name ``gnnpar-local``: gnnpar's ranks with no exchange at all (``--sync-every``
beyond the run's steps), the time two ranks' compute alone takes on this machine: a floor under
any all-reduce, not a training anyone would run.

    python -m benchmarks.frameworks.cluster_gcn_vs_dgl_pyg --reps 3 --epochs 30 --lock /tmp/gnnpar-bench.lock
    python -m benchmarks.frameworks.cluster_gcn_vs_dgl_pyg --sides gnnpar,gnnpar-local,dgl
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness
from benchmarks.frameworks.sampled_vs_dgl_pyg import PEERS, export

HERE = Path(__file__).resolve().parent
LOCK: list[str] = []
MODEL = "--model gcn --hidden 128 --layers 3 --dropout 0.2 --optimizer adam --lr 0.01"


def run_gnnpar(
    ranks: int, epochs: int, parts: int, scale: float, root: Path, sync_every: int = 1
) -> dict:
    """One CLI run; this setting's partition cache file is removed first, so gnnpar partitions
    afresh every run, as the peers do."""
    from gnnpar.data.partition import cache_path, integrity_path

    cached = cache_path(root, f"synthetic-reddit-scale{scale:g}", parts, "metis", 0)
    for f in (cached, integrity_path(cached)):
        f.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="gnnpar-cluster-") as out:
        cmd = [sys.executable, "-m", "gnnpar", "train", "--dataset", "synthetic-reddit"]
        cmd += f"--scale {scale} --strategy allreduce {MODEL} --weight-decay 0".split()
        cmd += f"--partitions {parts} --partitioner metis --sync-every {sync_every}".split()
        cmd += f"--workers {ranks} --threads 1 --epochs {epochs} --jitter 0 --quiet".split()
        cmd += ["--out", out, "--data-root", str(root)]
        subprocess.run(
            LOCK + cmd, check=True, env=harness.module_env(), capture_output=True, timeout=3600
        )
        r = json.loads((Path(out) / "result.json").read_text())
    return {
        "epoch_s": r["max_rank_train_time_s"] / epochs,
        "partition_s": r["partition_time_s"],
        "partition_cache_hit": r["partition_cache_hit"],
        "acc": r["test_score"],
    }


def run_peer(side: str, folder: Path, ranks: int, epochs: int, parts: int) -> dict:
    cmd = [PEERS[side], str(HERE / "_cluster_gcn_sides.py"), side, str(folder)]
    cmd += [str(ranks), str(epochs), str(parts)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(LOCK + cmd, env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return {
        "epoch_s": sum(out["times"]) / epochs,
        "partition_s": out["partition_s"],
        "acc": out["acc"],
        "edges_per_batch": statistics.median(out["edges"]),
    }


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=3, out=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--parts", type=int, default=40)
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--sides", default="gnnpar,pyg,dgl")
    p.add_argument("--workdir", default=None, help="default: $GNNPAR_DATA/frameworks")
    p.add_argument("--lock", default=None, help="hold this flock(1) lock file during each run")
    # --smoke: gnnpar's side alone (the peers' interpreters are not there in CI)
    smoke = {"ranks": 1, "epochs": 1, "parts": 4, "reps": 1, "scale": 0.005, "sides": "gnnpar"}
    a = harness.start(p, argv, smoke, header=False)  # printed once the graph is ready
    if a.lock:
        LOCK[:] = ["flock", a.lock]
    from gnnpar.config.parse import default_data_root

    root = default_data_root()
    folder = Path(a.workdir or root / "frameworks") / f"synthetic-reddit-{a.scale}"
    meta = export(folder, root, a.scale)
    harness.print_header(1)
    print(f"graph: {meta['nodes']:,} nodes, {meta['edges']:,} edges, {meta['train']:,} train")
    sides = []
    for s in a.sides.split(","):
        if not s.startswith("gnnpar") and not Path(PEERS[s]).exists():
            print(f"skipped {s}: no interpreter {PEERS[s]}")
            continue
        sides.append(s)
    runs = []
    for rep in range(a.reps):
        for side in harness.rotation(sides, rep):
            load = harness.load_average()[0]
            if side == "gnnpar":
                r = run_gnnpar(a.ranks, a.epochs, a.parts, a.scale, root)
            elif side == "gnnpar-local":  # no exchange: more steps between syncs than the run has
                never = a.epochs * a.parts + 1
                r = run_gnnpar(a.ranks, a.epochs, a.parts, a.scale, root, never)
            else:
                r = run_peer(side, folder, a.ranks, a.epochs, a.parts)
            r.update(side=side, rep=rep, load_before_after=[load, harness.load_average()[0]])
            runs.append(r)
            print(json.dumps(r), flush=True)
            if a.out:  # every run kept, should a later one fail
                out = {"machine": harness.machine(1), "meta": meta, "args": vars(a), "runs": runs}
                harness.write_json(a.out, out)
    print("\n| side | epoch (s) | gnnpar / side | partitioning (s) | test acc |")
    print("|---|---|---|---|---|")
    ours = {r["rep"]: r["epoch_s"] for r in runs if r["side"] == "gnnpar"}
    for side in sides:
        rs = [r for r in runs if r["side"] == side]
        ratio = [ours[r["rep"]] / r["epoch_s"] for r in rs if r["rep"] in ours]
        # every run partitions afresh (gnnpar's cache file is removed first); gnnpar's reporting
        # rank says "cache hit" when the other rank built the file while it waited for it
        parts = [r["partition_s"] for r in rs]
        print(
            f"| {side} | {statistics.median(r['epoch_s'] for r in rs):.3f} | "
            f"{statistics.median(ratio) if ratio else float('nan'):.2f} | "
            f"{statistics.median(parts) if parts else float('nan'):.2f} | "
            f"{statistics.median(r['acc'] for r in rs):.4f} |"
        )


if __name__ == "__main__":
    main()
