"""gnnpar against plain PyG and plain DGL, end to end: study 002's neighbour-sampled training.

The same graph (synthetic-reddit at ``--scale``, exported once as ``.npy`` under ``--workdir``:
incoming CSR, features, labels, the training and test nodes of gnnpar's split), the same model
and hyper-parameters (``sage``: 3 x 256, mean, dropout 0.5; ``gat3``: 3 x 16, 1 head, dropout
0.6; Adam 5e-3, weight decay 5e-4), fan-outs 25,10,10, 1024 seeds per batch, one thread per rank.
Each side runs in its own interpreter: gnnpar through its CLI (``gnnpar train --strategy
sampled``), PyG and DGL through ``benchmarks/frameworks/_sampled_sides.py`` in ``/work/peers/pyg`` and
``/work/peers/dgl`` (a peer whose interpreter is missing is skipped with a message). Per
repetition the sides of a setting run in turn, the order rotated each repetition.

Reported per side: epoch time (the slowest rank's training wall time over the run / epochs;
the first epoch includes warm-up on every side), sampled edges and computed messages per batch (medians over batches)
(the edges every layer aggregates over, summed over layers: PyG runs every layer on the whole
subgraph, DGL's blocks and gnnpar's trimmed layers only on what the seeds need), test accuracy.
Medians over repetitions, and the median of per-repetition ratios gnnpar / peer.

``--precision bf16`` runs every side in mixed precision the way each documents it: gnnpar with
``--precision bf16``, PyG and DGL with the forward and loss under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` (PyTorch's AMP recipe; bfloat16 needs no gradient scaler), fp32 weights
and optimizer on every side. Compare sides in the same precision: that is the same work.

    python -m benchmarks.frameworks.sampled_vs_dgl_pyg --models sage --ranks 1 --workers 0 --epochs 2 --reps 3
    python -m benchmarks.frameworks.sampled_vs_dgl_pyg --models sage --ranks 1 --workers 0 --precision bf16
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness

HERE = Path(__file__).resolve().parent
PEERS = harness.PEERS
FANOUTS = [25, 10, 10]
MODEL_FLAGS = {
    "sage": "--model sage --hidden 256 --layers 3 --dropout 0.5",
    "gat3": "--model gat3 --hidden 16 --layers 3 --heads 1 --dropout 0.6",
}


def export(folder: Path, root: Path, scale: float) -> dict:
    """Save the graph once; return what gnnpar's own sampler does per batch on it."""
    meta_path = folder / "meta.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    from gnnpar.data.datasets import load_dataset
    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
    from gnnpar.models.hops import HopGraph

    folder.mkdir(parents=True, exist_ok=True)
    ds = load_dataset("synthetic-reddit", root, scale, 0)
    d = ds.data
    csr = CSRGraph.from_edge_index(d.edge_index, ds.num_nodes)
    arrays = {
        "rowptr": csr.rowptr,
        "col": csr.col,
        "x": d.x.float(),
        "y": d.y,
        "train_idx": d.train_mask.nonzero().view(-1),
        "test_idx": d.test_mask.nonzero().view(-1),
    }
    for k, v in arrays.items():
        np.save(folder / f"{k}.npy", v.contiguous().numpy())
    # gnnpar's sampled edges and computed messages per batch (trimmed layers), 8 batches
    sampler, gen = NeighborSampler(csr, FANOUTS), torch.Generator().manual_seed(0)
    edges, messages = [], []
    train = arrays["train_idx"]
    for _ in range(8):
        b = sampler.sample(train[torch.randperm(train.numel(), generator=gen)[:1024]], gen)
        hops = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
        edges.append(b.edge_index.size(1))
        messages.append(sum(hops.layer(i, 3).edge_index.size(1) for i in range(3)))
    meta = {
        "nodes": ds.num_nodes,
        "edges": int(csr.num_edges),
        "train": int(train.numel()),
        "scale": scale,
        "gnnpar_edges_per_batch": statistics.mean(edges),
        "gnnpar_messages_per_batch": statistics.mean(messages),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


LOCK: list[str] = []  # ["flock", PATH] with --lock: one timed run at a time on a shared machine


def run_gnnpar(
    model: str, ranks: int, workers: int, epochs: int, scale: float, root: Path, precision: str
):
    with tempfile.TemporaryDirectory(prefix="gnnpar-frameworks-") as out:
        cmd = [sys.executable, "-m", "gnnpar", "train", "--dataset", "synthetic-reddit"]
        cmd += f"--scale {scale} --strategy sampled {MODEL_FLAGS[model]}".split()
        cmd += "--optimizer adam --lr 0.005 --weight-decay 0.0005 --batch-size 1024".split()
        cmd += f"--fanouts 25,10,10 --workers {ranks} --loader-workers {workers}".split()
        cmd += f"--threads 1 --epochs {epochs} --jitter 0 --quiet --out {out}".split()
        cmd += ["--precision", precision]
        cmd += ["--data-root", str(root)]
        subprocess.run(
            LOCK + cmd, check=True, env=harness.module_env(), capture_output=True, timeout=3600
        )
        r = json.loads((Path(out) / "result.json").read_text())
    return {"epoch_s": r["max_rank_train_time_s"] / epochs, "acc": r["test_score"]}


def run_peer(
    side: str, folder: Path, model: str, ranks: int, workers: int, epochs: int, precision: str
):
    cmd = [PEERS[side], str(HERE / "_sampled_sides.py"), side, str(folder), model]
    cmd += [str(ranks), str(workers), str(epochs), precision]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(LOCK + cmd, env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return {
        "epoch_s": sum(out["times"]) / epochs,
        "acc": out["acc"],
        "edges_per_batch": statistics.median(out["edges"]),
        "messages_per_batch": statistics.median(out["messages"]),
    }


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=3, out=True)
    p.add_argument("--models", default="sage,gat3")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--workers", default="0,2", help="loader workers per rank")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--sides", default="gnnpar,pyg,dgl")
    p.add_argument("--workdir", default=None, help="default: $GNNPAR_DATA/frameworks")
    p.add_argument("--lock", default=None, help="hold this flock(1) lock file during each run")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="every side")
    # --smoke: gnnpar's side alone (the peers' interpreters are not there in CI)
    smoke = {"models": "sage", "ranks": "1", "workers": "0", "epochs": 1, "reps": 1}
    smoke |= {"scale": 0.005, "sides": "gnnpar"}
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
        if s != "gnnpar" and not Path(PEERS[s]).exists():
            print(f"skipped {s}: no interpreter {PEERS[s]}")
            continue
        sides.append(s)
    runs = []
    settings = list(
        itertools.product(
            a.models.split(","), map(int, a.ranks.split(",")), map(int, a.workers.split(","))
        )
    )
    for rep in range(a.reps):
        for model, ranks, workers in settings:
            for side in harness.rotation(sides, rep):
                load = harness.load_average()[0]
                if side == "gnnpar":
                    r = run_gnnpar(model, ranks, workers, a.epochs, a.scale, root, a.precision)
                    r["edges_per_batch"] = meta["gnnpar_edges_per_batch"]
                    r["messages_per_batch"] = meta["gnnpar_messages_per_batch"]
                else:
                    r = run_peer(side, folder, model, ranks, workers, a.epochs, a.precision)
                r.update(side=side, model=model, ranks=ranks, workers=workers, rep=rep)
                r["precision"] = a.precision
                r["load_before_after"] = [load, harness.load_average()[0]]
                runs.append(r)
                print(json.dumps(r), flush=True)
    print(
        "\n| model | ranks | loader workers | side | epoch (s) | gnnpar / side | edges/batch "
        "| messages/batch | test acc |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model, ranks, workers in settings:
        mine = [
            r for r in runs if (r["model"], r["ranks"], r["workers"]) == (model, ranks, workers)
        ]
        ours = {r["rep"]: r["epoch_s"] for r in mine if r["side"] == "gnnpar"}
        for side in sides:
            rs = [r for r in mine if r["side"] == side]
            ratio = [ours[r["rep"]] / r["epoch_s"] for r in rs if r["rep"] in ours]
            print(
                f"| {model} | {ranks} | {workers} | {side} | "
                f"{statistics.median(r['epoch_s'] for r in rs):.2f} | "
                f"{statistics.median(ratio):.2f} | {rs[0]['edges_per_batch']:,.0f} | "
                f"{rs[0]['messages_per_batch']:,.0f} | {rs[0]['acc']} |"
            )
    if a.out:
        machine = harness.machine(1)
        harness.write_json(a.out, {"machine": machine, "meta": meta, "args": vars(a), "runs": runs})


if __name__ == "__main__":
    main()
