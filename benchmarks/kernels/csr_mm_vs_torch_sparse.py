"""CSR x dense products on the CPU: ``torch.sparse.mm`` (MKL) against gnnpar's kernel
(``gat_kernel.csr_mm``), on the matrices gnnpar's models multiply by (issue 21).

The matrices are real: study 003's Cluster-GCN (synthetic-reddit at ``--scale``, METIS into 40
parts, the median part's ``D^-1/2 (A + I) D^-1/2`` and its transpose, at the GCN's widths 128
and 41) and study 002's sampled GraphSAGE (25-10-10 from 1024 seeds: each layer's mean adjacency
and its transpose, at the widths the trimmed layers multiply: 602 input features, then 256).
Per product: the median over ``--reps`` timings, sides alternating within each repetition,
after a warm-up; the ratio is the median of per-repetition ratios (torch / gnnpar). Every
build of the kernel this CPU runs is timed (``level``: 0 SSE2, 1 AVX2, 2 AVX-512; the same
floats at every level), one thread unless ``--threads``. Each gnnpar result is checked against
torch's before timing (within float32 rounding: torch's MKL adds in another order).

    python -m benchmarks.kernels.csr_mm_vs_torch_sparse [--scale 0.1] [--reps 15] [--threads 1]

Run it alone on the machine (``flock`` the benchmark lock).
"""

from __future__ import annotations

import warnings

import torch

from benchmarks import harness
from gnnpar.data.datasets import load_dataset
from gnnpar.data.partition import build_partitioned, metis_partition
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
from gnnpar.models import gat_kernel
from gnnpar.models.gcn import normalised_adjacency
from gnnpar.models.hops import HopGraph
from gnnpar.runtime.allocator import reuse_large_blocks


def matrices(scale: float, root: str) -> list[tuple[str, torch.Tensor, int]]:
    """(what, CSR matrix, width of the dense operand) for each product the models take."""
    ds = load_dataset("synthetic-reddit", root, scale, 0)
    d = ds.data
    out = []
    pg = build_partitioned(d, metis_partition(d.edge_index, d.num_nodes, 40, 0), 40)
    parts = sorted(range(40), key=lambda p: pg.batch(p).edge_index.size(1))
    part = pg.batch(parts[20])  # the median part
    a, at = normalised_adjacency(part.edge_index, part.num_nodes, torch.float32)
    for m in (128, 41):
        out.append((f"Cluster-GCN part, A, width {m}", a, m))
        out.append((f"Cluster-GCN part, A^T, width {m}", at, m))
    sampler = NeighborSampler(CSRGraph.from_edge_index(d.edge_index, d.num_nodes), [25, 10, 10])
    train = d.train_mask.nonzero().view(-1)
    gen = torch.Generator().manual_seed(1)
    b = sampler.sample(train[torch.randperm(train.numel(), generator=gen)[:1024]], gen)
    graph = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
    for index, width in ((0, d.num_features), (1, 256), (2, 256)):
        adj = graph.layer(index, 3).mean_adjacency()
        out.append((f"sampled sage layer {index + 1}, A, width {width}", adj.matrix(), width))
        out.append((f"sampled sage layer {index + 1}, A^T, width {width}", adj.transposed(), width))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__, reps=15, threads=1, data_root=True)
    ap.add_argument("--scale", type=float, default=0.1)
    args = harness.start(ap, argv, {"scale": 0.01, "reps": 2}, header=False)
    if not gat_kernel.available():
        raise SystemExit(
            "csr_mm_vs_torch_sparse: gnnpar's kernel is not built (bash scripts/setup.sh)"
        )
    reuse_large_blocks()  # as the strategies train: large blocks reused, no fresh page faults
    warnings.filterwarnings("ignore", category=UserWarning)  # "sparse CSR support is in beta"
    root = args.data_root or str(harness.smoke_root())
    levels = list(range(gat_kernel.csr_mm_level() + 1))
    harness.print_header(args.threads)
    print(f"kernel levels run here: {levels}")
    head = " | ".join(f"gnnpar L{lv} ms | torch / L{lv}" for lv in levels)
    print(f"| product | rows x cols, entries | torch.sparse.mm ms | {head} |")
    print("|---|---|---|" + "---|---|" * len(levels))
    for what, a, m in matrices(args.scale, root):
        h = torch.randn(a.size(1), m)
        sides = {"torch": lambda a=a, h=h: torch.sparse.mm(a, h)}
        for lv in levels:
            sides[f"L{lv}"] = lambda a=a, h=h, lv=lv: gat_kernel.csr_mm(a, h, lv)
        want = sides["torch"]()
        for fn in sides.values():
            torch.testing.assert_close(fn(), want, rtol=1e-4, atol=1e-5)  # and warm-up
        times = harness.alternate(sides, args.reps, warmup=0)
        med = {k: harness.median_ms(v) for k, v in times.items()}
        cells = " | ".join(
            f"{med[f'L{lv}']:.2f} | {harness.median_ratio(times['torch'], times[f'L{lv}']):.2f}"
            for lv in levels
        )
        nnz = a.values().numel()
        print(f"| {what} | {a.size(0)} x {a.size(1)}, {nnz} | {med['torch']:.2f} | {cells} |")
    print(f"load after {harness.load_average()}")


if __name__ == "__main__":
    main()
