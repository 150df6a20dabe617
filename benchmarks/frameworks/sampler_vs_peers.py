"""gnnpar's neighbour sampler against the samplers a user would pick instead, on the same graph.

Sides (each skipped, with a message, when its library is not installed):

* ``gnnpar``: :class:`gnnpar.data.sampling.sampler.NeighborSampler`, the compiled hop kernel;
* ``gnnpar-torch``: the same class on its vectorised-torch fallback (the code before the kernel);
* ``pyg-loader``: PyG ``NeighborLoader`` (pyg-lib, its default), per batch as iterating it runs;
* ``pyg-lib``: pyg-lib's kernel ``torch.ops.pyg.neighbor_sample`` alone;
* ``pyg-torch-sparse``: PyG ``NeighborLoader`` on torch-sparse's kernel;
* ``dgl-frontier``: ``dgl.sampling.sample_neighbors`` hop by hop on gnnpar's frontier (the nodes
  first reached at the previous hop) + node-mark relabelling: **the same work as gnnpar**, the
  like-for-like reference of the ratios;
* ``dgl-blocks``: DGL's training sampler, ``dataloading.NeighborSampler`` + ``to_block``;
* ``graphbolt``: GraphBolt's ``ItemSampler`` + ``sample_neighbor`` + blocks.

DGL's training samplers (``dgl-blocks``, ``graphbolt``) sample at each hop every node reached so
far, not only the new ones, so they sample 1.4-1.7x more edges: their figures are given for
reference, and the equal-work check (sampled edges per batch within 2% of gnnpar's) applies to
the others.

How: the graphs are built once and saved as ``rowptr.npy``/``col.npy`` (incoming CSR = CSC,
int64) with the seed batches (``seeds.npy``) under ``--workdir``. One long-lived process per
interpreter (gnnpar's venv, ``/work/peers/pyg``, ``/work/peers/dgl``: the peers are never
imported by gnnpar) runs ``benchmarks/frameworks/_sampler_sides.py`` on that folder; per repetition the driver
asks every side in turn, rotating the order each repetition, to sample all seed batches (after
one untimed warm-up batch). Figures: seeds per second from wall time and from the process's CPU
time (on a shared machine CPU time is the steadier one), medians over repetitions, and the median
of per-repetition ratios against ``dgl-frontier``. ``--threads N`` gives each side N intra-op
threads (gnnpar's kernel is one thread per batch by design; its parallelism is loader workers),
``--workers W`` runs every per-batch side inside a ``torch.utils.data.DataLoader`` with W forked
worker processes of one thread each (the setting of a training rank with W loader workers).

    python -m benchmarks.frameworks.sampler_vs_peers                                  # 1 thread, 5 repetitions
    python -m benchmarks.frameworks.sampler_vs_peers --workers 2 --out benchmarks/results/peers_workers2.json
    python -m benchmarks.frameworks.sampler_vs_peers --graphs power-law --reps 7

The power-law graph: 23,296 nodes (synthetic-reddit's at scale 0.1, i.e. Reddit's / 10) and
11,000,000 distinct directed edges (Reddit's 114.6 M / 10, so Reddit's mean degree ~470):
Chung-Lu style, source and target of each edge drawn independently with probability
proportional to ``(rank + 1) ** -0.5`` (a power-law degree tail, exponent 3), self-loops and
repeats dropped and drawn again, node ids then shuffled (so degree is not ordered by id).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness

HERE = Path(__file__).resolve().parent
INTERPRETERS = {  # which interpreter runs which sides
    "gnnpar": (sys.executable, ["gnnpar", "gnnpar-torch"]),
    "pyg": (harness.PEERS["pyg"], ["pyg-loader", "pyg-lib", "pyg-torch-sparse"]),
    "dgl": (harness.PEERS["dgl"], ["dgl-frontier", "dgl-blocks", "graphbolt"]),
}
REFERENCE = "dgl-frontier"
EQUAL_WORK = {"gnnpar", "gnnpar-torch", "pyg-loader", "pyg-lib", "pyg-torch-sparse", REFERENCE}
CONFIGS = {  # graph -> fan-out lists benchmarked on it
    "synthetic-reddit": [[25, 10, 10], [15, 10, 5]],
    "power-law": [[25, 10, 10]],
}


def power_law_graph(nodes: int, edges: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rowptr, col) of the incoming CSR of the power-law graph described in the docstring."""
    g = torch.Generator().manual_seed(seed)
    weight = (torch.arange(nodes, dtype=torch.float64) + 1) ** -0.5
    keys = torch.empty(0, dtype=torch.long)
    while keys.numel() < edges:  # top up what dropping repeats and self-loops removed
        want = int((edges - keys.numel()) * 1.1) + 1000
        src = torch.multinomial(weight, want, replacement=True, generator=g)
        dst = torch.multinomial(weight, want, replacement=True, generator=g)
        fresh = (dst * nodes + src)[src != dst]
        keys = torch.unique(torch.cat([keys, fresh]))
    keys = keys[torch.randperm(keys.numel(), generator=g)[:edges]]
    perm = torch.randperm(nodes, generator=g)  # shuffle ids
    src, dst = perm[keys % nodes], perm[keys // nodes]
    order = torch.sort(dst * nodes + src).indices
    rowptr = torch.zeros(nodes + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=nodes), 0)
    return rowptr, src[order].contiguous()


