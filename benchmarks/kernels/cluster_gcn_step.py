"""One rank's study-003 Cluster-GCN step in process: wall time per step, and a torch.profiler table.

synthetic-reddit at 0.1, METIS into 40 parts (seed 0), the study's GCN (3 convolutions, 128
hidden, dropout 0.2, Adam 1e-2), one thread; the first 20 parts (one rank's share) after 3 warm
steps. ``--profile`` adds the per-op table of 10 steps (self CPU time).

    python -m benchmarks.kernels.cluster_gcn_step [--profile]
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import harness
from gnnpar.config.parse import default_data_root
from gnnpar.data.datasets import load_dataset
from gnnpar.data.partition import build_partitioned, metis_partition
from gnnpar.models.gcn import build_gcn
from gnnpar.training.losses import graph_loss


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, threads=1)
    p.add_argument("--scale", type=float, default=0.1, help="synthetic-reddit's scale")
    p.add_argument("--profile", action="store_true", help="the per-op table of 10 steps")
    args = harness.start(p, argv, {"scale": 0.01})
    ds = load_dataset("synthetic-reddit", default_data_root(), args.scale, 0)
    pg = build_partitioned(ds.data, metis_partition(ds.data.edge_index, ds.num_nodes, 40, 0), 40)
    torch.manual_seed(0)
    mcfg = SimpleNamespace(hidden=128, layers=3, dropout=0.2)
    model = build_gcn(mcfg, ds.num_features, ds.num_classes, False)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    batches = [pg.batch(p) for p in range(20)]

    def step(b) -> None:
        opt.zero_grad()
        graph_loss(model, b, False).backward()
        opt.step()

    for b in batches[:3]:
        step(b)
    t0 = time.perf_counter()
    for b in batches:
        step(b)
    print(f"per step ms {(time.perf_counter() - t0) / len(batches) * 1e3:.1f}")
    if args.profile:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in batches[:10]:
                step(b)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
