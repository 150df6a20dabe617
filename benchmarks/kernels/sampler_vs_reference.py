"""Neighbour-sampler throughput: sampled edges per second on one core, vectorised vs reference.

The vectorised :class:`gnnpar.data.sampling.sampler.NeighborSampler` against
:func:`gnnpar.data.sampling.reference.reference_sample` (a straightforward per-node sampler: a Python loop,
one ``randperm`` per node, a dict for relabelling), both without replacement, on the same seed
batches of synthetic-reddit, in the same process, one thread (so the figure is per core). Each
repetition samples the same batches; the median over repetitions is reported, and the ratio.

    python -m benchmarks.kernels.sampler_vs_reference               # scale 0.05, batch 1024
    python -m benchmarks.kernels.sampler_vs_reference --scale 0.1 --batch-size 512 --reps 5
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks import harness
from gnnpar.config.parse import default_data_root
from gnnpar.data.datasets import load_dataset
from gnnpar.data.sampling.reference import reference_sample
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler


def throughput(sample, batches: list[torch.Tensor], reps: int) -> tuple[float, list[float]]:
    """(median sampled edges per second, per-repetition figures) of ``sample(seeds, gen)``."""
    rates = []
    for rep in range(reps):
        gen = torch.Generator().manual_seed(rep)
        edges = 0
        t0 = time.perf_counter()
        for seeds in batches:
            edges += sample(seeds, gen).edge_index.size(1)
        rates.append(edges / (time.perf_counter() - t0))
    return statistics.median(rates), rates


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=5, threads=1, out=True)  # one thread: per core
    p.add_argument("--dataset", default="synthetic-reddit")
    p.add_argument("--scale", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="25,10,10")
    p.add_argument("--batches", type=int, default=4, help="batches per repetition (vectorised)")
    smoke = {"scale": 0.002, "batch_size": 64, "batches": 1, "reps": 1}
    args = harness.start(p, argv, smoke)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    ds = load_dataset(args.dataset, default_data_root(), args.scale, 0)
    d = ds.data
    csr = CSRGraph.from_edge_index(d.edge_index, ds.num_nodes)
    train = d.train_mask.nonzero().view(-1)
    gen = torch.Generator().manual_seed(0)
    batches = [
        train[torch.randperm(train.numel(), generator=gen)[: args.batch_size]]
        for _ in range(args.batches)
    ]
    fast = NeighborSampler(csr, fanouts)
    fast_replace = NeighborSampler(csr, fanouts, replace=True)
    fast.sample(batches[0], gen)  # warm-up: first-call allocations
    results = {}
    results["vectorised"] = throughput(fast.sample, batches, args.reps)
    results["vectorised, replace"] = throughput(fast_replace.sample, batches, args.reps)
    # the reference is ~100x slower: one batch per repetition is plenty
    results["reference"] = throughput(
        lambda s, g: reference_sample(csr, s, fanouts, g), batches[:1], max(3, args.reps // 2)
    )
    ref = results["reference"][0]
    print(
        f"{args.dataset} scale {args.scale}: {ds.num_nodes:,} nodes, {csr.num_edges:,} edges; "
        f"batch {args.batch_size}, fan-outs {fanouts}, 1 thread"
    )
    for name, (median, _) in results.items():
        print(f"  {name:22s} {median:14,.0f} sampled edges/s/core   x{median / ref:.1f} reference")
    if args.out:
        harness.write_json(
            args.out,
            {
                "machine": harness.machine(1),
                "args": vars(args),
                "nodes": ds.num_nodes,
                "edges": csr.num_edges,
                "edges_per_s": {k: {"median": m, "reps": r} for k, (m, r) in results.items()},
                "ratio_vs_reference": results["vectorised"][0] / ref,
            },
        )


if __name__ == "__main__":
    main()