def build_graph(name: str, folder: Path, batches: int, batch_size: int, scale: float = 0.1) -> dict:
    """Save the graph and the seed batches under ``folder`` (once); return its description."""
    meta_path = folder / "meta.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    if name == "synthetic-reddit":
        from gnnpar.config.parse import default_data_root
        from gnnpar.data.datasets import load_dataset
        from gnnpar.data.sampling.sampler import CSRGraph

        ds = load_dataset("synthetic-reddit", default_data_root(), scale, 0)
        csr = CSRGraph.from_edge_index(ds.data.edge_index, ds.num_nodes)
        rowptr, col = csr.rowptr, csr.col
        pool = ds.data.train_mask.nonzero().view(-1)  # seeds: training nodes
    elif name == "power-law":
        rowptr, col = power_law_graph(23_296, 11_000_000, seed=0)
        pool = torch.arange(rowptr.numel() - 1)
    else:
        raise SystemExit(f"unknown graph {name!r}: synthetic-reddit or power-law")
    seeds = torch.stack(
        [pool[torch.randperm(pool.numel(), generator=gen)[:batch_size]] for _ in range(batches)]
    )
    np.save(folder / "rowptr.npy", rowptr.numpy())
    np.save(folder / "col.npy", col.numpy())
    np.save(folder / "seeds.npy", seeds.numpy())
    deg = (rowptr[1:] - rowptr[:-1]).double()
    meta = {
        "graph": name,
        "nodes": rowptr.numel() - 1,
        "edges": col.numel(),
        "in_degree_mean": float(deg.mean()),
        "in_degree_median": float(deg.median()),
        "in_degree_max": int(deg.max()),
        "batches": batches,
        "batch_size": batch_size,
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


class SideProcess:
    """A ``_sampler_sides.py`` process in one interpreter, driven over stdin/stdout."""

    def __init__(self, python: str, folder: Path, threads: int, workers: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        env["PYTHONPATH"] = harness.module_env()["PYTHONPATH"]
        env["PYTHONWARNINGS"] = "ignore"
        self.proc = subprocess.Popen(
            [python, str(HERE / "_sampler_sides.py"), str(folder), str(workers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._read()  # {"ready": true}

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"benchmark process {self.proc.args} ended (exit {self.proc.poll()})"
            )
        return json.loads(line)

    def ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=5, out=True)
    p.add_argument("--graphs", default="synthetic-reddit,power-law")
    p.add_argument("--batches", type=int, default=10, help="seed batches per repetition")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per side")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per side")
    p.add_argument("--sides", default=None, help="comma-separated subset of the sides")
    p.add_argument("--workdir", default=None, help="saved graphs (default: $GNNPAR_DATA/peers)")
    p.add_argument("--scale", type=float, default=0.1, help="synthetic-reddit's scale")
    smoke = {"graphs": "synthetic-reddit", "scale": 0.005, "reps": 1, "batches": 1}
    args = harness.start(p, argv, {**smoke, "batch_size": 64, "sides": "gnnpar"})
    if args.smoke:
        args.workdir = str(harness.smoke_root() / "peers")
    from gnnpar.config.parse import default_data_root

    workdir = Path(args.workdir) if args.workdir else default_data_root() / "peers"
    wanted = set(args.sides.split(",")) if args.sides else None
    results: dict = {"machine": harness.machine(args.threads), "args": vars(args)}
    results |= {"graphs": {}, "runs": []}
    for graph in args.graphs.split(","):
        scaled = f"-s{args.scale:g}" if graph == "synthetic-reddit" and args.scale != 0.1 else ""
        folder = workdir / f"{graph}{scaled}-b{args.batches}x{args.batch_size}"
        meta = build_graph(graph, folder, args.batches, args.batch_size, args.scale)
        results["graphs"][graph] = meta
        print(f"{graph}: {meta['nodes']:,} nodes, {meta['edges']:,} edges", flush=True)
        procs, sides = {}, []
        for env, (python, env_sides) in INTERPRETERS.items():
            env_sides = [s for s in env_sides if wanted is None or s in wanted]
            if not env_sides:
                continue
            if not Path(python).exists():
                print(f"  skipped {', '.join(env_sides)}: no interpreter {python}", flush=True)
                continue
            procs[env] = SideProcess(python, folder, args.threads, args.workers)
            sides += [(s, procs[env]) for s in env_sides]
        skipped: set[str] = set()
        try:
            for rep in range(args.reps):
                for fanouts in CONFIGS[graph]:
                    for replace in (False, True):
                        for side, proc in harness.rotation(sides, rep):  # each first in turn
                            if side in skipped:
                                continue
                            load = harness.load_average()[0]
                            out = proc.ask(
                                {
                                    "side": side,
                                    "fanouts": fanouts,
                                    "replace": replace,
                                    "threads": args.threads,
                                }
                            )
                            if "skip" in out:
                                print(f"  skipped {out['skip']}", flush=True)
                                skipped.add(side)
                                continue
                            run = {"graph": graph, "fanouts": fanouts, "replace": replace}
                            run |= {"side": side, "rep": rep, "load1": load, **out}
                            results["runs"].append(run)
                print(f"  repetition {rep + 1}/{args.reps} (load {harness.load_average()[0]:.1f})")
        finally:
            for proc in procs.values():
                proc.close()
    if args.out:  # the raw runs first: a summary that fails must not lose them
        harness.write_json(args.out, results)
    results["summary"] = summarise(results["runs"])
    print_table(results["summary"])
    if args.out:
        harness.write_json(args.out, results)


def summarise(runs: list[dict]) -> list[dict]:
    """Per (graph, fan-outs, replace, side): median rates, median per-repetition ratio vs the
    reference, edges per batch and the equal-work check."""
    rows = []
    keys = sorted({(r["graph"], tuple(r["fanouts"]), r["replace"]) for r in runs})
    for graph, fanouts, replace in keys:
        mine = [
            r
            for r in runs
            if (r["graph"], tuple(r["fanouts"]), r["replace"]) == (graph, fanouts, replace)
        ]
        by_side: dict[str, list[dict]] = {}
        for r in mine:
            by_side.setdefault(r["side"], []).append(r)
        ref = {r["rep"]: r for r in by_side.get(REFERENCE, [])}
        base_edges = statistics.median(r["edges_per_batch"] for r in by_side.get("gnnpar", mine))
        for side, rs in by_side.items():
            wall = [r["seeds"] / r["wall_s"] for r in rs]
            cpu = [r["seeds"] / r["cpu_s"] for r in rs if r["cpu_s"]]
            ratio_wall = [ref[r["rep"]]["wall_s"] / r["wall_s"] for r in rs if r["rep"] in ref]
            ratio_cpu = [
                ref[r["rep"]]["cpu_s"] / r["cpu_s"]
                for r in rs
                if r["rep"] in ref and r["cpu_s"] and ref[r["rep"]]["cpu_s"]  # None: loader workers
            ]
            edges = statistics.median(r["edges_per_batch"] for r in rs)
            rows.append(
                {
                    "graph": graph,
                    "fanouts": list(fanouts),
                    "replace": replace,
                    "side": side,
                    "reps": len(rs),
                    "seeds_per_s_wall": statistics.median(wall),
                    "seeds_per_s_cpu": statistics.median(cpu) if cpu else None,
                    "ratio_vs_ref_wall": statistics.median(ratio_wall) if ratio_wall else None,
                    "ratio_vs_ref_cpu": statistics.median(ratio_cpu) if ratio_cpu else None,
                    "edges_per_batch": edges,
                    "edges_vs_gnnpar": edges / base_edges,
                    "equal_work": side in EQUAL_WORK,
                    "equal_work_ok": abs(edges / base_edges - 1) <= 0.02
                    if side in EQUAL_WORK
                    else None,
                    "load1_median": statistics.median(r["load1"] for r in rs),
                }
            )
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "\n| graph | fan-outs | replace | side | seeds/s (wall) | seeds/s (CPU) | "
        "x dgl-frontier (wall) | x dgl-frontier (CPU) | edges/batch | vs gnnpar |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
        check = (
            "" if r["equal_work_ok"] is None else (" ok" if r["equal_work_ok"] else " NOT EQUAL")
        )
        print(
            f"| {r['graph']} | {'-'.join(map(str, r['fanouts']))} | {r['replace']} | {r['side']} "
            f"| {fmt(r['seeds_per_s_wall'], '{:,.0f}')} | {fmt(r['seeds_per_s_cpu'], '{:,.0f}')} "
            f"| {fmt(r['ratio_vs_ref_wall'], '{:.2f}')} | {fmt(r['ratio_vs_ref_cpu'], '{:.2f}')} "
            f"| {r['edges_per_batch']:,.0f} | {r['edges_vs_gnnpar']:.3f}{check} |"
        )


if __name__ == "__main__":
    main()
