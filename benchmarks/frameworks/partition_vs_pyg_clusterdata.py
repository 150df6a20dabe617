"""Cluster-GCN partitioning, gnnpar against PyG's ``ClusterData``: METIS + subgraph build.

Both sides read the same saved graph file, run one thread each (``torch.set_num_threads(1)``,
``OMP_NUM_THREADS=1``; METIS itself is serial) in a fresh process per repetition, and time the
work from the loaded graph to every part's subgraph, with no cache involved:

* gnnpar: ``partition.load_or_build(data, "metis", P, seed, path=None)`` (symmetrise, pymetis
  k-way, reorder and build the intra-part subgraphs), then ``.batches()``.
* PyG: ``ClusterData(data, P)`` (torch-sparse's METIS k-way on PyG's CSR, permute), then, as a
  second figure, also ``[cd[i] for i in range(P)]`` (ClusterData leaves dropping the inter-part
  edges to ``__getitem__``; gnnpar does it while building).

The sides alternate within every repetition (which goes first alternates too), so load from the
machine's other jobs hits both. Per repetition the ratio gnnpar / PyG is taken; the summary gives
median times and the median of these ratios, for wall time and for the process's CPU time (more
robust on a shared, oversubscribed machine). Each side also times its pieces once more after the
measured run (gnnpar: symmetrising, the pymetis call, the build; PyG: ``_metis``, i.e. PyG's CSR
sort plus the METIS call). Edge cut (undirected edges whose two ends lie in different parts, on
the saved symmetric graph, one function for both sides), part sizes (max / mean) and the number
of intra-part edges each side kept (must be equal to ``E - 2 cut``) are checked and reported.

Graphs (written once into ``--workdir``):

* ``reddit01``: gnnpar's synthetic-reddit at ``--scale 0.1``, seed 0 (23,296 nodes, 4.41 M
  edge_index columns, 602 features).
* ``powerlaw``: a Chung-Lu graph with power-law expected degrees: 23,000 nodes, weights
  ``w_i ~ (i + 100)^(-1/1.5)`` (degree exponent 2.5), 5.85 M node pairs drawn with both ends
  ~ w, self-loops and repeats dropped, both directions stored, sorted by (src, dst): 11.07 M
  edge_index columns, degrees 160 / 315 / 5,693 (min / median / max); 100 features, 41 classes,
  seed 0.

    python -m benchmarks.frameworks.partition_vs_pyg_clusterdata                 # both graphs, 40 parts, 5 reps
    python -m benchmarks.frameworks.partition_vs_pyg_clusterdata --graphs reddit01 --reps 7 --out runs/partition.json

The PyG side runs in ``--peer-python`` (default ``/work/peers/pyg/bin/python``; see
/work/shared/anchors/README.md); if that interpreter or its torch-sparse METIS is missing, the PyG
side is skipped with a message and only gnnpar's figures are reported.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness

DEFAULT_PEER = harness.PEERS["pyg"]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


# ------------------------------------------------------------------------------------- graphs
def powerlaw_graph(n: int = 23_000, pairs: int = 5_850_000, seed: int = 0) -> dict:
    """Chung-Lu graph with power-law expected degrees (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.arange(n, dtype=torch.float64) + 100.0).pow(-1 / 1.5)
    ends = torch.multinomial(w, 2 * pairs, replacement=True, generator=g).view(2, pairs)
    src, dst = ends[0], ends[1]
    keep = src != dst
    key = torch.cat([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]).unique()
    edge_index = torch.stack([key // n, key % n])
    y = torch.randint(0, 41, (n,), generator=g)
    x = torch.randn(n, 100, generator=g)
    return {"x": x, "y": y, "edge_index": edge_index}


def reddit01_graph() -> dict:
    from gnnpar.data.synthetic import REDDIT, generate_graph

    tensors, _ = generate_graph(REDDIT, 0.1, 0)
    return {k: tensors[k] for k in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask")}


GRAPHS = {
    "reddit01": reddit01_graph,
    "powerlaw": powerlaw_graph,
    "powerlaw-tiny": lambda: powerlaw_graph(500, 5_000),  # --smoke's
}


def graph_file(name: str, workdir: Path) -> Path:
    path = workdir / f"{name}.pt"
    if not path.exists():
        tensors = GRAPHS[name]()
        tmp = path.with_suffix(".tmp")
        torch.save(tensors, tmp)
        os.replace(tmp, path)
    return path


# ------------------------------------------------------------------- one side, one process
# The worker code for both sides: it imports only torch/numpy and the side's own library.
WORKER = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
side, graph_path, parts, seed, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
from torch_geometric.data import Data
data = Data(**torch.load(graph_path))

def clock():
    return time.perf_counter(), time.process_time()

res = {}
if side == "gnnpar":
    from gnnpar.data import partition as P
    w0, c0 = clock()
    graph, _ = P.load_or_build(data, "metis", parts, seed, None)
    batches = graph.batches()
    w1, c1 = clock()
    res["wall_s"], res["cpu_s"] = w1 - w0, c1 - c0
    part = graph.tensors["part"]
    res["kept_edges"] = sum(int(b.edge_index.size(1)) for b in batches)
    # the pieces, once more
    import pymetis
    n = int(data.num_nodes)
    w0, _ = clock(); indptr, indices = P.symmetric_csr(data.edge_index, n); w1, _ = clock()
    again = P.metis_partition(data.edge_index, n, parts, seed); w2, _ = clock()
    P.build_partitioned(data, again, parts); w3, _ = clock()
    res["pieces_s"] = {"symmetrise": w1 - w0, "metis_kernel": (w2 - w1) - (w1 - w0), "build": w3 - w2}
    res["deterministic"] = bool(torch.equal(again, part))
else:
    import torch_geometric.typing as T
    from torch_geometric.loader import ClusterData
    if not T.WITH_TORCH_SPARSE:
        raise SystemExit("torch-sparse (its METIS) is not installed in this interpreter")
    w0, c0 = clock()
    cd = ClusterData(data, parts, log=False)
    w1, c1 = clock()
    batches = [cd[i] for i in range(parts)]
    w2, c2 = clock()
    res["wall_s"], res["cpu_s"] = w1 - w0, c1 - c0
    res["wall_with_batches_s"], res["cpu_with_batches_s"] = w2 - w0, c2 - c0
    part = torch.empty(int(data.num_nodes), dtype=torch.long)
    ptr = cd.partition.partptr
    for p in range(parts):
        part[cd.partition.node_perm[int(ptr[p]):int(ptr[p + 1])]] = p
    res["kept_edges"] = sum(int(b.edge_index.size(1)) for b in batches)
    w0, _ = clock(); cd._metis(data.edge_index, int(data.num_nodes)); w1, _ = clock()
    res["pieces_s"] = {"metis_with_csr_sort": w1 - w0}
np.save(out + ".npy", part.numpy())
with open(out, "w") as f:
    json.dump(res, f)
"""


def run_side(side: str, python: str, graph: Path, parts: int, seed: int, out: Path) -> dict:
    env = {**(harness.module_env() if side == "gnnpar" else os.environ), **ONE_THREAD}
    if side != "gnnpar":
        env.pop("PYTHONPATH", None)  # the peer's interpreter sees its own packages only
    load = harness.load_average()[0]
    cmd = [python, "-c", WORKER, side, str(graph), str(parts), str(seed), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} side failed:\n{proc.stderr[-3000:]}")
    res = json.loads(out.read_text())
    res["part"] = np.load(f"{out}.npy")
    res["load_1min"] = load
    return res


def peer_missing(python: str) -> str | None:
    if not Path(python).exists():
        return f"{python} not found"
    probe = "import torch_geometric.typing as T; assert T.WITH_TORCH_SPARSE"
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"{python} has no torch-sparse METIS"


# ------------------------------------------------------------------------------ comparison
def cut_and_balance(edge_index: np.ndarray, part: np.ndarray, parts: int) -> dict:
    """Undirected edges cut (the graph is stored symmetric: columns / 2) and part sizes."""
    cut_columns = int((part[edge_index[0]] != part[edge_index[1]]).sum())
    sizes = np.bincount(part, minlength=parts)
    return {
        "edge_cut": cut_columns // 2,
        "cut_fraction": cut_columns / edge_index.shape[1],
        "kept_expected": int(edge_index.shape[1] - cut_columns),
        "parts_nonempty": int((sizes > 0).sum()),
        "size_max_over_mean": float(sizes.max() / sizes.mean()),
        "size_min_over_mean": float(sizes.min() / sizes.mean()),
    }


def bench_graph(name: str, args, sides: list[str], workdir: Path) -> dict:
    path = graph_file(name, workdir)
    tensors = torch.load(path)
    edge_index = tensors["edge_index"].numpy()
    num_nodes = int(tensors["x"].size(0))
    info = {"nodes": num_nodes, "edge_index_columns": int(edge_index.shape[1])}
    info["features"] = int(tensors["x"].size(1))
    del tensors
    python = {"gnnpar": sys.executable, "pyg": args.peer_python}
    reps: list[dict] = []
    quality: dict[str, dict] = {}
    for rep in range(args.reps):
        order = sides if rep % 2 == 0 else sides[::-1]
        row: dict = {"first": order[0]}
        for side in order:
            out = workdir / f"{name}-{side}-{rep}.json"
            res = run_side(side, python[side], path, args.parts, args.seed, out)
            q = cut_and_balance(edge_index, res.pop("part"), args.parts)
            if res["kept_edges"] != q["kept_expected"]:
                raise RuntimeError(f"{side}: kept {res['kept_edges']} edges, expected {q}")
            if side in quality and quality[side]["edge_cut"] != q["edge_cut"]:
                raise RuntimeError(f"{side}: the edge cut changed between repetitions")
            quality[side] = q
            row[side] = res
        if "pyg" in row:
            for t in ("wall_s", "cpu_s"):
                row[f"ratio_{t}"] = row["gnnpar"][t] / row["pyg"][t]
            row["ratio_wall_with_batches"] = (
                row["gnnpar"]["wall_s"] / row["pyg"]["wall_with_batches_s"]
            )
            row["ratio_cpu_with_batches"] = (
                row["gnnpar"]["cpu_s"] / row["pyg"]["cpu_with_batches_s"]
            )
        reps.append(row)
        print(f"  {name} rep {rep}: " + json.dumps({k: v for k, v in row.items() if "ratio" in k}))
    summary: dict = {"quality": quality}
    for side in sides:
        for key in ("wall_s", "cpu_s", "wall_with_batches_s", "cpu_with_batches_s"):
            if key in reps[0][side]:
                summary[f"{side}_{key}_median"] = statistics.median(r[side][key] for r in reps)
        for piece in reps[0][side]["pieces_s"]:
            values = [r[side]["pieces_s"][piece] for r in reps]
            summary[f"{side}_{piece}_s_median"] = statistics.median(values)
    for key in [k for k in reps[0] if k.startswith("ratio")]:
        summary[f"{key}_median"] = statistics.median(r[key] for r in reps)
    if "pyg" in sides:
        summary["edge_cut_ratio"] = quality["gnnpar"]["edge_cut"] / quality["pyg"]["edge_cut"]
    loads = [r[s]["load_1min"] for r in reps for s in sides]
    summary["load_1min"] = {
        "min": min(loads),
        "median": statistics.median(loads),
        "max": max(loads),
    }
    return {"graph": info, "summary": summary, "reps": reps}


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=5, out=True)
    p.add_argument("--graphs", default="reddit01,powerlaw")
    p.add_argument("--parts", type=int, default=40)
    p.add_argument("--seed", type=int, default=0, help="gnnpar's METIS seed (PyG: METIS' own)")
    p.add_argument("--peer-python", default=DEFAULT_PEER)
    p.add_argument("--workdir", default="/tmp/gnnpar_partition_peers", help="graph files")
    smoke = {"graphs": "powerlaw-tiny", "parts": 4, "reps": 1}
    args = harness.start(p, argv, smoke, rank_threads=1)
    if args.smoke:
        args.workdir = str(harness.smoke_root() / "partition_peers")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sides = ["gnnpar", "pyg"]
    missing = peer_missing(args.peer_python)
    if missing:
        print(f"skipping PyG ClusterData: {missing}")
        sides = ["gnnpar"]
    import scipy
    import torch_geometric

    report: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": harness.machine(1),
        "versions": {
            "torch": torch.__version__,
            "torch_geometric": torch_geometric.__version__,
            "scipy": scipy.__version__,
            "numpy": np.__version__,
        },
        "parts": args.parts,
        "reps": args.reps,
        "seed": args.seed,
        "threads": 1,
        "peer": None if missing else args.peer_python,
        "graphs": {},
    }
    for name in args.graphs.split(","):
        report["graphs"][name] = result = bench_graph(name, args, sides, workdir)
        print(name, json.dumps(result["summary"], indent=1))
    if args.out:
        harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
