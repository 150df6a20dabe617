"""Test accuracy of the studies' models on synthetic-reddit, beside a features-only baseline.

Each run is ``gnnpar train --dataset synthetic-reddit --scale F --seed 0`` in a fresh process,
with the studies' settings (the defaults ``gnnpar train`` picks for that model and strategy):

* ``sage-sampled``: study 002 table 1 (GraphSAGE 3 x 256, dropout 0.5, Adam 5e-3, wd 5e-4),
  neighbour sampling 25,10,10, batch 1024, 20 epochs;
* ``features-only``: the same loop, optimiser, batches and epochs, with an MLP of the same shape
  that ignores the edges (``benchmarks/datasets/_features_only.py``): what the features alone carry;
* ``gat3-sampled``: study 002's GAT (3 x 16, 1 head, dropout 0.6), and the same at dropout 0.2
  (``gat3-sampled-d0.2``; at 0.6 the model stays at chance, BENCHMARKS.md "Why gat3 stays at
  chance");
* ``gcn-cluster`` and ``sage-cluster``: study 003 table 3.3 (Cluster-GCN over 40 random
  partitions, 3 layers x 128, dropout 0.2, Adam 1e-2, 30 epochs).

Run: ``python benchmarks/datasets/synthetic_reddit_scores.py --scales 0.01,0.1 --out F.json``
(``--runs`` picks runs, ``--epochs`` overrides every run's epochs, ``--smoke``: one tiny run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[2]
RUNS: dict[str, list[str]] = {
    "sage-sampled": ["--model", "sage", "--strategy", "sampled"],
    "features-only": [
        "--model",
        "benchmarks.datasets._features_only:mlp",
        "--strategy",
        "sampled",
        "--lr",
        "0.005",
        "--weight-decay",
        "0.0005",
        "--epochs",
        "20",
    ],  # fmt: skip
    "gat3-sampled": ["--model", "gat3", "--strategy", "sampled"],
    "gat3-sampled-d0.2": ["--model", "gat3", "--strategy", "sampled", "--dropout", "0.2"],
    "gcn-cluster": ["--model", "gcn", "--partitions", "40"],
    "sage-cluster": ["--model", "sage", "--partitions", "40"],
}


def run_one(name: str, scale: float, args: argparse.Namespace, data_root: Path) -> dict:
    flags = list(RUNS[name])
    if args.epochs:
        flags = [f for i, f in enumerate(flags) if f != "--epochs" and flags[i - 1] != "--epochs"]
        flags += ["--epochs", str(args.epochs)]
    with tempfile.TemporaryDirectory(prefix="gnnpar-scores-") as tmp:
        cmd = [
            sys.executable, "-m", "gnnpar", "train", "--dataset", "synthetic-reddit",
            "--scale", f"{scale:g}", "--seed", "0", "--quiet", "--out", tmp, *flags,
        ]  # fmt: skip
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        env = {**os.environ, "GNNPAR_DATA": str(data_root)}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"run": name, "scale": scale, "error": proc.stderr[-2000:]}
        r = json.loads((Path(tmp) / "result.json").read_text())
    return {
        "run": name,
        "scale": scale,
        "flags": flags,
        "model": r["config"]["model"],
        "strategy": r["config"]["strategy"]["name"],
        "epochs": r["epochs"],
        "val": r["val_score"],
        "test": r["test_score"],
        "train_time_s": r["train_time_s"],
        "wall_s": wall,
        "loadavg_after": os.getloadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", default="0.01,0.1")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--epochs", type=int, default=0, help="override every run's epochs")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--data-root", default="", help="default: a temporary folder")
    p.add_argument("--out", default="", help="write the rows as JSON here")
    p.add_argument("--smoke", action="store_true", help="one run at scale 0.002, 1 epoch")
    args = p.parse_args()
    if args.smoke:  # the graph-free model's factory path: the GNN runs have tests of their own
        args.scales, args.runs, args.epochs = "0.002", "features-only", 1
    names = args.runs.split(",")
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        p.error(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    header = harness.machine(args.threads or None)
    print(harness.header(args.threads or None), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnpar-data-") as tmp:
        data_root = Path(args.data_root or tmp)
        for scale in (float(s) for s in args.scales.split(",")):
            for name in names:
                row = run_one(name, scale, args, data_root)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        harness.write_json(args.out, {**header, "rows": rows})
    print("\n| run | scale | epochs | val | test |\n|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['run']} | {r['scale']:g} | failed | | |")
        else:
            print(
                f"| {r['run']} | {r['scale']:g} | {r['epochs']} | {r['val']:.4f} | {r['test']:.4f} |"
            )


if __name__ == "__main__":
    main()
