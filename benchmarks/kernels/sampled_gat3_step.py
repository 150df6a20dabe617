"""Study 002's sampled GAT (gat3) step, timed and profiled per op and per layer (issue 21).

gat3: 3 GATConv layers x 16 hidden, 1 head, dropout 0.6 (input and attention), Adam 5e-3;
fan-outs 25-10-10, 1024 seeds per batch, synthetic-reddit at ``--scale``, one thread. It samples
real batches with gnnpar's sampler and runs what the sampled strategy runs per step (gather the
batch's features, the trimmed forward, NLL on the seeds, backward, Adam): the median step over
``--reps`` steps after 2 warm-ups; with ``--layers`` the forward of each block alone and the
backward, per batch; with ``--profile`` torch.profiler's table of 3 steps.

    python -m benchmarks.kernels.sampled_gat3_step --scale 0.1 [--layers] [--profile]

Run it alone on the machine (``flock`` the benchmark lock).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.nn import functional as F

from benchmarks import harness
from gnnpar.config.schema import ModelConfig
from gnnpar.data.datasets import load_dataset
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
from gnnpar.models import build_model
from gnnpar.models.hops import HopGraph
from gnnpar.runtime.allocator import reuse_large_blocks

FANOUTS = [25, 10, 10]
SEEDS = 1024


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=10, threads=1, data_root=True)
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--layers", action="store_true", help="time each block's forward")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--pyg", action="store_true", help="sampled layers through PyG's GATConv")
    args = harness.start(
        p, argv, {"scale": 0.01, "reps": 2, "layers": True}, header=False
    )  # printed with the figures
    reuse_large_blocks()  # as the sampled strategy does
    root = args.data_root or str(harness.smoke_root())
    ds = load_dataset("synthetic-reddit", root, args.scale, 0)
    d = ds.data
    sampler = NeighborSampler(CSRGraph.from_edge_index(d.edge_index, d.num_nodes), FANOUTS)
    train = d.train_mask.nonzero().view(-1)
    batches = -(-train.numel() // SEEDS)
    gen = torch.Generator().manual_seed(1)
    perm = train[torch.randperm(train.numel(), generator=gen)]

    torch.manual_seed(0)
    mcfg = ModelConfig(name="gat3", hidden=16, layers=3, heads=1, dropout=0.6)
    model = build_model(mcfg, d.num_features, ds.num_classes, False).train()
    for block in model.blocks:
        block.csr = not args.pyg
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    cursor = [0]

    def batch():
        i = cursor[0] % (batches - 1)
        cursor[0] += 1
        b = sampler.sample(perm[i * SEEDS : (i + 1) * SEEDS], gen)
        graph = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
        return torch.index_select(d.x, 0, b.n_id), graph, d.y[b.n_id[:SEEDS]]  # as the loader

    def step() -> None:
        x, graph, y = batch()
        loss = F.nll_loss(model(x, graph)[:SEEDS], y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    times = []
    for _ in range(args.reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    harness.print_header(args.threads)
    print(
        f"gat3 step: median {step_s * 1e3:.1f} ms (min {min(times) * 1e3:.1f}, "
        f"max {max(times) * 1e3:.1f}) over {args.reps}; {step_s * batches:.2f} s per "
        f"{batches}-batch epoch"
    )
    if args.layers:
        rows = []
        for _ in range(args.reps):
            x, graph, y = batch()
            n = len(model.blocks)
            t = [time.perf_counter()]
            h = x
            for i, block in enumerate(model.blocks):
                layer = graph.layer(i, n)
                h = block(h if h.size(0) == layer.n_src else h[: layer.n_src], layer)
                t.append(time.perf_counter())
            loss = F.nll_loss(model.head(h)[:SEEDS], y)
            opt.zero_grad()
            loss.backward()
            t.append(time.perf_counter())
            rows.append([b - a for a, b in zip(t, t[1:])])
        med = [statistics.median(c) * 1e3 for c in zip(*rows)]
        names = [f"layer {i + 1}" for i in range(len(model.blocks))] + ["backward"]
        print("  ".join(f"{k}: {v:.1f} ms" for k, v in zip(names, med)))
    if args.profile:
        from torch.profiler import profile

        with profile() as prof:
            for _ in range(3):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
