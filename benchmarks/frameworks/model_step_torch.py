"""The Lightning comparison's model step under two torch builds: the same batches, the same
PyG ``SAGEConv`` model, timed in gnnpar's interpreter and in DGL's (DGL 2.1 needs torch 2.2).

``lightning_loaders.py``'s DGL side feeds study 002's PyG GraphSAGE from DGL's loader, but in
DGL's own interpreter, whose torch is 2.2.1 where the gnnpar and PyG sides run torch 2.13: the
model's forward, backward and Adam step are the same code on different kernels. This script
measures that difference alone: it samples ``--batches`` batches once with gnnpar's
``GraphDataModule`` (``NeighborLoader``'s hop layout), saves them as plain tensors, and each
interpreter in turn (alternating, ``--reps`` times, fresh processes) trains the
``lightning_loaders.pyg_model`` architecture (3 x 256, mean, dropout 0.5, ``trim_to_layer``,
Adam 5e-3 / 5e-4) on them without Lightning, ``--threads`` torch threads; the median seconds
per step (after one warm-up pass) per interpreter and their ratio.

    python benchmarks/frameworks/model_step_torch.py --other-python DGLDIR/bin/python \
        --other-path PYG_DIR --dataset synthetic-reddit --scale 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()

STEP_CODE = r"""
import json, sys, time, statistics
import torch, torch.nn.functional as F
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import trim_to_layer
torch.set_num_threads(int(sys.argv[2])); torch.manual_seed(0)
batches = torch.load(sys.argv[1], weights_only=True)
dims = [batches[0]["x"].size(1), 256, 256, int(batches[0]["classes"])]
convs = torch.nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(dims, dims[1:]))
opt = torch.optim.Adam(convs.parameters(), lr=5e-3, weight_decay=5e-4)
def step(b):
    x, ei = b["x"], b["edge_index"]
    nodes, edges = b["nodes"].tolist(), b["edges"].tolist()
    for i, conv in enumerate(convs):
        x, ei, _ = trim_to_layer(i, nodes, edges, x, ei)
        x = conv(x, ei)
        if i < len(convs) - 1:
            x = F.dropout(F.relu(x), 0.5, True)
    loss = F.cross_entropy(x[: b["batch_size"]], b["y"][: b["batch_size"]])
    opt.zero_grad(); loss.backward(); opt.step()
for b in batches:
    step(b)
times = []
for b in batches:
    t = time.perf_counter(); step(b); times.append(time.perf_counter() - t)
print(json.dumps({"torch": torch.__version__, "step_s": statistics.median(times)}))
"""


def save_batches(args, path: str) -> None:
    import torch

    from gnnpar.lightning import GraphDataModule

    dm = GraphDataModule(
        dataset=args.dataset, scale=args.scale, batch_size=1024, fanouts=[25, 10, 10],
        loader_workers=0, seed=0,
    )  # fmt: skip
    dm.setup("fit")
    out = []
    for i, b in enumerate(dm.train_dataloader()):
        if i == args.batches:
            break
        out.append({
            "x": b.x.contiguous(), "edge_index": b.edge_index.contiguous(), "y": b.y,
            "nodes": torch.tensor(b.num_sampled_nodes), "edges": torch.tensor(b.num_sampled_edges),
            "batch_size": int(b.batch_size), "classes": int(dm.num_classes),
        })  # fmt: skip
    torch.save(out, path)


def run(python: str, extra_path: str | None, batches: str, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    if extra_path:
        env["PYTHONPATH"] = extra_path
    got = subprocess.run(
        [python, "-c", STEP_CODE, batches, str(threads)], env=env, capture_output=True,
        text=True, timeout=900, check=True,
    )  # fmt: skip
    return json.loads(got.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other-python", default=None, help="the other interpreter (DGL's)")
    ap.add_argument("--other-path", default=None, help="PYTHONPATH holding its torch_geometric")
    ap.add_argument("--dataset", default="synthetic-reddit")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smallest setting: does it run?")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.scale, args.batches, args.reps = 0.01, 2, 1
        args.other_python = args.other_python or sys.executable
    if not args.other_python:
        ap.error("--other-python is needed (the interpreter to compare with)")
    from benchmarks import harness

    print(harness.header(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batches.pt")
        save_batches(args, path)
        sides = {"this": (sys.executable, None), "other": (args.other_python, args.other_path)}
        runs: dict[str, list[dict]] = {k: [] for k in sides}
        for rep in range(args.reps):
            order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
            for name in order:
                r = run(*sides[name], path, args.threads)
                r["load"] = list(harness.load_average())
                runs[name].append(r)
                print(f"rep {rep} {name}: torch {r['torch']}, {r['step_s'] * 1e3:.1f} ms a step")
    med = {k: statistics.median(r["step_s"] for r in v) for k, v in runs.items()}
    ratios = [a["step_s"] / b["step_s"] for a, b in zip(runs["this"], runs["other"])]
    report = {"machine": harness.machine(args.threads), "runs": runs, "median_step_s": med,
              "this_over_other": statistics.median(ratios), "per_rep": ratios}  # fmt: skip
    print(json.dumps({k: report[k] for k in ("median_step_s", "this_over_other", "per_rep")}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
